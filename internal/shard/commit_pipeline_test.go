package shard

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The pipeline: several Txns in flight, at most one per shard, no key or
// conflict key in two at once.

// commitGate holds Txns in flight: each Txn the hook takes signals entered,
// then waits for open (or its context).
type commitGate struct {
	entered chan commitRecTxn
	open    chan struct{}
	once    sync.Once
}

func newCommitGate(t testing.TB) *commitGate {
	g := &commitGate{entered: make(chan commitRecTxn, 64), open: make(chan struct{})}
	t.Cleanup(g.release)
	return g
}

func (g *commitGate) hold(ctx context.Context, txn commitRecTxn) {
	g.entered <- txn
	select {
	case <-g.open:
	case <-ctx.Done():
	}
}

func (g *commitGate) release() { g.once.Do(func() { close(g.open) }) }

// wait is the next Txn held; it fails the test if none comes.
func (g *commitGate) wait(t testing.TB) commitRecTxn {
	t.Helper()
	select {
	case txn := <-g.entered:
		return txn
	case <-time.After(30 * time.Second):
		t.Fatal("no Txn was sent")
		return commitRecTxn{}
	}
}

// TestCommitPipelineConcurrent: units of 4 shards, each submitted while the
// Txns before it are held, go in 4 Txns in flight at once; units submitted
// while the limit is reached wait, and the next Txn takes them all.
func TestCommitPipelineConcurrent(t *testing.T) {
	_, cli := commitEtcd(t)
	f := newCommitFixture(t, cli, WithMaxInflight(4))
	for s := uint32(1); s <= 6; s++ {
		f.own(s)
	}
	g := newCommitGate(t)
	f.kv.setHook(func(ctx context.Context, txn commitRecTxn) error {
		g.hold(ctx, txn)
		return nil
	})
	calls := map[uint32]*commitCall{}
	owners := map[string]bool{}
	for s := uint32(1); s <= 4; s++ {
		calls[s] = f.submit(s, Op{Key: f.key(fmt.Sprint("k", s)), Value: fmt.Sprint("v", s)})
		txn := g.wait(t)
		if len(txn.owners) != 1 || owners[txn.owners[0]] || !slices.Equal(txn.keys, []string{f.key(fmt.Sprint("k", s))}) {
			t.Errorf("Txn %d: compares %q, keys %q: want shard %d's unit alone", s, txn.owners, txn.keys, s)
		}
		owners[txn.owners[0]] = true
	}
	if n := f.kv.inFlight(); n != 4 {
		t.Errorf("%d Txns in flight, want 4", n)
	}
	// The limit is reached: these wait, then share the next Txn.
	calls[5] = f.submit(5, Op{Key: f.key("k5"), Value: "v5"})
	calls[6] = f.submit(6, Op{Key: f.key("k6"), Value: "v6"})
	g.release()
	revs := map[uint32]int64{}
	for s, w := range calls {
		revs[s] = w.mustCommit()
		if v, created, _ := f.get(f.key(fmt.Sprint("k", s))); v != fmt.Sprint("v", s) || created != revs[s] {
			t.Errorf("shard %d: etcd has %q created at %d, unit at %d", s, v, created, revs[s])
		}
	}
	if revs[5] != revs[6] {
		t.Errorf("the units that waited for a slot are at %d and %d: want one Txn", revs[5], revs[6])
	}
	if m := f.kv.maxInFlight(); m != 4 {
		t.Errorf("at most %d Txns in flight at once, want 4", m)
	}
	if s := f.c.Stats(); s != (CommitStats{Txns: 5, Units: 6, Ops: 6}) {
		t.Errorf("stats %+v, want 5 Txns of 6 units", s)
	}
	f.checkTxns()
}

// TestCommitPipelineExclusive: under a random load over few shards and
// keys, no two Txns in flight at once share a shard, a key or a conflict
// key; each shard's units commit in submission order, and so do each
// key's (the last submitted value stays).
func TestCommitPipelineExclusive(t *testing.T) {
	_, cli := commitEtcd(t)
	f := newCommitFixture(t, cli, WithMaxInflight(4), WithMaxTxnOps(16))
	const units, shards = 2000, 8
	for s := range shards {
		f.own(uint32(s))
	}
	// The first Txn (unit 0's) is held until a second (unit 1's, of other
	// shard and keys) is in flight, so concurrency surely happens; every
	// Txn waits a random while, so they end in any order.
	var sent atomic.Int32
	second := make(chan struct{})
	f.kv.setHook(func(ctx context.Context, txn commitRecTxn) error {
		switch sent.Add(1) {
		case 1:
			select {
			case <-second:
			case <-ctx.Done():
				t.Error("no second Txn was sent while the first was in flight")
			}
		case 2:
			close(second)
		}
		time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		return nil
	})
	// Keys are mostly a shard's own (6 each, as a shard's grants are), a
	// few shared by every shard; even keys have a conflict key shared with
	// another key (as grants of one name do).
	type key struct{ shard, n int } // shard -1: shared
	keyName := func(k key) string { return f.key(fmt.Sprintf("k/%d/%d", k.shard, k.n)) }
	conflictOf := func(k key) string {
		if k.n%2 == 1 {
			return ""
		}
		return fmt.Sprintf("grant:%d/%d", k.shard, k.n%4)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	type unit struct {
		shard int
		keys  []key
	}
	us := make([]unit, units)
	calls := make([]*commitCall, units)
	for i := range calls {
		u := unit{shard: rng.IntN(shards)}
		if i < 2 {
			u.shard = i
		}
		var ops []Op
		used := map[string]bool{}
		for range 1 + rng.IntN(3) {
			k := key{u.shard, rng.IntN(6)}
			if i >= 2 && rng.IntN(20) == 0 {
				k = key{-1, rng.IntN(4)}
			}
			c := conflictOf(k)
			if slices.Contains(u.keys, k) || (c != "" && used[c]) {
				continue
			}
			used[c] = true
			u.keys = append(u.keys, k)
			ops = append(ops, Op{Key: keyName(k), Value: fmt.Sprint(i), Conflict: c})
		}
		us[i] = u
		calls[i] = f.submit(uint32(u.shard), ops...)
		if i%100 == 99 {
			runtime.Gosched() // let some Txns go while units keep coming
		}
	}
	lastOfKey, lastOfShard := map[key]int64{}, map[int]int64{}
	finalOfKey := map[key]int{}
	for i, w := range calls {
		rev, u := w.mustCommit(), us[i]
		if rev < lastOfShard[u.shard] {
			t.Errorf("unit %d at %d: its shard's previous unit at %d", i, rev, lastOfShard[u.shard])
		}
		lastOfShard[u.shard] = rev
		for _, k := range u.keys {
			if rev <= lastOfKey[k] {
				t.Errorf("unit %d at %d: key %v's previous unit at %d", i, rev, k, lastOfKey[k])
			}
			lastOfKey[k], finalOfKey[k] = rev, i
		}
	}
	for k, i := range finalOfKey {
		if v, _, _ := f.get(keyName(k)); v != fmt.Sprint(i) {
			t.Errorf("%s = %q, want %d", keyName(k), v, i)
		}
	}
	if m := f.kv.maxInFlight(); m < 2 {
		t.Errorf("at most %d Txn in flight at once, want several", m)
	}
	s := f.c.Stats()
	t.Logf("%d units in %d Txns, at most %d in flight at once", s.Units, s.Txns, f.kv.maxInFlight())
	if s.Units != units {
		t.Errorf("stats %+v, want %d units", s, units)
	}
	f.checkTxns() // no overlap among the Txns in flight at once
}

// TestCommitPipelineKeyBusy: a unit whose key, or conflict key, is in a
// Txn in flight waits for it, even on another shard that is free; units
// of other keys and shards still go.
func TestCommitPipelineKeyBusy(t *testing.T) {
	_, cli := commitEtcd(t)
	for _, tc := range []struct {
		name     string
		sameKey  bool
		conflict string
	}{
		{name: "key", sameKey: true},
		{name: "conflict key", conflict: "grant:x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newCommitFixture(t, cli, WithMaxInflight(4))
			for s := uint32(1); s <= 3; s++ {
				f.own(s)
			}
			k1, k2 := f.key("a"), f.key("b")
			if tc.sameKey {
				k2 = k1
			}
			g := newCommitGate(t)
			f.kv.setHook(func(ctx context.Context, txn commitRecTxn) error {
				if slices.Contains(txn.keys, k1) && slices.Contains(txn.owners, f.ownerKey(1)) {
					g.hold(ctx, txn)
				}
				return nil
			})
			first := f.submit(1, Op{Key: k1, Value: "first", Conflict: tc.conflict})
			g.wait(t)
			second := f.submit(2, Op{Key: k2, Value: "second", Conflict: tc.conflict})
			other := f.submit(3, Op{Key: f.key("c"), Value: "other"})
			other.mustCommit() // sent after the second unit was submitted
			if n := f.kv.txnsWith(k2); (tc.sameKey && n != 1) || (!tc.sameKey && n != 0) {
				t.Errorf("the second unit was sent while the first's Txn was in flight: %+v", f.kv.recorded())
			}
			select {
			case r := <-second.ch:
				t.Errorf("the second unit: Done(%d, %v) while the first is in flight", r.rev, r.err)
			default:
			}
			g.release()
			r1, r2 := first.mustCommit(), second.mustCommit()
			if r2 <= r1 {
				t.Errorf("the second unit at %d, the first at %d: want later", r2, r1)
			}
			if v, _, _ := f.get(k1); tc.sameKey && v != "second" {
				t.Errorf("%s = %q, want the second unit's", k1, v)
			}
			f.checkTxns()
		})
	}
}

// TestCommitPipelineUnknownOutcome: a Txn of shard A fails with an unknown
// outcome; its unit's Done (which makes the Guard refuse A, as the
// runtime's does) returns before A's next unit is looked at, so that unit
// fails with OwnershipLostError and is never sent. Shard B's units, in
// other Txns, in flight meanwhile and after, commit.
func TestCommitPipelineUnknownOutcome(t *testing.T) {
	_, cli := commitEtcd(t)
	for _, inflight := range []int{1, 4} {
		t.Run(fmt.Sprint("inflight=", inflight), func(t *testing.T) {
			f := newCommitFixture(t, cli, WithMaxInflight(inflight))
			const a, b = 1, 2
			f.own(a)
			f.own(b)
			a1, a2 := f.key("a1"), f.key("a2")
			injected := errors.New("injected: etcd did not answer")
			g := newCommitGate(t)
			f.kv.setHook(func(ctx context.Context, txn commitRecTxn) error {
				if slices.Contains(txn.keys, a1) {
					g.hold(ctx, txn)
					return injected
				}
				return nil
			})
			first := newCommitCall(t)
			f.c.Submit(Unit{Shard: a, Ops: []Op{{Key: a1, Value: "1"}}, Done: func(rev int64, err error) {
				if errors.Is(err, ErrUnknownOutcome) {
					time.Sleep(20 * time.Millisecond) // widen the window a concurrent build would use
					f.owners.refuse(a)                // the runtime marks the shard broken
				}
				first.done(rev, err)
			}})
			g.wait(t)
			second := f.submit(a, Op{Key: a2, Value: "2"})
			b1 := f.submit(b, Op{Key: f.key("b1"), Value: "1"})
			if inflight > 1 {
				b1.mustCommit() // in a Txn of its own while A's is in flight
			}
			g.release()
			r := first.wait()
			var ue *UnknownOutcomeError
			if !errors.As(r.err, &ue) || !errors.Is(ue.Err, injected) {
				t.Errorf("A's first unit: Done(%d, %v), want UnknownOutcomeError", r.rev, r.err)
			}
			r = second.wait()
			var ol *OwnershipLostError
			if !errors.As(r.err, &ol) || ol.Shard != a {
				t.Errorf("A's later unit: Done(%d, %v), want OwnershipLostError{%d}", r.rev, r.err, a)
			}
			if n := f.kv.txnsWith(a2); n != 0 {
				t.Errorf("A's later unit was sent in %d Txns", n)
			}
			if _, _, ok := f.get(a2); ok {
				t.Error("A's later unit was written")
			}
			if inflight == 1 {
				b1.mustCommit()
			}
			f.submit(b, Op{Key: f.key("b2"), Value: "2"}).mustCommit()
			for _, k := range []string{"b1", "b2"} {
				if _, _, ok := f.get(f.key(k)); !ok {
					t.Errorf("B's %s was not written", k)
				}
			}
			f.checkTxns()
		})
	}
}

// TestCommitPipelineClose: Close with several Txns in flight lets each
// end with its real outcome (committed, unknown, ownership lost), fails
// the units waiting with ErrClosed without writing them, and returns once
// the committer's goroutines are gone.
func TestCommitPipelineClose(t *testing.T) {
	_, cli := commitEtcd(t)
	f := newCommitFixture(t, cli, WithMaxInflight(4))
	for s := uint32(1); s <= 5; s++ {
		f.own(s)
	}
	injected := errors.New("injected: etcd did not answer")
	g := newCommitGate(t)
	f.kv.setHook(func(ctx context.Context, txn commitRecTxn) error {
		g.hold(ctx, txn)
		if slices.Contains(txn.owners, f.ownerKey(3)) {
			return injected
		}
		return nil
	})
	inflight := map[uint32]*commitCall{}
	for s := uint32(1); s <= 4; s++ {
		inflight[s] = f.submit(s, Op{Key: f.key(fmt.Sprint("in", s)), Value: "v"})
		g.wait(t)
	}
	var waiting commitCalls
	waiting = append(waiting,
		f.submit(1, Op{Key: f.key("wait1"), Value: "v"}), // its shard is in flight
		f.submit(5, Op{Key: f.key("wait5"), Value: "v"}), // no slot
		f.submit(2, Op{Key: f.key("wait2"), Value: "v"}))
	if _, err := cli.Delete(commitCtx(t), f.ownerKey(4)); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() {
		f.c.Close()
		close(closed)
	}()
	for !f.c.isClosed() {
		time.Sleep(time.Millisecond)
	}
	select {
	case <-closed:
		t.Fatal("Close returned with Txns in flight")
	default:
	}
	g.release()
	for _, s := range []uint32{1, 2} {
		rev := inflight[s].mustCommit()
		if _, created, ok := f.get(f.key(fmt.Sprint("in", s))); !ok || created != rev {
			t.Errorf("shard %d: unit at %d, etcd: created %d present %v", s, rev, created, ok)
		}
	}
	if r := inflight[3].wait(); !errors.Is(r.err, ErrUnknownOutcome) {
		t.Errorf("shard 3: Done(%d, %v), want UnknownOutcomeError", r.rev, r.err)
	}
	if r := inflight[4].wait(); !errors.Is(r.err, ErrOwnershipLost) {
		t.Errorf("shard 4: Done(%d, %v), want OwnershipLostError", r.rev, r.err)
	}
	for i, w := range waiting {
		if r := w.wait(); !errors.Is(r.err, ErrClosed) {
			t.Errorf("waiting unit %d: Done(%d, %v), want ErrClosed", i, r.rev, r.err)
		}
	}
	<-closed
	for _, k := range []string{"wait1", "wait5", "wait2", "in4"} {
		if _, _, ok := f.get(f.key(k)); ok {
			t.Errorf("%s was written", k)
		}
	}
	if n := len(f.kv.recorded()); n != 4 {
		t.Errorf("%d Txns sent, want the 4 in flight", n)
	}
	if s := f.c.Stats(); s != (CommitStats{Txns: 2, Units: 2, Ops: 2}) {
		t.Errorf("stats %+v, want the 2 Txns that committed", s)
	}
	commitGoroutinesGone(t)
	f.checkTxns()
}

// commitGoroutinesGone fails the test unless, soon, no goroutine of a
// Committer is left (each test closes its committers; TestMain's goleak
// checks the whole package at the end).
func commitGoroutinesGone(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(10 * time.Second); ; {
		stacks := string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "shard.(*Committer).run") && !strings.Contains(stacks, "shard.(*Committer).sender") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a committer goroutine is left after Close:\n%s", stacks)
		}
		time.Sleep(time.Millisecond)
	}
}
