package etcdx

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// Txns commits transactions built directly as etcd's protobuf, through a
// client's connection with the call options and error conversion of
// clientv3's own Txn. clientv3's builder clones every compare by reflection
// (proto.Clone) when it is made, again in OpTxn and in If, and again when a
// nested Txn is converted: on a batch of nested transactions that was a few
// percent of the coordinator's CPU. The TxnRequest a caller builds with the
// functions below is the one clientv3 would send (their tests compare them).
type Txns struct {
	kc   pb.KVClient
	opts []grpc.CallOption
}

// NewTxns returns the Txns of cli.
func NewTxns(cli *clientv3.Client) *Txns {
	c := &recorder{}
	// clientv3 keeps its call options to itself: a KV over a recording
	// client hands them over on an empty Txn that goes nowhere.
	_, _ = clientv3.NewKVFromKVClient(c, cli).Txn(context.Background()).Commit()
	return &Txns{kc: clientv3.RetryKVClient(cli), opts: c.opts}
}

// Request is the TxnRequest of If(cmps).Then(then).Else(els) for Cmp and
// Op values made with clientv3, which keeps their fields to itself: the
// compares are taken as they are (clientv3 would clone each, by
// reflection, in If, or twice through a nested OpTxn), the operations
// converted by clientv3 itself (a KV whose client records the request
// instead of sending it). The request shares the compares: neither may be
// changed after.
func Request(cmps []clientv3.Cmp, then, els []clientv3.Op) *pb.TxnRequest {
	rec := &recorder{}
	_, _ = clientv3.NewKVFromKVClient(rec, nil).Txn(context.Background()).Then(then...).Else(els...).Commit()
	if len(cmps) > 0 {
		rec.req.Compare = make([]*pb.Compare, len(cmps))
		for i := range cmps {
			rec.req.Compare[i] = cmps[i].GetCompare()
		}
	}
	return rec.req
}

// Commit sends r; its errors are those of clientv3's Txn.Commit.
func (t *Txns) Commit(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	resp, err := t.kc.Txn(ctx, r, t.opts...)
	if err != nil {
		return nil, clientv3.ContextError(ctx, err)
	}
	return resp, nil
}

// recorder records a Txn and its call options, and answers it empty.
type recorder struct {
	pb.KVClient
	req  *pb.TxnRequest
	opts []grpc.CallOption
}

func (r *recorder) Txn(_ context.Context, req *pb.TxnRequest, opts ...grpc.CallOption) (*pb.TxnResponse, error) {
	r.req, r.opts = req, opts
	return &pb.TxnResponse{Header: &pb.ResponseHeader{}}, nil
}

// CompareMod is clientv3.Compare(clientv3.ModRevision(key), "=", rev).
func CompareMod(key string, rev int64) *pb.Compare {
	return &pb.Compare{Key: []byte(key), Target: pb.Compare_MOD, Result: pb.Compare_EQUAL,
		TargetUnion: &pb.Compare_ModRevision{ModRevision: rev}}
}

// CompareCreate is clientv3.Compare(clientv3.CreateRevision(key), "=", rev).
func CompareCreate(key string, rev int64) *pb.Compare {
	return &pb.Compare{Key: []byte(key), Target: pb.Compare_CREATE, Result: pb.Compare_EQUAL,
		TargetUnion: &pb.Compare_CreateRevision{CreateRevision: rev}}
}

// OpGet is clientv3.OpGet(key).
func OpGet(key string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte(key)}}}
}

// OpPut is clientv3.OpPut(key, val, clientv3.WithLease(lease)) (no lease:
// 0).
func OpPut(key, val string, lease clientv3.LeaseID) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(key), Value: []byte(val), Lease: int64(lease)}}}
}

// OpPutIgnoreLease is clientv3.OpPut(key, val, clientv3.WithIgnoreLease()):
// the key keeps its lease.
func OpPutIgnoreLease(key, val string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(key), Value: []byte(val), IgnoreLease: true}}}
}

// Txn is the transaction If(cmps).Then(then).Else(els).
func Txn(cmps []*pb.Compare, then, els []*pb.RequestOp) *pb.TxnRequest {
	return &pb.TxnRequest{Compare: cmps, Success: then, Failure: els}
}

// OpTxn is clientv3.OpTxn(cmps, then, els): a nested transaction.
func OpTxn(t *pb.TxnRequest) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: t}}
}
