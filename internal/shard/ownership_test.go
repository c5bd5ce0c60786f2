package shard

// Tests of shard ownership against a real embedded etcd: one member owns
// everything, members split the shards by rendezvous hashing and move
// them without ever two owners at once, a graceful close hands over at
// once, a crash only after the lease, the count is stored, a relay only
// looks.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

const ownTestPrefix = "/coordinatord/"

// ownRecorder records the callbacks of several members under one mutex.
// Exclusive, it fails the test the moment a shard is acquired while
// another member owns it, or lost by a member that does not own it.
type ownRecorder struct {
	t         *testing.T
	exclusive bool
	mu        sync.Mutex
	owner     map[uint32]string
	acquired  map[string]map[uint32]time.Time // member -> shard -> time of its last Acquired
	revs      map[string]map[uint32]int64
	acqCount  map[string]int
	lostCount map[string]int
}

func newOwnRecorder(t *testing.T, exclusive bool) *ownRecorder {
	return &ownRecorder{t: t, exclusive: exclusive, owner: map[uint32]string{}, acquired: map[string]map[uint32]time.Time{},
		revs: map[string]map[uint32]int64{}, acqCount: map[string]int{}, lostCount: map[string]int{}}
}

func (r *ownRecorder) callbacks(id string) Callbacks {
	return Callbacks{
		Acquired: func(s uint32, rev int64) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if cur, ok := r.owner[s]; ok && r.exclusive {
				r.t.Errorf("shard %d acquired by %s while %s owns it", s, id, cur)
			}
			r.owner[s] = id
			if r.acquired[id] == nil {
				r.acquired[id], r.revs[id] = map[uint32]time.Time{}, map[uint32]int64{}
			}
			r.acquired[id][s], r.revs[id][s] = time.Now(), rev
			r.acqCount[id]++
		},
		Lost: func(s uint32) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if cur := r.owner[s]; cur != id && r.exclusive {
				r.t.Errorf("shard %d lost by %s, owned by %q", s, id, cur)
			}
			if r.owner[s] == id {
				delete(r.owner, s)
			}
			r.lostCount[id]++
		},
	}
}

func (r *ownRecorder) acquiredAt(id string, s uint32) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.acquired[id][s]
	return at, ok
}

// ownMember is a member under test: its lease and ownership, closed at
// the end of the test.
type ownMember struct {
	id    string
	lease *Lease
	own   *Ownership
}

func ownStart(t *testing.T, cli *clientv3.Client, id string, ttl time.Duration, cb Callbacks, opts ...OwnershipOption) *ownMember {
	t.Helper()
	l := leaseNew(t, cli, ttl, nil)
	opts = append([]OwnershipOption{WithShardCount(16), WithMemberID(id), WithAdvertise(id + ":7000")}, opts...)
	o, err := NewOwnership(context.Background(), cli, ownTestPrefix, l, cb, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		o.Close(ctx)
	})
	return &ownMember{id: id, lease: l, own: o}
}

// ownStable tells whether every shard is owned by its rendezvous assignee
// among members, and every view (views: the members' and any relay's)
// names that owner.
func ownStable(members []*ownMember, views ...*Ownership) bool {
	ids := make([]string, len(members))
	for i, m := range members {
		ids[i] = m.id
		views = append(views, m.own)
	}
	for s := uint32(0); s < uint32(members[0].own.ShardCount()); s++ {
		want := ownAssignee(s, ids)
		for _, m := range members {
			if _, ok := m.own.Owned(s); ok != (m.id == want) {
				return false
			}
		}
		for _, v := range views {
			if id, addr, ok := v.Owner(s); !ok || id != want || addr != want+":7000" {
				return false
			}
		}
	}
	return true
}

func ownCount(o *Ownership) int {
	n := 0
	for s := uint32(0); s < uint32(o.ShardCount()); s++ {
		if _, ok := o.Owned(s); ok {
			n++
		}
	}
	return n
}

func TestOwnershipSingleMemberOwnsAll(t *testing.T) {
	e := leaseEtcd(t)
	cli := leaseClient(t, e)
	rec := newOwnRecorder(t, true)
	a := ownStart(t, cli, "member-a", 2*time.Second, rec.callbacks("member-a"))
	leaseWait(t, 5*time.Second, "member-a to own 16 shards", func() bool { return ownCount(a.own) == 16 })

	rec.mu.Lock()
	if n := rec.acqCount["member-a"]; n != 16 {
		t.Errorf("Acquired called %d times, want 16", n)
	}
	rec.mu.Unlock()
	resp, err := cli.Get(context.Background(), ownTestPrefix+"shards/owners/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 16 {
		t.Fatalf("%d owner keys, want 16", len(resp.Kvs))
	}
	for i, kv := range resp.Kvs {
		s := uint32(i)
		rev, _ := a.own.Owned(s)
		if want := fmt.Sprintf("%sshards/owners/%05d", ownTestPrefix, s); string(kv.Key) != want ||
			string(kv.Value) != "member-a" || clientv3.LeaseID(kv.Lease) != a.lease.ID() || kv.CreateRevision != rev {
			t.Errorf("owner key %s = %q lease %x create %d; want %s = member-a, lease %x, create %d",
				kv.Key, kv.Value, kv.Lease, kv.CreateRevision, want, a.lease.ID(), rev)
		}
		if key, grev, ok := a.own.Guard(s); !ok || key != string(kv.Key) || grev != rev {
			t.Errorf("Guard(%d) = %s %d %v", s, key, grev, ok)
		}
		if id, addr, ok := a.own.Owner(s); !ok || id != "member-a" || addr != "member-a:7000" {
			t.Errorf("Owner(%d) = %s %s %v", s, id, addr, ok)
		}
	}
	if ms := a.own.Members(); len(ms) != 1 || ms[0] != (Member{ID: "member-a", Addr: "member-a:7000"}) {
		t.Errorf("Members() = %v", ms)
	}
}

// More shards than one Txn may carry: every Txn takes at most 128 (etcd's
// --max-txn-ops), and the member still owns them all.
func TestOwnershipCampaignsInBatches(t *testing.T) {
	e := leaseEtcd(t)
	cli := leaseClient(t, e)
	rec := newOwnRecorder(t, true)
	a := ownStart(t, cli, "member-a", 2*time.Second, rec.callbacks("member-a"), WithShardCount(300))
	leaseWait(t, 5*time.Second, "member-a to own 300 shards", func() bool { return ownCount(a.own) == 300 })
	perTxn := map[int64]int{}
	for s := uint32(0); s < 300; s++ {
		rev, _ := a.own.Owned(s)
		perTxn[rev]++
	}
	for rev, n := range perTxn {
		if n > ownMaxTxnOps {
			t.Errorf("revision %d took %d shards, more than %d", rev, n, ownMaxTxnOps)
		}
	}
}

func TestOwnershipShardCountIsStored(t *testing.T) {
	e := leaseEtcd(t)
	cli := leaseClient(t, e)
	ctx := context.Background()
	first, err := NewOwnership(ctx, cli, ownTestPrefix, nil, Callbacks{}, WithShardCount(16), WithRole(true))
	if err != nil {
		t.Fatal(err)
	}
	first.Close(ctx)
	l := leaseNew(t, cli, 2*time.Second, nil)
	_, err = NewOwnership(ctx, cli, ownTestPrefix, l, Callbacks{}, WithShardCount(32), WithMemberID("member-b"))
	if err == nil {
		t.Fatal("a second start with another shard count was accepted")
	}
	for _, want := range []string{"16", "32", "empty keyspace"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if resp, err := cli.Get(ctx, ownTestPrefix+"shards/members/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Errorf("a refused member registered (%v, %v)", resp, err)
	}
	same, err := NewOwnership(ctx, cli, ownTestPrefix, l, Callbacks{}, WithShardCount(16), WithMemberID("member-b"))
	if err != nil {
		t.Fatalf("the same count was refused: %v", err)
	}
	same.Close(ctx)
}

// Two members split the shards; a third joins and takes its share. No
// shard ever has two owners: the old owner's Lost comes before the new
// owner's Acquired (the recorder checks it at each callback).
func TestOwnershipMembersSplitAndRebalance(t *testing.T) {
	e := leaseEtcd(t)
	cli := leaseClient(t, e)
	rec := newOwnRecorder(t, true)
	a := ownStart(t, cli, "member-a", 2*time.Second, rec.callbacks("member-a"))
	b := ownStart(t, cli, "member-b", 2*time.Second, rec.callbacks("member-b"))
	leaseWait(t, 10*time.Second, "two members to split the shards", func() bool { return ownStable([]*ownMember{a, b}) })
	for _, m := range []*ownMember{a, b} {
		if n := ownCount(m.own); n < 4 {
			t.Errorf("%s owns %d of 16 shards, want at least 4", m.id, n)
		}
	}

	c := ownStart(t, cli, "member-c", 2*time.Second, rec.callbacks("member-c"))
	leaseWait(t, 10*time.Second, "three members to split the shards", func() bool { return ownStable([]*ownMember{a, b, c}) })
	if n := ownCount(c.own); n == 0 {
		t.Fatal("member-c owns nothing")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.lostCount["member-a"]+rec.lostCount["member-b"] < ownCount(c.own) {
		t.Errorf("member-c owns %d shards but the others lost only %d", ownCount(c.own),
			rec.lostCount["member-a"]+rec.lostCount["member-b"])
	}
}

// A graceful close hands every shard over at once: the other member owns
// them all while the closed member's lease is still alive in etcd.
func TestOwnershipCloseHandsOverWithoutTTL(t *testing.T) {
	e := leaseEtcd(t)
	cli := leaseClient(t, e)
	rec := newOwnRecorder(t, true)
	const ttl = 10 * time.Second
	a := ownStart(t, cli, "member-a", ttl, rec.callbacks("member-a"))
	b := ownStart(t, cli, "member-b", ttl, rec.callbacks("member-b"))
	leaseWait(t, 10*time.Second, "two members to split the shards", func() bool { return ownStable([]*ownMember{a, b}) })

	ctx := context.Background()
	b.own.Close(ctx)
	if n := ownCount(b.own); n != 0 {
		t.Fatalf("member-b still owns %d shards after Close", n)
	}
	leaseWait(t, ttl/2, "member-a to own every shard", func() bool { return ownCount(a.own) == 16 })
	if !leaseExists(t, cli, b.lease.ID()) {
		t.Fatal("member-b's lease is gone: the takeover may have waited for it")
	}
	resp, err := cli.Get(ctx, ownTestPrefix+"shards/members/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Key) != ownTestPrefix+"shards/members/member-a" {
		t.Errorf("member keys after member-b closed: %v", resp.Kvs)
	}
}

// A member that stops renewing (its client is gone, no revoke): the other
// owns its shards only after its lease expired, never before its
// deadline.
func TestOwnershipCrashTakeoverWaitsForLease(t *testing.T) {
	e := leaseEtcd(t)
	cli := leaseClient(t, e)
	bcli := leaseClient(t, e)
	recA, recB := newOwnRecorder(t, true), newOwnRecorder(t, false)
	a := ownStart(t, cli, "member-a", 2*time.Second, recA.callbacks("member-a"))
	b := ownStart(t, bcli, "member-b", time.Second, recB.callbacks("member-b"))
	leaseWait(t, 10*time.Second, "two members to split the shards", func() bool { return ownStable([]*ownMember{a, b}) })
	var bShards []uint32
	for s := uint32(0); s < 16; s++ {
		if _, ok := b.own.Owned(s); ok {
			bShards = append(bShards, s)
		}
	}

	_ = bcli.Close()
	leaseWait(t, 10*time.Second, "member-a to own every shard", func() bool { return ownCount(a.own) == 16 })
	deadline := b.lease.Deadline()
	for _, s := range bShards {
		at, ok := recA.acquiredAt("member-a", s)
		if !ok {
			t.Fatalf("no Acquired for shard %d", s)
		}
		if at.Before(deadline) {
			t.Errorf("shard %d taken over %v before member-b's deadline", s, deadline.Sub(at))
		}
		if _, _, ok := b.own.Guard(s); ok {
			t.Errorf("member-b's Guard(%d) ok after its deadline", s)
		}
	}
}

// Guard ends with the term: after Release (a shard assigned to this
// member may be won again at once, but only as a new term) and after the
// lease is lost.
func TestOwnershipGuardEndsWithReleaseAndLease(t *testing.T) {
	e := leaseEtcd(t)
	cli := leaseClient(t, e)
	rec := newOwnRecorder(t, true)
	a := ownStart(t, cli, "member-a", 2*time.Second, rec.callbacks("member-a"), WithShardCount(4))
	leaseWait(t, 5*time.Second, "member-a to own 4 shards", func() bool { return ownCount(a.own) == 4 })
	ctx := context.Background()
	key, rev, ok := a.own.Guard(0)
	if !ok {
		t.Fatal("Guard(0) not ok for an owned shard")
	}
	if err := a.own.Release(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if _, grev, ok := a.own.Guard(0); ok && grev <= rev {
		t.Fatalf("Guard(0) still gives the released term %d", grev)
	}
	rec.mu.Lock()
	lost := rec.lostCount["member-a"]
	rec.mu.Unlock()
	if lost != 1 {
		t.Fatalf("Lost called %d times on Release, want 1", lost)
	}
	if resp, err := cli.Get(ctx, key); err != nil || (len(resp.Kvs) > 0 && resp.Kvs[0].CreateRevision == rev) {
		t.Fatalf("the released owner key is still there (%v, %v)", resp, err)
	}

	if _, err := cli.Revoke(ctx, a.lease.ID()); err != nil {
		t.Fatal(err)
	}
	leaseWait(t, 5*time.Second, "every shard lost with the lease", func() bool { return ownCount(a.own) == 0 })
	time.Sleep(200 * time.Millisecond) // a few ticks: no campaign on a lost lease
	for s := uint32(0); s < 4; s++ {
		if _, _, ok := a.own.Guard(s); ok {
			t.Errorf("Guard(%d) ok after the lease was lost", s)
		}
	}
}

// An owner key deleted behind the member's back (an operator): Lost,
// and, the shard being still assigned to it, a new term.
func TestOwnershipLostWhenOwnerKeyDeleted(t *testing.T) {
	e := leaseEtcd(t)
	cli := leaseClient(t, e)
	rec := newOwnRecorder(t, true)
	a := ownStart(t, cli, "member-a", 2*time.Second, rec.callbacks("member-a"), WithShardCount(4))
	leaseWait(t, 5*time.Second, "member-a to own 4 shards", func() bool { return ownCount(a.own) == 4 })
	key, rev, _ := a.own.Guard(2)
	if _, err := cli.Delete(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	leaseWait(t, 5*time.Second, "a new term for shard 2", func() bool {
		r, ok := a.own.Owned(2)
		return ok && r > rev
	})
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.lostCount["member-a"] != 1 || rec.acqCount["member-a"] != 5 {
		t.Errorf("%d Lost and %d Acquired, want 1 and 5", rec.lostCount["member-a"], rec.acqCount["member-a"])
	}
}

// A relay registers nothing, owns nothing and sees who owns what.
func TestOwnershipRelayOnlyLooks(t *testing.T) {
	e := leaseEtcd(t)
	cli := leaseClient(t, e)
	rec := newOwnRecorder(t, true)
	a := ownStart(t, cli, "member-a", 2*time.Second, rec.callbacks("member-a"))
	ctx := context.Background()
	relay, err := NewOwnership(ctx, cli, ownTestPrefix, nil, rec.callbacks("relay"), WithShardCount(16), WithRole(true), WithMemberID("relay"))
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close(ctx)
	leaseWait(t, 5*time.Second, "the relay to see member-a own everything", func() bool { return ownStable([]*ownMember{a}, relay) })
	for s := uint32(0); s < 16; s++ {
		if _, ok := relay.Owned(s); ok {
			t.Errorf("the relay owns shard %d", s)
		}
		if _, _, ok := relay.Guard(s); ok {
			t.Errorf("the relay's Guard(%d) is ok", s)
		}
	}
	if ms := relay.Members(); len(ms) != 1 || ms[0].ID != "member-a" {
		t.Errorf("the relay sees members %v", ms)
	}
	resp, err := cli.Get(ctx, ownTestPrefix+"shards/members/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 1 {
		t.Errorf("member keys: %v (%v), want member-a's only", resp, err)
	}
}

// A registered member that never campaigns (stuck): its shards are
// adopted after WithAdoptAfter and then kept, not handed back and forth.
func TestOwnershipAdoptsShardsOfAStuckMember(t *testing.T) {
	e := leaseEtcd(t)
	cli := leaseClient(t, e)
	ctx := context.Background()
	stuck := leaseNew(t, cli, 10*time.Second, nil)
	if _, err := cli.Put(ctx, ownTestPrefix+"shards/members/member-stuck", `{"id":"member-stuck","addr":"x"}`, clientv3.WithLease(stuck.ID())); err != nil {
		t.Fatal(err)
	}
	rec := newOwnRecorder(t, true)
	a := ownStart(t, cli, "member-a", 2*time.Second, rec.callbacks("member-a"), WithAdoptAfter(200*time.Millisecond))
	leaseWait(t, 5*time.Second, "member-a to adopt every shard", func() bool { return ownCount(a.own) == 16 })
	time.Sleep(time.Second) // five adoption periods
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.acqCount["member-a"] != 16 || rec.lostCount["member-a"] != 0 {
		t.Errorf("adopted shards flapped: %d Acquired, %d Lost", rec.acqCount["member-a"], rec.lostCount["member-a"])
	}
}

func TestShardOfIsStable(t *testing.T) {
	// FNV-1a 64 test vectors: "" 0xcbf29ce484222325, "a" 0xaf63dc4c8601ec8c,
	// "foobar" 0x85944171f73967e8.
	for _, tc := range []struct {
		name  string
		count int
		want  uint32
	}{{"", 256, 0x25}, {"a", 256, 0x8c}, {"foobar", 256, 0xe8}, {"foobar", 1000, uint32(0x85944171f73967e8 % 1000)}} {
		if got := ShardOf(tc.name, tc.count); got != tc.want {
			t.Errorf("ShardOf(%q, %d) = %d, want %d", tc.name, tc.count, got, tc.want)
		}
	}
}

// Rendezvous hashing: a member joining takes shards only for itself (no
// shard moves between the others), about its share of them.
func TestMemberJoinMovesShardsOnlyToIt(t *testing.T) {
	before := []string{"m1", "m2", "m3", "m4"}
	after := append(slices.Clone(before), "m5")
	moved := 0
	for s := uint32(0); s < 4096; s++ {
		was, now := ownAssignee(s, before), ownAssignee(s, after)
		if was != now {
			moved++
			if now != "m5" {
				t.Fatalf("shard %d moved from %s to %s", s, was, now)
			}
		}
	}
	if share := 4096 / 5; moved < share*8/10 || moved > share*12/10 {
		t.Errorf("the new member took %d of 4096 shards, want about %d", moved, share)
	}
}
