package counter

import (
	"context"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/coordinatord/coordinatord/internal/etcdx"
	"github.com/coordinatord/coordinatord/internal/etcdx/etcdxtest"
	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// A plan's transaction, built as protobuf, is the one clientv3 builds from
// the Cmp and Op values the plan stands for, alone and nested with
// another: a new counter (lease set) with a request record, and a known
// counter inside its lease's span (lease kept).
func TestPlanTxnMatchesClientv3(t *testing.T) {
	s, _ := setup(t)
	now := time.Now().UnixNano()
	newCall := func(name, reqID string) *call {
		h := Hit{Name: name, Hits: 1, Limit: 10, Window: time.Minute, Algorithm: FixedWindow, RequestID: reqID, Identity: "alice"}
		c := &call{hit: h, key: s.ks.Counter(name), res: make(chan outcome, 1)}
		if reqID != "" {
			c.recKey = s.ks.CounterRequest(keyspace.IdentityHash(h.Identity), requestDigest(h.Name, reqID))
			c.params = paramsDigest(&h)
		}
		return c
	}
	fresh := newCall("fresh", "request-0123456789")
	known := newCall("known", "")
	known2 := newCall("known", "")
	st, _, err := apply(nil, &known.hit, now)
	if err != nil {
		t.Fatal(err)
	}
	st.leaseEnd = st.expiry() + int64(time.Hour)
	s.b.remember(known.key, cached{st: st, rev: 42})

	p1, err := s.b.plan(context.Background(), &group{key: fresh.key, calls: []*call{fresh}}, now)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := s.b.plan(context.Background(), &group{key: known.key, calls: []*call{known, known2}}, now)
	if err != nil {
		t.Fatal(err)
	}
	lease := clientv3.LeaseID(p1.then[0].GetRequestPut().GetLease())
	if lease == 0 || p1.then[1].GetRequestPut().GetLease() == 0 {
		t.Fatalf("a new counter's writes carry no lease: %v", p1.then)
	}
	theirs1 := func() ([]clientv3.Cmp, []clientv3.Op, []clientv3.Op) {
		return []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(fresh.key), "=", 0), clientv3.Compare(clientv3.CreateRevision(fresh.recKey), "=", 0)},
			[]clientv3.Op{clientv3.OpPut(fresh.recKey, encodeRecord(fresh.params, p1.answers[0].o.res), clientv3.WithLease(lease)),
				clientv3.OpPut(fresh.key, p1.next.encode(), clientv3.WithLease(clientv3.LeaseID(p1.then[1].GetRequestPut().GetLease())))},
			[]clientv3.Op{clientv3.OpGet(fresh.key), clientv3.OpGet(fresh.recKey)}
	}
	theirs2 := func() ([]clientv3.Cmp, []clientv3.Op, []clientv3.Op) {
		return []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(known.key), "=", 42)},
			[]clientv3.Op{clientv3.OpPut(known.key, p2.next.encode(), clientv3.WithIgnoreLease())},
			[]clientv3.Op{clientv3.OpGet(known.key)}
	}
	if p2.next.count != 3 {
		t.Fatalf("known counter: count %d after two hits on 1, want 3", p2.next.count)
	}
	for _, tc := range []struct {
		name   string
		ours   *pb.TxnRequest
		theirs func(clientv3.Txn) clientv3.Txn
	}{
		{"new counter with a record, alone", etcdx.Txn(p1.cmps, p1.then, p1.els), func(tx clientv3.Txn) clientv3.Txn {
			c, th, el := theirs1()
			return tx.If(c...).Then(th...).Else(el...)
		}},
		{"known counter, alone", etcdx.Txn(p2.cmps, p2.then, p2.els), func(tx clientv3.Txn) clientv3.Txn {
			c, th, el := theirs2()
			return tx.If(c...).Then(th...).Else(el...)
		}},
		{"both, nested", nestedTxn([]*plan{p1, p2}), func(tx clientv3.Txn) clientv3.Txn {
			c1, t1, e1 := theirs1()
			c2, t2, e2 := theirs2()
			return tx.Then(clientv3.OpTxn(c1, t1, e1), clientv3.OpTxn(c2, t2, e2))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if want := etcdxtest.Sent(t, tc.theirs); !proto.Equal(tc.ours, want) {
				t.Errorf("plan builds\n%v\nclientv3 builds\n%v", tc.ours, want)
			}
		})
	}
}
