package shard

// Graceful hand-overs (issue 24 item 7): the shard takes nothing new, what
// is in flight commits and is answered, then the owner keys go, with the
// member key, in one Txn; the view keeps following etcd until Close.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A release whose delete is at etcd when its shard is handed over (here
// Ownership.Release; rebalancing does the same) commits and is answered
// released=true. The shard refuses new calls meanwhile, and its key goes
// only after that commit. Dropped in flight, the release was answered
// UNAVAILABLE though it committed, and a retry released nothing.
func TestHandOffAnswersAReleaseInFlight(t *testing.T) {
	_, cli := ownerEtcd(t)
	gate := gateDeletes(cli)
	o := startOwner(t, cli)
	t.Cleanup(gate.open) // before the owner's Close, should the test fail
	ctx := ctxT(t)
	const name = "released-in-flight"
	shard := o.ShardOf(name)
	g, err := o.Acquire(ctx, acq(name, 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}

	gate.hold(o.dataPrefix(shard))
	type answer struct {
		ok  bool
		err error
	}
	released := make(chan answer, 1)
	go func() {
		ok, err := o.Release(ctx, name, g.Token, g.Handle, "alice")
		released <- answer{ok, err}
	}()
	select {
	case <-gate.entered:
	case <-ctx.Done():
		t.Fatal("the release's delete never reached etcd")
	}
	handed := make(chan error, 1)
	go func() { handed <- o.Ownership().Release(ctx, shard) }()

	// The hand-over has begun: the shard takes nothing new...
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := o.Validate(name, g.Token)
		if errors.Is(err, ErrNotServing) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shard still answers during its hand-over: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
	// ...but neither the release nor the hand-over ends before the commit.
	select {
	case a := <-released:
		t.Fatalf("the release in flight was answered before its delete committed: %v, %v", a.ok, a.err)
	case err := <-handed:
		t.Fatalf("the shard was handed over with a release in flight: %v", err)
	default:
	}
	gate.open()
	if a := <-released; a.err != nil || !a.ok {
		t.Fatalf("the release in flight across the hand-over = %v, %v; want released", a.ok, a.err)
	}
	if err := <-handed; err != nil {
		t.Fatal(err)
	}
	// The member, still the shard's assignee, won it again and loaded it
	// from etcd: the grant is gone there.
	waitServing(t, o)
	if v, err := o.Validate(name, g.Token); err != nil || v.Valid {
		t.Fatalf("the released grant after the hand-over = %+v, %v; want not valid", v, err)
	}
	resp, err := cli.Get(ctx, o.dataPrefix(shard), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("%d grant keys left in the shard (%v)", resp.Count, err)
	}
}

// HandOver calls Lost for every owned shard at once, each with the Guard
// still held (the runtime may commit what is in flight); one Txn then
// deletes the member key and every owner key; the view keeps following
// etcd (it names the next owner, and wakes Changed) while the member
// campaigns no more. A shard lost behind the member's back has no Guard
// left when Lost is called.
func TestHandOverLosesEveryShardAtOnceUnderGuardThenLeavesInOneTxn(t *testing.T) {
	e := leaseEtcd(t)
	cli := leaseClient(t, e)
	const shards = 8
	var (
		a       atomic.Pointer[Ownership]
		arrived = make(chan uint32, shards)
		all     = make(chan struct{})
		mu      sync.Mutex
		guarded = map[uint32]bool{}
		alone   []uint32 // Lost calls that did not see the others begin
	)
	cb := Callbacks{Lost: func(s uint32) {
		_, _, ok := a.Load().Guard(s)
		mu.Lock()
		guarded[s] = ok
		mu.Unlock()
		arrived <- s
		select {
		case <-all:
		case <-time.After(5 * time.Second): // only if Lost is called one after another
			mu.Lock()
			alone = append(alone, s)
			mu.Unlock()
		}
	}}
	ma := ownStart(t, cli, "member-a", 5*time.Second, cb, WithShardCount(shards))
	a.Store(ma.own)
	leaseWait(t, 10*time.Second, "member-a to own every shard", func() bool { return ownCount(ma.own) == shards })

	ctx := ctxT(t)
	start, err := cli.Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := cli.Watch(wctx, ownTestPrefix+"shards/", clientv3.WithPrefix(), clientv3.WithRev(start.Header.Revision+1))
	go func() {
		for range shards {
			<-arrived
		}
		close(all)
	}()
	changed := ma.own.Changed()
	ma.own.HandOver(ctx)

	mu.Lock()
	if len(alone) > 0 {
		t.Errorf("Lost of shards %v ran before the others began: the hand-over's Lost calls are sequential", alone)
	}
	for s := range uint32(shards) {
		if !guarded[s] {
			t.Errorf("Lost(%d) in a graceful hand-over ran without the Guard", s)
		}
	}
	mu.Unlock()
	if n := ownCount(ma.own); n != 0 {
		t.Fatalf("member-a owns %d shards after HandOver", n)
	}
	// One Txn deleted the member key and the owner keys.
	deleted := map[string]int64{}
	for len(deleted) < shards+1 {
		select {
		case resp := <-wch:
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					deleted[string(ev.Kv.Key)] = ev.Kv.ModRevision
				}
			}
		case <-ctx.Done():
			t.Fatalf("deleted after HandOver: %v; want the member key and %d owner keys", deleted, shards)
		}
	}
	revs := map[int64]bool{}
	for k, rev := range deleted {
		if !strings.Contains(k, "/members/") && !strings.Contains(k, "/owners/") {
			t.Errorf("HandOver deleted %s", k)
		}
		revs[rev] = true
	}
	if len(revs) != 1 {
		t.Errorf("the member key and the owner keys were deleted at revisions %v; want one Txn", revs)
	}
	select {
	case <-changed:
	default:
		t.Error("the view's Changed did not wake on the hand-over")
	}

	// The view keeps following: it names the next owner, and member-a
	// campaigns no more.
	rec := newOwnRecorder(t, false)
	mb := ownStart(t, cli, "member-b", 5*time.Second, rec.callbacks("member-b"), WithShardCount(shards))
	leaseWait(t, 10*time.Second, "member-a's view to name member-b the owner of every shard", func() bool {
		for s := range uint32(shards) {
			if id, _, ok := ma.own.Owner(s); !ok || id != "member-b" {
				return false
			}
		}
		return ownCount(mb.own) == shards
	})
	if n := ownCount(ma.own); n != 0 {
		t.Fatalf("member-a owns %d shards after HandOver", n)
	}

	// A shard lost, not handed over: no Guard left in Lost.
	var lostGuard atomic.Int32 // 0: not called, 1: without the Guard, 2: with it
	mc := ownStart(t, cli, "member-c", 5*time.Second, Callbacks{Lost: func(s uint32) {
		if s != 0 {
			return
		}
		if _, _, ok := a.Load().Guard(s); ok {
			lostGuard.Store(2)
		} else {
			lostGuard.Store(1)
		}
	}}, WithShardCount(shards))
	_ = mb
	a.Store(mc.own)
	mb.own.Close(ctx) // member-c takes every shard
	leaseWait(t, 10*time.Second, "member-c to own every shard", func() bool { return ownCount(mc.own) == shards })
	if _, err := cli.Delete(ctx, ownTestPrefix+"shards/owners/00000"); err != nil {
		t.Fatal(err)
	}
	leaseWait(t, 10*time.Second, "member-c to lose shard 0", func() bool { return lostGuard.Load() != 0 })
	if lostGuard.Load() != 1 {
		t.Error("Lost of a shard whose key was deleted behind the member's back ran with the Guard")
	}
}

// gatedKV holds the Txns that delete a key under a prefix (hold) until
// open: a unit stays in flight at etcd as long as a test needs.
type gatedKV struct {
	clientv3.KV
	prefix  atomic.Pointer[string]
	entered chan struct{} // closed when a held Txn waits
	opened  chan struct{}
	enter   sync.Once
	openOne sync.Once
}

// gateDeletes puts a gate on cli's KV (the Owner's committer and
// ownership use it).
func gateDeletes(cli *clientv3.Client) *gatedKV {
	g := &gatedKV{KV: cli.KV, entered: make(chan struct{}), opened: make(chan struct{})}
	cli.KV = g
	return g
}

func (g *gatedKV) hold(prefix string) { g.prefix.Store(&prefix) }

func (g *gatedKV) open() { g.openOne.Do(func() { close(g.opened) }) }

func (g *gatedKV) Txn(ctx context.Context) clientv3.Txn {
	return &gatedTxn{Txn: g.KV.Txn(ctx), g: g, ctx: ctx}
}

type gatedTxn struct {
	clientv3.Txn
	g    *gatedKV
	ctx  context.Context
	held bool
}

func (t *gatedTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }

func (t *gatedTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *gatedTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	if p := t.g.prefix.Load(); p != nil {
		for _, op := range ops {
			if op.IsDelete() && strings.HasPrefix(string(op.KeyBytes()), *p) {
				t.held = true
			}
		}
	}
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *gatedTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.held {
		t.g.enter.Do(func() { close(t.g.entered) })
		select {
		case <-t.g.opened:
		case <-t.ctx.Done():
			return nil, t.ctx.Err()
		}
	}
	return t.Txn.Commit()
}
