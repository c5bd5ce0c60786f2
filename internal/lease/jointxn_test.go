package lease

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/coordinatord/coordinatord/internal/etcdx"
	"github.com/coordinatord/coordinatord/internal/etcdx/etcdxtest"
)

// The transactions the batcher sends, built as protobuf, are the ones
// clientv3 builds from the same Cmp and Op values: a flat one and the
// nested join (nestedJoin), with the kinds of operations the lock path
// uses (reads with options, puts with leases, deletes).
func TestBuiltTxnsMatchClientv3(t *testing.T) {
	cmps := func() []clientv3.Cmp {
		return []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision("/req/1"), "=", 0),
			clientv3.Compare(clientv3.CreateRevision("/slot/a"), "=", 0)}
	}
	free := func() []clientv3.Cmp {
		return []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision("/q/lock/").WithPrefix(), "=", 0),
			clientv3.Compare(clientv3.ModRevision("/q/lock/x"), "<", 9),
			clientv3.Compare(clientv3.Value("/v"), "!=", "x"),
			clientv3.Compare(clientv3.LeaseValue("/l"), "=", clientv3.LeaseID(3))}
	}
	hold := func() []clientv3.Op {
		return []clientv3.Op{clientv3.OpPut("/q/lock/k", "held", clientv3.WithLease(7)), clientv3.OpPut("/delay", "", clientv3.WithLease(8))}
	}
	queue := func() []clientv3.Op {
		return []clientv3.Op{clientv3.OpPut("/q/lock/k", "queued", clientv3.WithLease(7)),
			clientv3.OpGet("/q/lock/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(2)),
			clientv3.OpDelete("/old", clientv3.WithPrevKV())}
	}
	extra := func() []clientv3.Op {
		return []clientv3.Op{clientv3.OpPut("/req/1", "record", clientv3.WithLease(7))}
	}
	els := func() []clientv3.Op {
		return []clientv3.Op{clientv3.OpGet("/req/1", clientv3.WithCountOnly()), clientv3.OpGet("/slot/", clientv3.WithPrefix(), clientv3.WithKeysOnly())}
	}
	for _, tc := range []struct {
		name   string
		ours   *pb.TxnRequest
		theirs func(clientv3.Txn) clientv3.Txn
	}{
		{"flat", etcdx.Request(free(), hold(), queue()), func(tx clientv3.Txn) clientv3.Txn {
			return tx.If(free()...).Then(hold()...).Else(queue()...)
		}},
		{"nested join", nestedJoin(cmps(), free(), hold(), queue(), extra(), els()), func(tx clientv3.Txn) clientv3.Txn {
			return tx.If(cmps()...).Then(append([]clientv3.Op{clientv3.OpTxn(free(), hold(), queue())}, extra()...)...).Else(els()...)
		}},
		{"nested join, no guard", nestedJoin(nil, free(), hold(), queue(), nil, els()), func(tx clientv3.Txn) clientv3.Txn {
			return tx.If().Then(clientv3.OpTxn(free(), hold(), queue())).Else(els()...)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if want := etcdxtest.Sent(t, tc.theirs); !proto.Equal(tc.ours, want) {
				t.Errorf("built\n%v\nclientv3 builds\n%v", tc.ours, want)
			}
		})
	}
}
