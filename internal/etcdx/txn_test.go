package etcdx

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/coordinatord/coordinatord/internal/etcdx/etcdxtest"
)

// The TxnRequests built here are the ones clientv3 builds from the
// equivalent Cmp and Op values, flat and nested.
func TestTxnBuildersMatchClientv3(t *testing.T) {
	inner := func(n string) ([]clientv3.Cmp, []clientv3.Op, []clientv3.Op) {
		return []clientv3.Cmp{
				clientv3.Compare(clientv3.ModRevision("/c/"+n), "=", int64(5)),
				clientv3.Compare(clientv3.CreateRevision("/r/"+n), "=", 0)},
			[]clientv3.Op{
				clientv3.OpPut("/r/"+n, "record", clientv3.WithLease(7)),
				clientv3.OpPut("/c/"+n, "state", clientv3.WithIgnoreLease()),
				clientv3.OpPut("/p/"+n, "plain")},
			[]clientv3.Op{clientv3.OpGet("/c/" + n), clientv3.OpGet("/r/" + n)}
	}
	ours := func(n string) *pb.TxnRequest {
		return Txn([]*pb.Compare{CompareMod("/c/"+n, 5), CompareCreate("/r/"+n, 0)},
			[]*pb.RequestOp{OpPut("/r/"+n, "record", 7), OpPutIgnoreLease("/c/"+n, "state"), OpPut("/p/"+n, "plain", 0)},
			[]*pb.RequestOp{OpGet("/c/" + n), OpGet("/r/" + n)})
	}
	for _, tc := range []struct {
		name   string
		theirs func(clientv3.Txn) clientv3.Txn
		ours   *pb.TxnRequest
	}{
		{"flat", func(tx clientv3.Txn) clientv3.Txn {
			c, th, el := inner("a")
			return tx.If(c...).Then(th...).Else(el...)
		}, ours("a")},
		{"nested", func(tx clientv3.Txn) clientv3.Txn {
			c1, t1, e1 := inner("a")
			c2, t2, e2 := inner("b")
			return tx.Then(clientv3.OpTxn(c1, t1, e1), clientv3.OpTxn(c2, t2, e2))
		}, Txn(nil, []*pb.RequestOp{OpTxn(ours("a")), OpTxn(ours("b"))}, nil)},
		{"converted by Request", func(tx clientv3.Txn) clientv3.Txn {
			c, th, el := inner("a")
			return tx.If(c...).Then(th...).Else(el...)
		}, Request(inner("a"))},
		{"nested, converted by Request", func(tx clientv3.Txn) clientv3.Txn {
			c1, t1, e1 := inner("a")
			return tx.Then(clientv3.OpTxn(c1, t1, e1))
		}, Txn(nil, []*pb.RequestOp{OpTxn(Request(inner("a")))}, nil)},
		{"empty branches", func(tx clientv3.Txn) clientv3.Txn {
			return tx.If(clientv3.Compare(clientv3.ModRevision("/k"), "=", 0))
		}, Txn([]*pb.Compare{CompareMod("/k", 0)}, nil, nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := etcdxtest.Sent(t, tc.theirs)
			if !proto.Equal(tc.ours, want) {
				t.Errorf("built\n%v\nclientv3 builds\n%v", tc.ours, want)
			}
		})
	}
}

// NewTxns sends with clientv3's call options for the client's config.
func TestNewTxnsTakesClientv3CallOptions(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, MaxCallSendMsgSize: 1 << 20, DialTimeout: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if n := len(NewTxns(cli).opts); n != 3 {
		t.Fatalf("%d call options, want clientv3's 3 (wait for ready, send and receive sizes)", n)
	}
}
