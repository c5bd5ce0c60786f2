// Package etcdxtest helps the tests of the transactions internal/etcdx
// builds as protobuf: what clientv3 itself sends for the same transaction.
package etcdxtest

import (
	"context"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// Sent is the TxnRequest clientv3 sends for the transaction build makes
// (nothing reaches etcd: a recording KV client answers).
func Sent(t testing.TB, build func(clientv3.Txn) clientv3.Txn) *pb.TxnRequest {
	t.Helper()
	rec := &recordTxn{}
	if _, err := build(clientv3.NewKVFromKVClient(rec, nil).Txn(context.Background())).Commit(); err != nil {
		t.Fatal(err)
	}
	return rec.req
}

// recordTxn records the TxnRequest it is sent.
type recordTxn struct {
	pb.KVClient
	req *pb.TxnRequest
}

func (r *recordTxn) Txn(_ context.Context, req *pb.TxnRequest, _ ...grpc.CallOption) (*pb.TxnResponse, error) {
	r.req = req
	return &pb.TxnResponse{Header: &pb.ResponseHeader{}}, nil
}
