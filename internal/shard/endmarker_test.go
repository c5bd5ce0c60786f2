package shard

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/locktable"
)

// End markers (locktable/ended.go) are ordinary keys to the committer: two
// units of one batch that end grants of one lock each put its marker, and
// so never share a Txn (etcd #22376: two writes of one key in one
// revision); a unit's marker beside its hand-off's grant put (whose
// conflict key is the lock's) is no clash; every marker is put on the
// lease its op names.
func TestCommitEndMarkersSplitTxns(t *testing.T) {
	_, cli := commitEtcd(t)
	commitEachInflight(t, func(t *testing.T, inflight CommitOption) {
		f := newCommitFixture(t, cli, inflight)
		f.own(1)
		f.own(2)
		lr, err := cli.Grant(commitCtx(t), 30)
		if err != nil {
			t.Fatal(err)
		}
		marker := f.key("ended/00001/x")
		grants := []string{f.key("data/00001/x/g1"), f.key("data/00001/x/g2"), f.key("data/00001/x/g3")}
		for _, k := range grants[:2] {
			f.submit(1, Op{Key: k, Value: "grant", Conflict: "grant:x"}).mustCommit()
		}
		release, blocker := f.block()
		first := f.submit(1, // a release that hands off: delete, the next grant, the marker
			Op{Key: grants[0], Delete: true},
			Op{Key: grants[2], Value: "grant", Conflict: "grant:x"},
			Op{Key: marker, Value: "released:1", Lease: lr.ID})
		second := f.submit(1, Op{Key: grants[1], Delete: true}, Op{Key: marker, Value: "forced:2", Lease: lr.ID})
		other := f.submit(2, Op{Key: f.key("data/00002/y/g1"), Delete: true},
			Op{Key: f.key("ended/00002/y"), Value: "released:3", Lease: lr.ID})
		release()
		blocker.mustCommit()
		r1, r2, r3 := first.mustCommit(), second.mustCommit(), other.mustCommit()
		if r2 <= r1 {
			t.Fatalf("the second unit with the marker at %d, the first at %d: want a later Txn", r2, r1)
		}
		if r3 != r1 {
			t.Errorf("another lock's marker at %d, want the first unit's Txn (%d)", r3, r1)
		}
		if n := f.kv.txnsWith(marker); n != 2 {
			t.Errorf("the marker in %d Txns, want 2", n)
		}
		f.checkTxns()
		for rev, want := range map[int64]string{r1: "released:1", r2: "forced:2"} {
			r, err := cli.Get(commitCtx(t), marker, clientv3.WithRev(rev))
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != want || r.Kvs[0].ModRevision != rev || clientv3.LeaseID(r.Kvs[0].Lease) != lr.ID {
				t.Fatalf("the marker at %d: %v; want %q written then, on lease %x", rev, r.Kvs, want, lr.ID)
			}
		}
	})
}

// On the owner, a release and a force release each put their lock's end
// marker in the revision of the grant's delete, on the member's lease (so
// it goes with the member); an expiry puts none.
func TestOwnerEndMarkersOnTheMemberLease(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	name := "jobs/1"
	marker := o.endedPrefix(o.ShardOf(name)) + keyspace.Escape(name)
	// deletedAt is the revision that deleted g's key (waiting for it).
	deletedAt := func(g *locktable.Grant) int64 {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		for wr := range cli.Watch(wctx, o.dataPrefix(o.ShardOf(name)), clientv3.WithPrefix(), clientv3.WithRev(g.Token), clientv3.WithPrevKV()) {
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete && ev.PrevKv != nil && ev.PrevKv.CreateRevision == g.Token {
					return ev.Kv.ModRevision
				}
			}
		}
		t.Fatalf("grant %d: no delete within 10s", g.Token)
		return 0
	}
	markerAt := func(rev int64) (string, clientv3.LeaseID) {
		t.Helper()
		r, err := cli.Get(ctx, marker, clientv3.WithRev(rev))
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Kvs) == 0 || r.Kvs[0].ModRevision != rev {
			return "", 0
		}
		return string(r.Kvs[0].Value), clientv3.LeaseID(r.Kvs[0].Lease)
	}
	member := o.Lease().ID()

	a, err := o.Acquire(ctx, acq(name, 5*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := o.Release(ctx, name, a.Token, a.Handle, "alice"); err != nil || !ok {
		t.Fatalf("release = %v, %v", ok, err)
	}
	if v, l := markerAt(deletedAt(a)); v != fmt.Sprint("released:", a.Token) || l != member {
		t.Fatalf("after a release: marker %q on lease %x; want released:%d on the member's %x", v, l, a.Token, member)
	}

	b, err := o.Acquire(ctx, acq(name, 5*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := o.ForceRelease(ctx, name, b.Token); err != nil || !ok {
		t.Fatalf("force release = %v, %v", ok, err)
	}
	if v, l := markerAt(deletedAt(b)); v != fmt.Sprint("forced:", b.Token) || l != member {
		t.Fatalf("after a force release: marker %q on lease %x; want forced:%d on the member's %x", v, l, b.Token, member)
	}

	c, err := o.Acquire(ctx, acq(name, 300*time.Millisecond, 0))
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := markerAt(deletedAt(c)); v != "" {
		t.Fatalf("after an expiry: marker %q written with the delete; want none", v)
	}
	if cause := locktable.MarkedEnd("", c.Token); cause != locktable.EndExpired {
		t.Fatalf("no marker reads as %v", cause)
	}

	// The member goes, its markers with it.
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	o.Close(cctx)
	cancel()
	if r, err := cli.Get(ctx, marker); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("the marker after the member closed: %v, %v; want none", r.Kvs, err)
	}
}
