package shard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/embedetcd"
)

// commitEtcd is a fresh embedded etcd and a client of it.
func commitEtcd(t testing.TB) (*embedetcd.Server, *clientv3.Client) {
	t.Helper()
	e, err := embedetcd.Start(context.Background(), t.TempDir(), embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return e, cli
}

// commitFixture is a Committer over a recording KV and a test's Guard, its
// keys under a prefix of the test's own.
type commitFixture struct {
	t        testing.TB
	cli      *clientv3.Client
	kv       *commitRecKV
	owners   *commitOwners
	c        *Committer
	prefix   string
	max      int // WithMaxTxnOps
	inflight int // WithMaxInflight
	mu       sync.Mutex
	conflict map[string]string // Op.Conflict by Op.Key, of every op submitted
}

func newCommitFixture(t testing.TB, cli *clientv3.Client, opts ...CommitOption) *commitFixture {
	f := &commitFixture{t: t, cli: cli, kv: &commitRecKV{KV: cli.KV}, owners: &commitOwners{fences: map[uint32]commitFence{}},
		prefix: "/t/" + t.Name() + "/", conflict: map[string]string{}}
	f.kv.conflictOf = f.conflictOf
	o := commitDefaults()
	for _, opt := range opts {
		opt(&o)
	}
	f.max, f.inflight = o.maxTxnOps, o.maxInflight
	f.c = NewCommitter(f.kv, f.owners.guard, opts...)
	t.Cleanup(f.c.Close)
	return f
}

// own puts shard's owner key and makes the Guard give it; it returns its
// create revision.
func (f *commitFixture) own(shard uint32) int64 {
	f.t.Helper()
	key := f.ownerKey(shard)
	resp, err := f.cli.Put(commitCtx(f.t), key, "me")
	if err != nil {
		f.t.Fatal(err)
	}
	f.owners.set(shard, key, resp.Header.Revision)
	return resp.Header.Revision
}

func (f *commitFixture) ownerKey(shard uint32) string {
	return fmt.Sprintf("%sshards/owners/%05d", f.prefix, shard)
}

// conflictOf is the conflict key submitted with key, or "".
func (f *commitFixture) conflictOf(key string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conflict[key]
}

// key is name under the fixture's prefix.
func (f *commitFixture) key(name string) string { return f.prefix + name }

// submit submits a unit of ops on shard and returns its call.
func (f *commitFixture) submit(shard uint32, ops ...Op) *commitCall {
	w := newCommitCall(f.t)
	f.mu.Lock()
	for _, op := range ops {
		f.conflict[op.Key] = op.Conflict
	}
	f.mu.Unlock()
	f.c.Submit(Unit{Shard: shard, Ops: ops, Done: w.done})
	return w
}

// block fills every slot of the pipeline: it sends one unit of each of
// shards 999, 998, ... (as many as WithMaxInflight allows Txns in flight)
// and holds their Txns in flight until the returned release is called (at
// the latest, at cleanup). Units submitted meanwhile wait, as they did
// behind the one Txn in flight of a committer of WithMaxInflight(1).
func (f *commitFixture) block() (release func(), blockers commitCalls) {
	f.t.Helper()
	held := make(chan struct{})
	for i := range f.inflight {
		shard := uint32(999 - i)
		if _, ok := f.owners.fence(shard); !ok {
			f.own(shard)
		}
		entered := make(chan struct{})
		f.kv.holdNext(func(ctx context.Context) {
			close(entered)
			select {
			case <-held:
			case <-ctx.Done():
			}
		})
		blockers = append(blockers, f.submit(shard, Op{Key: f.key(fmt.Sprint("blocker/", shard)), Value: "b"}))
		select {
		case <-entered:
		case <-time.After(30 * time.Second):
			f.t.Fatalf("blocker %d's Txn was not sent", i)
		}
	}
	var once sync.Once
	release = func() { once.Do(func() { close(held) }) }
	f.t.Cleanup(release)
	return release, blockers
}

// commitCalls are units' calls.
type commitCalls []*commitCall

// mustCommit waits for every call; each must succeed.
func (ws commitCalls) mustCommit() {
	for _, w := range ws {
		w.t.Helper()
		w.mustCommit()
	}
}

// get is key's value and create revision in etcd, or ok=false.
func (f *commitFixture) get(key string) (value string, createRev int64, ok bool) {
	f.t.Helper()
	resp, err := f.cli.Get(commitCtx(f.t), key)
	if err != nil {
		f.t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return "", 0, false
	}
	return string(resp.Kvs[0].Value), resp.Kvs[0].CreateRevision, true
}

// checkTxns asserts the limits of every Txn sent: at most max ops and
// compares, no key or conflict key twice, and no shard (owner key), key or
// conflict key in two Txns in flight at once; and that no more Txns were in
// flight at once than WithMaxInflight allows.
func (f *commitFixture) checkTxns() {
	f.t.Helper()
	for _, o := range f.kv.overlapsSeen() {
		f.t.Errorf("two Txns in flight at once: %s", o)
	}
	if m := f.kv.maxInFlight(); m > f.inflight {
		f.t.Errorf("%d Txns in flight at once, at most %d allowed", m, f.inflight)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, txn := range f.kv.recorded() {
		if len(txn.keys) > f.max || txn.cmps > f.max || txn.elses != txn.cmps {
			f.t.Errorf("Txn %d: %d ops, %d compares, %d else ops; max %d", i, len(txn.keys), txn.cmps, txn.elses, f.max)
		}
		keys, conflicts := map[string]bool{}, map[string]bool{}
		for _, k := range txn.keys {
			c := f.conflict[k]
			if keys[k] || (c != "" && conflicts[c]) {
				f.t.Errorf("Txn %d: key %q (conflict %q) twice in %q", i, k, c, txn.keys)
			}
			keys[k], conflicts[c] = true, c != ""
		}
	}
}

// commitOwners is a Guard over fences the test sets.
type commitOwners struct {
	mu      sync.Mutex
	fences  map[uint32]commitFence
	refused map[uint32]bool // as the runtime's broken shards: the Guard says no
}

func (o *commitOwners) guard(shard uint32) (string, int64, bool) {
	f, ok := o.fence(shard)
	return f.key, f.rev, ok
}

// refuse makes the Guard say no for shard from now on.
func (o *commitOwners) refuse(shard uint32) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.refused == nil {
		o.refused = map[uint32]bool{}
	}
	o.refused[shard] = true
}

func (o *commitOwners) fence(shard uint32) (commitFence, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	f, ok := o.fences[shard]
	return f, ok && !o.refused[shard]
}

func (o *commitOwners) set(shard uint32, key string, rev int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.fences[shard] = commitFence{shard: shard, key: key, rev: rev}
}

// commitCall is a unit's Done and what it was called with.
type commitCall struct {
	t     testing.TB
	calls atomic.Int32
	ch    chan commitResult
}

type commitResult struct {
	rev int64
	err error
}

func newCommitCall(t testing.TB) *commitCall {
	return &commitCall{t: t, ch: make(chan commitResult, 2)}
}

func (w *commitCall) done(rev int64, err error) {
	if w.calls.Add(1) > 1 {
		w.t.Errorf("Done called again: %d, %v", rev, err)
	}
	w.ch <- commitResult{rev, err}
}

// wait is the call's result; it fails the test if Done is never called.
func (w *commitCall) wait() commitResult {
	w.t.Helper()
	select {
	case r := <-w.ch:
		return r
	case <-time.After(30 * time.Second):
		w.t.Fatal("Done was not called")
		return commitResult{}
	}
}

// mustCommit waits for the call and returns its revision; it must succeed.
func (w *commitCall) mustCommit() int64 {
	w.t.Helper()
	r := w.wait()
	if r.err != nil || r.rev <= 0 {
		w.t.Fatalf("Done(%d, %v), want a revision", r.rev, r.err)
	}
	return r.rev
}

// commitRecKV is a KV that records every Txn committed through it, can
// hold one in flight or fail some, and checks the Txns in flight together.
type commitRecKV struct {
	clientv3.KV
	conflictOf func(key string) string // the conflict key of an op's key
	mu         sync.Mutex
	txns       []commitRecTxn
	hold       func(ctx context.Context) // called before the next Txn commits
	// hook, if set, is called before every Txn commits (after hold); an
	// error fails the Txn, not sent to etcd.
	hook      func(ctx context.Context, txn commitRecTxn) error
	active    map[*commitRecBuilder]struct{} // Txns in Commit now
	maxActive int
	overlaps  []string
}

type commitRecTxn struct {
	cmps, elses int
	owners      []string // the compares' keys: one owner key per shard
	keys        []string // of Then's ops
	conflicts   []string // of Then's ops, "" for none
}

func (kv *commitRecKV) Txn(ctx context.Context) clientv3.Txn {
	return &commitRecBuilder{kv: kv, ctx: ctx, inner: kv.KV.Txn(ctx)}
}

func (kv *commitRecKV) holdNext(hold func(ctx context.Context)) {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	kv.hold = hold
}

func (kv *commitRecKV) setHook(hook func(ctx context.Context, txn commitRecTxn) error) {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	kv.hook = hook
}

func (kv *commitRecKV) recorded() []commitRecTxn {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	return slices.Clone(kv.txns)
}

// inFlight is how many Txns are in Commit now.
func (kv *commitRecKV) inFlight() int {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	return len(kv.active)
}

// maxInFlight is the most Txns that were in Commit at once.
func (kv *commitRecKV) maxInFlight() int {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	return kv.maxActive
}

// overlapsSeen describes every shard, key or conflict key two Txns in
// Commit at once shared.
func (kv *commitRecKV) overlapsSeen() []string {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	return slices.Clone(kv.overlaps)
}

// txnWith is the index of the first Txn that wrote every key, or -1.
func (kv *commitRecKV) txnWith(keys ...string) int {
	for i, txn := range kv.recorded() {
		if !slices.ContainsFunc(keys, func(k string) bool { return !slices.Contains(txn.keys, k) }) {
			return i
		}
	}
	return -1
}

// txnsWith is how many Txns wrote key.
func (kv *commitRecKV) txnsWith(key string) int {
	n := 0
	for _, txn := range kv.recorded() {
		if slices.Contains(txn.keys, key) {
			n++
		}
	}
	return n
}

// commitRecOverlap is what a and b share that two Txns in flight at once
// must not: an owner key (a shard), a key or a conflict key; or "".
func commitRecOverlap(a, b *commitRecTxn) string {
	for _, o := range a.owners {
		if slices.Contains(b.owners, o) {
			return "owner key " + o
		}
	}
	for i, k := range a.keys {
		if slices.Contains(b.keys, k) {
			return "key " + k
		}
		if c := a.conflicts[i]; c != "" && slices.Contains(b.conflicts, c) {
			return "conflict key " + c
		}
	}
	return ""
}

type commitRecBuilder struct {
	kv    *commitRecKV
	ctx   context.Context
	inner clientv3.Txn
	rec   commitRecTxn
}

func (b *commitRecBuilder) If(cs ...clientv3.Cmp) clientv3.Txn {
	b.rec.cmps = len(cs)
	for _, c := range cs {
		b.rec.owners = append(b.rec.owners, string(c.KeyBytes()))
	}
	b.inner.If(cs...)
	return b
}

func (b *commitRecBuilder) Then(ops ...clientv3.Op) clientv3.Txn {
	for _, op := range ops {
		k := string(op.KeyBytes())
		b.rec.keys = append(b.rec.keys, k)
		c := ""
		if b.kv.conflictOf != nil {
			c = b.kv.conflictOf(k) // not under kv.mu: the fixture locks its mu, then kv.mu
		}
		b.rec.conflicts = append(b.rec.conflicts, c)
	}
	b.inner.Then(ops...)
	return b
}

func (b *commitRecBuilder) Else(ops ...clientv3.Op) clientv3.Txn {
	b.rec.elses = len(ops)
	b.inner.Else(ops...)
	return b
}

func (b *commitRecBuilder) Commit() (*clientv3.TxnResponse, error) {
	kv := b.kv
	kv.mu.Lock()
	kv.txns = append(kv.txns, b.rec)
	hold, hook := kv.hold, kv.hook
	kv.hold = nil
	if kv.active == nil {
		kv.active = map[*commitRecBuilder]struct{}{}
	}
	for other := range kv.active {
		if o := commitRecOverlap(&b.rec, &other.rec); o != "" {
			kv.overlaps = append(kv.overlaps, fmt.Sprintf("%s in %q and %q", o, b.rec.keys, other.rec.keys))
		}
	}
	kv.active[b] = struct{}{}
	kv.maxActive = max(kv.maxActive, len(kv.active))
	kv.mu.Unlock()
	defer func() {
		kv.mu.Lock()
		delete(kv.active, b)
		kv.mu.Unlock()
	}()
	if hold != nil {
		hold(b.ctx)
	}
	if hook != nil {
		if err := hook(b.ctx, b.rec); err != nil {
			return nil, err
		}
	}
	return b.inner.Commit()
}

// commitEachInflight runs test with WithMaxInflight(1), one Txn at a
// time, and with the default: the committer's behaviour is the same.
func commitEachInflight(t *testing.T, test func(t *testing.T, inflight CommitOption)) {
	t.Run("inflight=1", func(t *testing.T) { test(t, WithMaxInflight(1)) })
	t.Run(fmt.Sprintf("inflight=default(%d)", commitDefaults().maxInflight), func(t *testing.T) {
		test(t, func(*commitOptions) {})
	})
}

func commitCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestCommitGroups: units submitted while a Txn is in flight share the
// next; each gets the revision that created its key.
func TestCommitGroups(t *testing.T) {
	_, cli := commitEtcd(t)
	commitEachInflight(t, func(t *testing.T, inflight CommitOption) {
		f := newCommitFixture(t, cli, inflight)
		f.own(1)
		f.own(2)
		// The first Txn is held until every unit was submitted.
		var submitted sync.WaitGroup
		submitted.Add(64)
		f.kv.holdNext(func(context.Context) { submitted.Wait() })
		calls := make([]*commitCall, 64)
		var wg sync.WaitGroup
		for i := range calls {
			wg.Go(func() {
				calls[i] = f.submit(uint32(1+i%2), Op{Key: f.key(fmt.Sprint("k", i)), Value: fmt.Sprint("v", i)})
				submitted.Done()
			})
		}
		wg.Wait()
		for i, w := range calls {
			rev := w.mustCommit()
			v, created, ok := f.get(f.key(fmt.Sprint("k", i)))
			if !ok || v != fmt.Sprint("v", i) || created != rev {
				t.Errorf("unit %d: rev %d; etcd has %q created at %d (present %v)", i, rev, v, created, ok)
			}
		}
		if s := f.c.Stats(); s.Txns >= 64 || s.Units != 64 || s.Ops != 64 {
			t.Errorf("stats %+v: want fewer than 64 Txns for 64 units", s)
		}
		f.checkTxns()
	})
}

// TestCommitLoneUnit: with nothing in flight, a unit is sent at once, in
// a Txn of its own.
func TestCommitLoneUnit(t *testing.T) {
	_, cli := commitEtcd(t)
	commitEachInflight(t, func(t *testing.T, inflight CommitOption) {
		f := newCommitFixture(t, cli, inflight)
		f.own(1)
		for i := range 3 {
			f.submit(1, Op{Key: f.key("k"), Value: fmt.Sprint(i)}).mustCommit()
		}
		if s := f.c.Stats(); s != (CommitStats{Txns: 3, Units: 3, Ops: 3}) {
			t.Errorf("stats %+v, want 3 Txns of one unit", s)
		}
		if v, _, _ := f.get(f.key("k")); v != "2" {
			t.Errorf("value %q, want the last unit's", v)
		}
	})
}

// TestCommitTxnLimits: no Txn holds more than maxTxnOps ops or compares,
// and every unit commits.
func TestCommitTxnLimits(t *testing.T) {
	_, cli := commitEtcd(t)
	commitEachInflight(t, func(t *testing.T, inflight CommitOption) {
		for _, tc := range []struct {
			name     string
			units    int
			shards   int
			opsOf    func(i int) int
			wantTxns int // after the blockers'
		}{
			{name: "ops", units: 12, shards: 3, opsOf: func(int) int { return 3 }, wantTxns: 12},
			{name: "compares", units: 12, shards: 12, opsOf: func(int) int { return 1 }, wantTxns: 3},
			{name: "mixed", units: 24, shards: 5, opsOf: func(i int) int { return 1 + i%3 }},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := newCommitFixture(t, cli, inflight, WithMaxTxnOps(4))
				for s := range tc.shards {
					f.own(uint32(s))
				}
				release, blocker := f.block()
				calls := make([]*commitCall, tc.units)
				for i := range calls {
					var ops []Op
					for j := range tc.opsOf(i) {
						ops = append(ops, Op{Key: f.key(fmt.Sprintf("u%d/op%d", i, j)), Value: "x"})
					}
					calls[i] = f.submit(uint32(i%tc.shards), ops...)
				}
				release()
				blocker.mustCommit()
				for i, w := range calls {
					rev := w.mustCommit()
					if _, created, ok := f.get(f.key(fmt.Sprintf("u%d/op0", i))); !ok || created != rev {
						t.Errorf("unit %d: rev %d, etcd: created %d present %v", i, rev, created, ok)
					}
				}
				if got := len(f.kv.recorded()) - f.inflight; tc.wantTxns > 0 && got != tc.wantTxns {
					t.Errorf("%d Txns, want %d", got, tc.wantTxns)
				}
				f.checkTxns()
			})
		}
	})
}

// TestCommitConflicts: two units on one key, or one conflict key, never
// share a Txn; the later commits later, and other units still fill the
// Txn of the first.
func TestCommitConflicts(t *testing.T) {
	_, cli := commitEtcd(t)
	commitEachInflight(t, func(t *testing.T, inflight CommitOption) {
		for _, tc := range []struct {
			name           string
			shard2         uint32 // the second unit's shard (the first's is 1)
			sameKey        bool
			conflict       string
			wantThirdFirst bool // the third unit (shard 3) shares the first's Txn
		}{
			{name: "key/same shard", shard2: 1, sameKey: true},
			{name: "key/other shard", shard2: 2, sameKey: true},
			{name: "conflict/same shard", shard2: 1, conflict: "grant:x"},
			{name: "conflict/other shard", shard2: 2, conflict: "grant:x"},
			{name: "key and conflict", shard2: 2, sameKey: true, conflict: "grant:x"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := newCommitFixture(t, cli, inflight)
				for s := uint32(1); s <= 3; s++ {
					f.own(s)
				}
				k1, k2 := f.key("a"), f.key("b")
				if tc.sameKey {
					k2 = k1
				}
				release, blocker := f.block()
				first := f.submit(1, Op{Key: k1, Value: "first", Conflict: tc.conflict})
				second := f.submit(tc.shard2, Op{Key: k2, Value: "second", Conflict: tc.conflict})
				third := f.submit(3, Op{Key: f.key("c"), Value: "third"})
				release()
				blocker.mustCommit()
				r1, r2, r3 := first.mustCommit(), second.mustCommit(), third.mustCommit()
				if r2 <= r1 {
					t.Errorf("second unit at %d, first at %d: want later", r2, r1)
				}
				if r3 != r1 {
					t.Errorf("third unit at %d, want the first's Txn (%d)", r3, r1)
				}
				if v, _, _ := f.get(k1); tc.sameKey && v != "second" {
					t.Errorf("%s = %q, want the later unit's value", k1, v)
				}
				f.checkTxns()
			})
		}
	})
}

// TestCommitShardOrder: a shard's unit held back for a later Txn holds back
// the shard's later units too.
func TestCommitShardOrder(t *testing.T) {
	_, cli := commitEtcd(t)
	commitEachInflight(t, func(t *testing.T, inflight CommitOption) {
		f := newCommitFixture(t, cli, inflight)
		f.own(1)
		f.own(2)
		release, blocker := f.block()
		u1 := f.submit(1, Op{Key: f.key("k"), Value: "1"})
		u2 := f.submit(1, Op{Key: f.key("k"), Value: "2"}) // conflicts with u1
		u3 := f.submit(1, Op{Key: f.key("other"), Value: "3"})
		u4 := f.submit(2, Op{Key: f.key("two"), Value: "4"})
		release()
		blocker.mustCommit()
		r1, r2, r3, r4 := u1.mustCommit(), u2.mustCommit(), u3.mustCommit(), u4.mustCommit()
		if r1 >= r2 || r2 > r3 {
			t.Errorf("revisions %d, %d, %d: want 1 < 2 <= 3", r1, r2, r3)
		}
		if r4 != r1 {
			t.Errorf("shard 2's unit at %d, want in the first Txn (%d)", r4, r1)
		}
		if v, _, _ := f.get(f.key("k")); v != "2" {
			t.Errorf("k = %q, want 2", v)
		}
		f.checkTxns()
	})
}

// TestCommitBacklog: a backlog longer than one round looks at, with
// conflicts throughout, commits in order per shard and per key.
func TestCommitBacklog(t *testing.T) {
	_, cli := commitEtcd(t)
	commitEachInflight(t, func(t *testing.T, inflight CommitOption) {
		f := newCommitFixture(t, cli, inflight, WithMaxTxnOps(16)) // looks at 128 units a round
		const units, keys, shards = 1000, 10, 6
		for s := range shards {
			f.own(uint32(s))
		}
		rng := rand.New(rand.NewPCG(1, 2))
		type unit struct{ shard, key int }
		us := make([]unit, units)
		release, blocker := f.block()
		calls := make([]*commitCall, units)
		for i := range calls {
			us[i] = unit{rng.IntN(shards), rng.IntN(keys)}
			calls[i] = f.submit(uint32(us[i].shard), Op{Key: f.key(fmt.Sprint("k", us[i].key)), Value: fmt.Sprint(i)})
		}
		release()
		blocker.mustCommit()
		lastOfKey, lastOfShard := map[int]int64{}, map[int]int64{}
		finalOfKey := map[int]int{}
		for i, w := range calls {
			rev, u := w.mustCommit(), us[i]
			if rev <= lastOfKey[u.key] || rev < lastOfShard[u.shard] {
				t.Errorf("unit %d at %d: its key's previous unit at %d, its shard's at %d", i, rev, lastOfKey[u.key], lastOfShard[u.shard])
			}
			lastOfKey[u.key], lastOfShard[u.shard], finalOfKey[u.key] = rev, rev, i
		}
		for k, i := range finalOfKey {
			if v, _, _ := f.get(f.key(fmt.Sprint("k", k))); v != fmt.Sprint(i) {
				t.Errorf("k%d = %q, want %d", k, v, i)
			}
		}
		f.checkTxns()
	})
}

// TestCommitFenceFails: when a shard's owner key is gone or created again,
// its unit fails with OwnershipLostError and writes nothing; the other
// shard's unit of that Txn commits in the next.
func TestCommitFenceFails(t *testing.T) {
	_, cli := commitEtcd(t)
	commitEachInflight(t, func(t *testing.T, inflight CommitOption) {
		for _, tc := range []struct {
			name     string
			recreate bool
		}{
			{name: "deleted"},
			{name: "created again", recreate: true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := newCommitFixture(t, cli, inflight)
				f.own(1)
				f.own(2)
				release, blocker := f.block()
				lost := f.submit(1, Op{Key: f.key("one"), Value: "x"})
				kept := f.submit(2, Op{Key: f.key("two"), Value: "y"})
				later := f.submit(2, Op{Key: f.key("two"), Value: "z"})
				if _, err := cli.Delete(commitCtx(t), f.ownerKey(1)); err != nil {
					t.Fatal(err)
				}
				if tc.recreate {
					if _, err := cli.Put(commitCtx(t), f.ownerKey(1), "another replica"); err != nil {
						t.Fatal(err)
					}
				}
				release()
				blocker.mustCommit()

				r := lost.wait()
				var ol *OwnershipLostError
				if !errors.Is(r.err, ErrOwnershipLost) || !errors.As(r.err, &ol) || ol.Shard != 1 || errors.Is(r.err, ErrUnknownOutcome) {
					t.Errorf("shard 1's unit: Done(%d, %v), want OwnershipLostError{1}", r.rev, r.err)
				}
				if _, _, ok := f.get(f.key("one")); ok {
					t.Error("shard 1's key was written")
				}
				rk, rl := kept.mustCommit(), later.mustCommit()
				if v, created, _ := f.get(f.key("two")); v != "z" || created != rk || rl <= rk {
					t.Errorf("shard 2: %q created at %d; units at %d, %d", v, created, rk, rl)
				}
				shared := f.kv.txnWith(f.key("one"), f.key("two"))
				if shared < 0 || f.kv.txnWith(f.key("two")) != shared {
					t.Errorf("the two units did not share the first Txn after the blocker: %+v", f.kv.recorded())
				}
				f.checkTxns()
			})
		}
	})
}

// TestCommitNotOwned: a shard the Guard does not give fails at once, and
// no Txn is sent.
func TestCommitNotOwned(t *testing.T) {
	_, cli := commitEtcd(t)
	commitEachInflight(t, func(t *testing.T, inflight CommitOption) {
		for _, tc := range []struct {
			name  string
			fence func(f *commitFixture)
		}{
			{name: "not owned", fence: func(*commitFixture) {}},
			{name: "no create revision", fence: func(f *commitFixture) { f.owners.set(9, f.ownerKey(9), 0) }},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := newCommitFixture(t, cli, inflight)
				tc.fence(f)
				r := f.submit(9, Op{Key: f.key("k"), Value: "v"}).wait()
				var ol *OwnershipLostError
				if !errors.As(r.err, &ol) || ol.Shard != 9 || !errors.Is(r.err, ErrOwnershipLost) {
					t.Errorf("Done(%d, %v), want OwnershipLostError{9}", r.rev, r.err)
				}
				if n := len(f.kv.recorded()); n != 0 {
					t.Errorf("%d Txns sent, want none", n)
				}
			})
		}
	})
}

// TestCommitInvalidUnits: a unit too large for one Txn, or with two ops on
// one key or conflict key, fails without being sent; the committer goes on.
func TestCommitInvalidUnits(t *testing.T) {
	_, cli := commitEtcd(t)
	commitEachInflight(t, func(t *testing.T, inflight CommitOption) {
		for _, tc := range []struct {
			name string
			max  int // WithMaxTxnOps; 0 means 4
			ops  func(f *commitFixture) []Op
			want error
		}{
			{name: "too large", want: errUnitTooLarge, ops: func(f *commitFixture) []Op {
				var ops []Op
				for i := range 5 {
					ops = append(ops, Op{Key: f.key(fmt.Sprint(i))})
				}
				return ops
			}},
			{name: "key twice", want: errCommitDuplicate, ops: func(f *commitFixture) []Op {
				return []Op{{Key: f.key("0"), Value: "a"}, {Key: f.key("0"), Value: "b"}}
			}},
			{name: "put and delete", want: errCommitDuplicate, ops: func(f *commitFixture) []Op {
				return []Op{{Key: f.key("0"), Value: "a"}, {Key: f.key("0"), Delete: true}}
			}},
			{name: "key twice, other conflicts", want: errCommitDuplicate, ops: func(f *commitFixture) []Op {
				return []Op{{Key: f.key("0"), Conflict: "x"}, {Key: f.key("0"), Conflict: "y"}}
			}},
			{name: "conflict twice", want: errCommitDuplicate, ops: func(f *commitFixture) []Op {
				return []Op{{Key: f.key("0"), Conflict: "grant:x"}, {Key: f.key("1"), Conflict: "grant:x"}}
			}},
			{name: "key twice in many ops", max: 32, want: errCommitDuplicate, ops: func(f *commitFixture) []Op {
				ops := make([]Op, 20)
				for i := range ops {
					ops[i] = Op{Key: f.key(fmt.Sprint(i))}
				}
				ops[19].Key = ops[3].Key
				return ops
			}},
			{name: "conflict twice in many ops", max: 32, want: errCommitDuplicate, ops: func(f *commitFixture) []Op {
				ops := make([]Op, 20)
				for i := range ops {
					ops[i] = Op{Key: f.key(fmt.Sprint(i)), Conflict: fmt.Sprint("c", i)}
				}
				ops[18].Conflict = ops[2].Conflict
				return ops
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := newCommitFixture(t, cli, inflight, WithMaxTxnOps(cmp.Or(tc.max, 4)))
				f.own(1)
				r := f.submit(1, tc.ops(f)...).wait()
				if !errors.Is(r.err, tc.want) || r.rev != 0 {
					t.Errorf("Done(%d, %v), want %v", r.rev, r.err, tc.want)
				}
				if n := len(f.kv.recorded()); n != 0 {
					t.Errorf("%d Txns sent, want none", n)
				}
				resp, err := cli.Get(commitCtx(t), f.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
				if err != nil || resp.Count != 1 { // the owner key
					t.Errorf("%d keys under the prefix (%v), want only the owner key", resp.Count, err)
				}
				f.submit(1, Op{Key: f.key("ok"), Value: "v"}).mustCommit()
			})
		}
	})
}

// TestCommitEtcdDown: a Txn etcd does not answer fails its units with
// UnknownOutcomeError.
func TestCommitEtcdDown(t *testing.T) {
	commitEachInflight(t, func(t *testing.T, inflight CommitOption) {
		e, cli := commitEtcd(t)
		f := newCommitFixture(t, cli, inflight, WithCommitTimeout(300*time.Millisecond))
		f.own(1)
		f.submit(1, Op{Key: f.key("before"), Value: "v"}).mustCommit()
		e.Close()
		r := f.submit(1, Op{Key: f.key("after"), Value: "v"}).wait()
		var ue *UnknownOutcomeError
		if !errors.Is(r.err, ErrUnknownOutcome) || !errors.As(r.err, &ue) || ue.Err == nil || !errors.Is(errors.Unwrap(r.err), ue.Err) {
			t.Errorf("Done(%d, %v), want UnknownOutcomeError", r.rev, r.err)
		}
		if errors.Is(r.err, ErrOwnershipLost) {
			t.Errorf("%v: is ErrOwnershipLost too", r.err)
		}
	})
}

// TestCommitClose: Close fails waiting units with ErrClosed, gives the Txn
// in flight its outcome, and later Submits fail at once.
func TestCommitClose(t *testing.T) {
	_, cli := commitEtcd(t)
	commitEachInflight(t, func(t *testing.T, inflight CommitOption) {
		t.Run("waiting", func(t *testing.T) {
			f := newCommitFixture(t, cli, inflight)
			f.own(1)
			release, blocker := f.block()
			var waiting []*commitCall
			for i := range 5 {
				waiting = append(waiting, f.submit(1, Op{Key: f.key(fmt.Sprint(i)), Value: "v"}))
			}
			closed := make(chan struct{})
			go func() {
				f.c.Close()
				close(closed)
			}()
			for !f.c.isClosed() {
				time.Sleep(time.Millisecond)
			}
			release()
			blocker.mustCommit() // the Txns in flight were not aborted
			for i, w := range waiting {
				if r := w.wait(); !errors.Is(r.err, ErrClosed) {
					t.Errorf("waiting unit %d: Done(%d, %v), want ErrClosed", i, r.rev, r.err)
				}
			}
			<-closed
			after := f.submit(1, Op{Key: f.key("after"), Value: "v"})
			select {
			case r := <-after.ch:
				if !errors.Is(r.err, ErrClosed) {
					t.Errorf("Submit after Close: Done(%d, %v), want ErrClosed", r.rev, r.err)
				}
			default:
				t.Error("Submit after Close did not call Done at once")
			}
			f.c.Close() // again
			if _, _, ok := f.get(f.key("0")); ok {
				t.Error("a unit failed with ErrClosed was written")
			}
		})
		t.Run("busy", func(t *testing.T) {
			f := newCommitFixture(t, cli, inflight)
			f.own(1)
			f.own(2)
			var wg sync.WaitGroup
			var ok, closed atomic.Int64
			for g := range 8 {
				wg.Go(func() {
					for i := 0; ; i++ {
						r := f.submit(uint32(1+g%2), Op{Key: f.key(fmt.Sprint(g, "/", i)), Value: "v"}).wait()
						switch {
						case r.err == nil:
							ok.Add(1)
						case errors.Is(r.err, ErrClosed):
							closed.Add(1)
							return
						default:
							t.Errorf("Done(%d, %v)", r.rev, r.err)
							return
						}
					}
				})
			}
			for ok.Load() < 50 {
				time.Sleep(time.Millisecond)
			}
			f.c.Close()
			wg.Wait()
			if closed.Load() != 8 || f.c.Stats().Units != ok.Load() {
				t.Errorf("%d ended by ErrClosed, %d committed, stats %+v", closed.Load(), ok.Load(), f.c.Stats())
			}
		})
		t.Run("idle", func(t *testing.T) {
			c := NewCommitter(cli.KV, func(uint32) (string, int64, bool) { return "", 0, false }, inflight)
			c.Close()
			c.Close()
		})
	})
}

// TestCommitDoneSubmits: a Done may submit again (and read Stats) without
// deadlock, from the committer's goroutine.
func TestCommitDoneSubmits(t *testing.T) {
	_, cli := commitEtcd(t)
	commitEachInflight(t, func(t *testing.T, inflight CommitOption) {
		f := newCommitFixture(t, cli, inflight)
		f.own(1)
		const chain = 20
		revs := make(chan int64, chain)
		var next func(i int) Unit
		next = func(i int) Unit {
			return Unit{Shard: 1, Ops: []Op{{Key: f.key(fmt.Sprint(i)), Value: "v"}}, Done: func(rev int64, err error) {
				if err != nil {
					t.Errorf("unit %d: %v", i, err)
				}
				_ = f.c.Stats()
				if i+1 < chain {
					f.c.Submit(next(i + 1))
				}
				revs <- rev
			}}
		}
		f.c.Submit(next(0))
		var last int64
		for i := range chain {
			select {
			case rev := <-revs:
				if rev <= last {
					t.Errorf("unit %d at %d, after %d", i, rev, last)
				}
				last = rev
			case <-time.After(30 * time.Second):
				t.Fatalf("unit %d: Done not called", i)
			}
		}
	})
}

// BenchmarkCommitterParallel: goroutines each submitting a one-op unit and
// waiting for it, their units spread over 64 shards, with one Txn in
// flight at a time and with 4.
func BenchmarkCommitterParallel(b *testing.B) {
	_, cli := commitEtcd(b)
	f := newCommitFixture(b, cli)
	const shards = 64
	for s := range shards {
		f.own(uint32(s))
	}
	for _, inflight := range []int{1, 4} {
		b.Run(fmt.Sprint("inflight=", inflight), func(b *testing.B) {
			c := NewCommitter(cli.KV, f.owners.guard, WithMaxInflight(inflight)) // not through the recorder
			defer c.Close()
			var ids atomic.Int64
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				id := ids.Add(1)
				done := make(chan error, 1)
				report := func(_ int64, err error) { done <- err }
				for i := 0; pb.Next(); i++ {
					key := fmt.Sprintf("%sk/%d/%d/%d", f.prefix, inflight, id, i%256)
					shard := uint32((id + int64(i)) % shards)
					c.Submit(Unit{Shard: shard, Ops: []Op{{Key: key, Value: "v"}}, Done: report})
					if err := <-done; err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			if s := c.Stats(); s.Txns > 0 {
				b.ReportMetric(float64(s.Units)/float64(s.Txns), "units/txn")
			}
		})
	}
}
