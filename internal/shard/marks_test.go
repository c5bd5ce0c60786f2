package shard

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/fence"
	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/locktable"
)

// markPrefix is where the marks of the owners of these tests live.
const markPrefix = "/t/shards/marks/"

// check is a validation of name's token against resource, by identity id,
// in epoch 0.
func check(name string, token int64, resource, id string) MarkCheck {
	return MarkCheck{Name: name, Token: token, Resource: resource, Identity: id}
}

// validateRes is ValidateResource that fails the test on an error.
func validateRes(t *testing.T, o *Owner, c MarkCheck) fence.Verdict {
	t.Helper()
	v, err := o.ValidateResource(ctxT(t), c)
	if err != nil {
		t.Fatalf("validate %q token %d at %q: %v", c.Name, c.Token, c.Resource, err)
	}
	return v
}

// expectMark asserts a verdict's validity, reason and mark.
func expectMark(t *testing.T, o *Owner, c MarkCheck, reason fence.Reason, mark int64) {
	t.Helper()
	v := validateRes(t, o, c)
	if v.Valid != (reason == fence.Current) || v.Reason != reason || v.Mark != mark {
		t.Fatalf("validate %q token %d at %q = %+v, want %v with mark %d", c.Name, c.Token, c.Resource, v, reason, mark)
	}
}

// storedMark reads a mark from etcd (ok false: none).
func storedMark(t *testing.T, cli *clientv3.Client, key string) (markRecord, bool) {
	t.Helper()
	r, err := cli.Get(ctxT(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) == 0 {
		return markRecord{}, false
	}
	var m markRecord
	if err := json.Unmarshal(r.Kvs[0].Value, &m); err != nil {
		t.Fatalf("mark %q: %v", key, err)
	}
	return m, true
}

// countKeys counts the keys under prefix.
func countKeys(t *testing.T, cli *clientv3.Client, prefix string) int64 {
	t.Helper()
	r, err := cli.Get(ctxT(t), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return r.Count
}

// A holder's token raises the mark; after a hand-over the old token is
// superseded until the new holder validates, then fenced forever, even
// once the lock is free (the queue core's TestTokenBelowMarkIsFencedForever).
func TestMarkFencesTheFormerHolder(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	const lock, res = "jobs/nightly", "bucket/reports"
	a, err := o.Acquire(ctx, acq(lock, 5*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	expectMark(t, o, check(lock, a.Token, res, ""), fence.Current, a.Token)
	expectMark(t, o, check(lock, a.Token, res, ""), fence.Current, a.Token) // the same holder writes again
	if m, ok := storedMark(t, cli, markPrefix+"bucket%2Freports"); !ok || m.Token != a.Token || m.Lock != lock {
		t.Fatalf("stored mark = %+v (%v), want lock %q token %d", m, ok, lock, a.Token)
	}
	if ok, err := o.Release(ctx, lock, a.Token, a.Handle, "alice"); err != nil || !ok {
		t.Fatalf("release = %v, %v", ok, err)
	}
	// Nobody holds and A is at the mark: not held, not fenced.
	expectMark(t, o, check(lock, a.Token, res, ""), fence.NotHeld, a.Token)
	b, err := o.Acquire(ctx, acq(lock, 5*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	// B has not written yet: A is only superseded.
	expectMark(t, o, check(lock, a.Token, res, ""), fence.Superseded, a.Token)
	expectMark(t, o, check(lock, b.Token, res, ""), fence.Current, b.Token)
	if m, _ := storedMark(t, cli, markPrefix+"bucket%2Freports"); m.Token != b.Token {
		t.Fatalf("stored mark %d after B, want %d", m.Token, b.Token)
	}
	expectMark(t, o, check(lock, a.Token, res, ""), fence.Fenced, b.Token)
	if ok, err := o.Release(ctx, lock, b.Token, b.Handle, "alice"); err != nil || !ok {
		t.Fatalf("release B = %v, %v", ok, err)
	}
	expectMark(t, o, check(lock, a.Token, res, ""), fence.Fenced, b.Token)
	expectMark(t, o, check(lock, b.Token, res, ""), fence.NotHeld, b.Token)
	// Without a resource, A is just not held.
	if v, err := o.Validate(lock, a.Token); err != nil || v.Valid || v.Reason != locktable.NotHeldNow {
		t.Fatalf("validate without a resource = %+v, %v", v, err)
	}
	// Another lock is refused on the resource, whatever its token.
	c, err := o.Acquire(ctx, acq("other", 5*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	_, err = o.ValidateResource(ctx, check("other", c.Token, res, ""))
	var mo *fence.MarkOwnedError
	if !errors.As(err, &mo) || mo.Owner != lock || mo.Lock != "other" {
		t.Fatalf("another lock on the resource: %v, want a MarkOwnedError naming %q", err, lock)
	}
	// In a later epoch, a token of an earlier one holds nothing.
	expectMark(t, o, MarkCheck{Name: lock, Token: b.Token, Epoch: 1, Resource: res}, fence.NotHeld, b.Token)
}

// The mark is in etcd, not only in the owner's memory: a new owner (after
// a graceful hand-over) refuses the former holder as fenced and lets the
// current one through without writing.
func TestMarkSurvivesATakeover(t *testing.T) {
	_, cli := ownerEtcd(t)
	o1 := startOwner(t, cli)
	ctx := ctxT(t)
	const lock, res = "l", "r"
	a, err := o1.Acquire(ctx, acq(lock, 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	expectMark(t, o1, check(lock, a.Token, res, ""), fence.Current, a.Token)
	if ok, err := o1.Release(ctx, lock, a.Token, a.Handle, "alice"); err != nil || !ok {
		t.Fatalf("release = %v, %v", ok, err)
	}
	b, err := o1.Acquire(ctx, acq(lock, 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	expectMark(t, o1, check(lock, b.Token, res, ""), fence.Current, b.Token)
	o1.Close(ctx)

	o2 := startOwner(t, cli)
	rev := etcdRev(t, cli)
	expectMark(t, o2, check(lock, a.Token, res, ""), fence.Fenced, b.Token)
	expectMark(t, o2, check(lock, b.Token, res, ""), fence.Current, b.Token)
	if r := etcdRev(t, cli); r != rev {
		t.Fatalf("validations at the mark wrote: revision %d -> %d", rev, r)
	}
}

func etcdRev(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	r, err := cli.Get(ctxT(t), "/nothing")
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

// distinctCreators are two identities whose mark creations are not
// serialised with each other (markCreators stripes by identity hash).
func distinctCreators() (string, string) {
	slot := func(id string) uint32 {
		h := fnv.New32a()
		h.Write([]byte(keyspace.IdentityHash(id)))
		return h.Sum32() % 64
	}
	for i := 1; ; i++ {
		if b := fmt.Sprintf("id-%d", i); slot(b) != slot("id-0") {
			return "id-0", b
		}
	}
}

// Two locks in different shards race to create one resource's mark: both
// creating Txns are sent together (the hook holds each until both are
// ready); exactly one lock owns the resource, the other is refused
// MarkOwnedError, and etcd holds one mark, counted once.
func TestMarkCreationRaceAcrossShards(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	n1, n2 := shardName(o, 0), shardName(o, 1)
	g1, err := o.Acquire(ctx, acq(n1, 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	g2, err := o.Acquire(ctx, acq(n2, 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	id1, id2 := distinctCreators()
	var ready sync.WaitGroup
	ready.Add(2)
	testHookBeforeCreate = func() { ready.Done(); ready.Wait() }
	defer func() { testHookBeforeCreate = nil }()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, c := range []MarkCheck{check(n1, g1.Token, "r", id1), check(n2, g2.Token, "r", id2)} {
		wg.Go(func() { _, errs[i] = o.ValidateResource(ctx, c) })
	}
	wg.Wait()
	testHookBeforeCreate = nil
	m, ok := storedMark(t, cli, markPrefix+"r")
	if !ok {
		t.Fatal("no mark in etcd")
	}
	winner, loser := 0, 1
	if m.Lock == n2 {
		winner, loser = 1, 0
	}
	var mo *fence.MarkOwnedError
	if errs[winner] != nil || !errors.As(errs[loser], &mo) || mo.Owner != m.Lock {
		t.Fatalf("race: %v; mark bound to %q", errs, m.Lock)
	}
	if n := countKeys(t, cli, markPrefix); n != 1 {
		t.Fatalf("%d marks in etcd, want 1", n)
	}
	counts, err := cli.Get(ctx, "/t/shards/markcounts/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(counts.Kvs) != 1 || string(counts.Kvs[0].Value) != "1" {
		t.Fatalf("mark counts %v, want one identity with 1", counts.Kvs)
	}
}

// Many validations of two locks in different shards, by many identities,
// against one new resource at once: one lock owns it, every validation of
// the other is refused, and etcd holds one mark.
func TestMarkCreationStormAcrossShards(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	names := []string{shardName(o, 2), shardName(o, 5)}
	tokens := map[string]int64{}
	for _, n := range names {
		g, err := o.Acquire(ctx, acq(n, 30*time.Second, 0))
		if err != nil {
			t.Fatal(err)
		}
		tokens[n] = g.Token
	}
	const per = 24
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		valid = map[string]int{}
		owned = map[string]int{}
	)
	for i := range 2 * per {
		n := names[i%2]
		wg.Go(func() {
			v, err := o.ValidateResource(ctx, check(n, tokens[n], "storm", fmt.Sprintf("id-%d", i)))
			mu.Lock()
			defer mu.Unlock()
			var mo *fence.MarkOwnedError
			switch {
			case err == nil && v.Valid && v.Mark == tokens[n]:
				valid[n]++
			case errors.As(err, &mo):
				owned[n]++
			default:
				t.Errorf("validate %s: %+v, %v", n, v, err)
			}
		})
	}
	wg.Wait()
	m, ok := storedMark(t, cli, markPrefix+"storm")
	if !ok {
		t.Fatal("no mark")
	}
	other := names[0]
	if m.Lock == other {
		other = names[1]
	}
	if valid[m.Lock] != per || owned[other] != per || valid[other] != 0 || owned[m.Lock] != 0 {
		t.Fatalf("owner %q: valid %v, refused %v", m.Lock, valid, owned)
	}
	if n := countKeys(t, cli, markPrefix); n != 1 {
		t.Fatalf("%d marks in etcd, want 1", n)
	}
	if n := countKeys(t, cli, "/t/shards/markcounts/"); n != 1 {
		t.Fatalf("%d identities counted, want the creator only", n)
	}
}

// A reader's token cannot raise a mark (SharedHolderError, nothing
// written); a writer's raises the resource's own; a semaphore's holders
// each raise the mark of their slot (under one binding, the resource's own
// key at token 0), and the new holder of a slot fences nobody on the other
// slot.
func TestMarkReadersAndSemaphoreSlots(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	w, err := o.Acquire(ctx, acq("rw", 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	expectMark(t, o, check("rw", w.Token, "db", ""), fence.Current, w.Token)
	if ok, err := o.Release(ctx, "rw", w.Token, w.Handle, "alice"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	r, err := o.Acquire(ctx, locktable.Acquire{Name: "rw", Caller: "alice", TTL: 30 * time.Second, Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	rev := etcdRev(t, cli)
	_, err = o.ValidateResource(ctx, check("rw", r.Token, "db", ""))
	var sh *fence.SharedHolderError
	if !errors.As(err, &sh) || sh.Name != "rw" || sh.Resource != "db" {
		t.Fatalf("reader with a resource: %v, want a SharedHolderError", err)
	}
	if _, err := o.ValidateResource(ctx, check("rw", r.Token, "fresh", "")); !errors.As(err, &sh) {
		t.Fatalf("reader with a new resource: %v, want a SharedHolderError", err)
	}
	if etcdRev(t, cli) != rev {
		t.Fatal("a reader's validation wrote")
	}

	sem := func(ttl time.Duration) *locktable.Grant {
		g, err := o.Acquire(ctx, locktable.Acquire{Name: "sem", Caller: "alice", TTL: ttl, Limit: 2, Wait: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	first, second := sem(30*time.Second), sem(30*time.Second)
	for _, g := range []*locktable.Grant{first, second} {
		expectMark(t, o, check("sem", g.Token, "db2", ""), fence.Current, g.Token)
		m, ok := storedMark(t, cli, fmt.Sprintf("%sdb2/slot/%d", markPrefix, g.Slot))
		if !ok || m.Token != g.Token || !m.PerSlot || m.Slot != g.Slot || m.Lock != "sem" {
			t.Fatalf("slot %d mark = %+v (%v)", g.Slot, m, ok)
		}
	}
	// The resource's own key is the semaphore's binding, raised by no token.
	if m, ok := storedMark(t, cli, markPrefix+"db2"); !ok || m.Lock != "sem" || m.Token != 0 || !m.Binding || m.PerSlot {
		t.Fatalf("the resource's own key = %+v (%v), want a binding to %q at token 0", m, ok, "sem")
	}
	// The first slot passes on: its new holder raises its slot's mark; the
	// other slot's older holder is still valid, the former holder is not.
	if ok, err := o.Release(ctx, "sem", first.Token, first.Handle, "alice"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	next := sem(30 * time.Second)
	if next.Slot != first.Slot {
		t.Fatalf("next holder has slot %d, want %d", next.Slot, first.Slot)
	}
	expectMark(t, o, check("sem", next.Token, "db2", ""), fence.Current, next.Token)
	expectMark(t, o, check("sem", second.Token, "db2", ""), fence.Current, second.Token)
	if v := validateRes(t, o, check("sem", first.Token, "db2", "")); v.Valid {
		t.Fatalf("the former holder of slot %d: %+v", first.Slot, v)
	}
	if n := countKeys(t, cli, markPrefix+"db2/"); n != 2 {
		t.Fatalf("%d slot marks, want 2", n)
	}
}

// An identity creates at most WithMarkLimit marks: the next new resource is
// refused TooManyMarksError and nothing is written; its existing marks
// still validate, and another identity still creates.
func TestMarkLimitPerIdentity(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli, WithMarkLimit(2))
	ctx := ctxT(t)
	g, err := o.Acquire(ctx, acq("writer", 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"bob", ""} {
		for i := range 2 {
			expectMark(t, o, check("writer", g.Token, fmt.Sprintf("%s-res-%d", id, i), id), fence.Current, g.Token)
		}
		rev := etcdRev(t, cli)
		_, err := o.ValidateResource(ctx, check("writer", g.Token, id+"-res-2", id))
		var tm *fence.TooManyMarksError
		if !errors.As(err, &tm) || tm.Limit != 2 || tm.Count != 2 {
			t.Fatalf("identity %q's third mark: %v, want a TooManyMarksError at 2", id, err)
		}
		if r := etcdRev(t, cli); r != rev {
			t.Fatalf("a refused creation wrote: revision %d -> %d", rev, r)
		}
		expectMark(t, o, check("writer", g.Token, id+"-res-0", id), fence.Current, g.Token)
	}
	if n := countKeys(t, cli, markPrefix); n != 4 {
		t.Fatalf("%d marks, want 4", n)
	}
}

// A validation at a cached mark (token == mark) sends nothing to etcd: no
// request touches a mark or a mark count, and the revision stays.
func TestMarkCachedValidationSendsNothing(t *testing.T) {
	e, _ := ownerEtcd(t)
	var markReqs atomic.Int64
	cli := countingClient(t, e, &markReqs)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	g, err := o.Acquire(ctx, acq("cached", 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	expectMark(t, o, check("cached", g.Token, "res", ""), fence.Current, g.Token)
	if markReqs.Load() == 0 {
		t.Fatal("the counter saw no mark request: it counts nothing")
	}
	before, rev := markReqs.Load(), etcdRev(t, cli)
	for range 100 {
		expectMark(t, o, check("cached", g.Token, "res", ""), fence.Current, g.Token)
	}
	// A stale token below the mark is fenced from the cache too.
	if ok, err := o.Release(ctx, "cached", g.Token, g.Handle, "alice"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	g2, err := o.Acquire(ctx, acq("cached", 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	expectMark(t, o, check("cached", g2.Token, "res", ""), fence.Current, g2.Token) // one raise
	raised, rev2 := markReqs.Load(), etcdRev(t, cli)
	for range 100 {
		expectMark(t, o, check("cached", g.Token, "res", ""), fence.Fenced, g2.Token)
		expectMark(t, o, check("cached", g2.Token, "res", ""), fence.Current, g2.Token)
	}
	if n := markReqs.Load(); n != raised || raised != before+1 {
		t.Fatalf("mark requests: %d before, %d after one raise, %d after 200 cached validations", before, raised, n)
	}
	if rev2 <= rev || etcdRev(t, cli) != rev2 {
		t.Fatalf("revisions %d, %d, %d: cached validations wrote", rev, rev2, etcdRev(t, cli))
	}
}

// countingClient is a client of e that counts (in n) the requests that
// name a mark or a mark count.
func countingClient(t *testing.T, e *embedetcd.Server, n *atomic.Int64) *clientv3.Client {
	t.Helper()
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if m, ok := req.(proto.Message); ok && strings.HasPrefix(method, "/etcdserverpb.KV/") {
			if b, err := proto.Marshal(m); err == nil && bytes.Contains(b, []byte("/t/shards/mark")) {
				n.Add(1)
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// A raise whose commit fails breaks and drops the shard as any unit's
// failure does (the table reloads, the cache is cleared) and answers the
// error, never valid.
func TestMarkRaiseFailureDropsTheShard(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	g, err := o.Acquire(ctx, acq("f", 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	expectMark(t, o, check("f", g.Token, "res", ""), fence.Current, g.Token)
	if ok, err := o.Release(ctx, "f", g.Token, g.Handle, "alice"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	g2, err := o.Acquire(ctx, acq("f", 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	s := o.shards[o.ShardOf("f")]
	s.broken.Store(true) // the guard refuses the shard's next unit: the raise fails
	drops := o.drops.Load()
	_, err = o.ValidateResource(ctx, check("f", g2.Token, "res", ""))
	if !errors.Is(err, ErrOwnershipLost) {
		t.Fatalf("raise on a broken shard: %v, want ErrOwnershipLost", err)
	}
	if o.drops.Load() != drops+1 {
		t.Fatal("the failed raise did not drop the shard")
	}
	s.mu.Lock()
	cached := len(s.marks)
	s.mu.Unlock()
	if cached != 0 {
		t.Fatalf("%d marks cached after the drop", cached)
	}
	waitServing(t, o)
	expectMark(t, o, check("f", g2.Token, "res", ""), fence.Current, g2.Token)
	expectMark(t, o, check("f", g.Token, "res", ""), fence.Fenced, g2.Token)
}

// semHolders acquires n holders of the semaphore name of limit n.
func semHolders(t *testing.T, o *Owner, name string, n int32) []*locktable.Grant {
	t.Helper()
	gs := make([]*locktable.Grant, n)
	for i := range gs {
		g, err := o.Acquire(ctxT(t), locktable.Acquire{Name: name, Caller: "alice", TTL: 30 * time.Second, Limit: n, Wait: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		gs[i] = g
	}
	return gs
}

// One lock per resource across its own mark and its per-slot marks: a
// semaphore cannot validate on a resource a mutex fences, nor a mutex on
// one a semaphore fences; each refusal is a MarkOwnedError naming the
// owner, and writes nothing.
func TestMarkOneLockAcrossPlainAndSlotMarks(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	mutex, err := o.Acquire(ctx, acq("mutex", 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	sem := semHolders(t, o, "sem", 2)
	expectMark(t, o, check("mutex", mutex.Token, "by-mutex", "a"), fence.Current, mutex.Token)
	expectMark(t, o, check("sem", sem[0].Token, "by-sem", "b"), fence.Current, sem[0].Token)
	rev := etcdRev(t, cli)
	for range 2 { // from a read, then from the cache
		for _, g := range sem {
			_, err := o.ValidateResource(ctx, check("sem", g.Token, "by-mutex", "b"))
			var mo *fence.MarkOwnedError
			if !errors.As(err, &mo) || mo.Owner != "mutex" || mo.Lock != "sem" {
				t.Fatalf("semaphore slot %d on the mutex's resource: %v, want a MarkOwnedError naming %q", g.Slot, err, "mutex")
			}
		}
		_, err := o.ValidateResource(ctx, check("mutex", mutex.Token, "by-sem", "a"))
		var mo *fence.MarkOwnedError
		if !errors.As(err, &mo) || mo.Owner != "sem" || mo.Lock != "mutex" {
			t.Fatalf("mutex on the semaphore's resource: %v, want a MarkOwnedError naming %q", err, "sem")
		}
	}
	if r := etcdRev(t, cli); r != rev {
		t.Fatalf("refused validations wrote: revision %d -> %d", rev, r)
	}
	if n := countKeys(t, cli, markPrefix+"by-mutex"); n != 1 {
		t.Fatalf("%d keys under the mutex's resource, want its mark only", n)
	}
	if n := countKeys(t, cli, markPrefix+"by-sem"); n != 2 {
		t.Fatalf("%d keys under the semaphore's resource, want its binding and one slot's mark", n)
	}
	// A binding and its first per-slot mark are one mark to the cap.
	for id, want := range map[string]string{"a": "1", "b": "1"} {
		r, err := cli.Get(ctx, "/t/shards/markcounts/"+keyspace.IdentityHash(id))
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != want {
			t.Fatalf("identity %q's mark count %v, want %s", id, r.Kvs, want)
		}
	}
}

// A mutex and a semaphore in different shards create one resource's marks
// at once (the hook sends the creating Txns together): one lock owns every
// key under the resource, the other is refused, and the winner is counted
// once.
func TestMarkCreationRaceOfAMutexAndASemaphore(t *testing.T) {
	for round := range 4 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			_, cli := ownerEtcd(t)
			o := startOwner(t, cli)
			ctx := ctxT(t)
			n1, n2 := shardName(o, 0), shardName(o, 1)
			g1, err := o.Acquire(ctx, acq(n1, 30*time.Second, 0))
			if err != nil {
				t.Fatal(err)
			}
			g2 := semHolders(t, o, n2, 2)[1]
			id1, id2 := distinctCreators()
			var ready sync.WaitGroup
			ready.Add(2)
			testHookBeforeCreate = func() { ready.Done(); ready.Wait() }
			defer func() { testHookBeforeCreate = nil }()
			errs := make([]error, 2)
			checks := []MarkCheck{check(n1, g1.Token, "r", id1), check(n2, g2.Token, "r", id2)}
			if round%2 == 1 {
				checks[0], checks[1] = checks[1], checks[0]
			}
			var wg sync.WaitGroup
			for i, c := range checks {
				wg.Go(func() { _, errs[i] = o.ValidateResource(ctx, c) })
			}
			wg.Wait()
			testHookBeforeCreate = nil
			m, ok := storedMark(t, cli, markPrefix+"r")
			if !ok {
				t.Fatal("no mark at the resource's own key")
			}
			r, err := cli.Get(ctx, markPrefix+"r", clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			for _, kv := range r.Kvs {
				var km markRecord
				if err := json.Unmarshal(kv.Value, &km); err != nil || km.Lock != m.Lock {
					t.Fatalf("%s is bound to %q, the resource to %q (%v)", kv.Key, km.Lock, m.Lock, err)
				}
			}
			winner, loser := 0, 1
			if m.Lock != checks[0].Name {
				winner, loser = 1, 0
			}
			var mo *fence.MarkOwnedError
			if errs[winner] != nil || !errors.As(errs[loser], &mo) || mo.Owner != m.Lock {
				t.Fatalf("race: %v; resource bound to %q", errs, m.Lock)
			}
			wantKeys := int64(1)
			if m.Lock == n2 {
				wantKeys = 2 // the binding and the slot's mark
				if !m.Binding || m.Token != 0 {
					t.Fatalf("the semaphore's binding = %+v", m)
				}
			}
			if n := int64(len(r.Kvs)); n != wantKeys {
				t.Fatalf("%d keys under the resource, want %d", n, wantKeys)
			}
			counts, err := cli.Get(ctx, "/t/shards/markcounts/", clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			if len(counts.Kvs) != 1 || string(counts.Kvs[0].Value) != "1" {
				t.Fatalf("mark counts %v, want the winner's identity with 1", counts.Kvs)
			}
		})
	}
}

// A lock may be a semaphore, then a mutex once free: its mutex holder
// raises the resource's own key, the semaphore's binding, and a former
// semaphore holder is then fenced by it; the lock's next semaphore keeps
// its slot marks under that key.
func TestMarkSemaphoreThenMutexOfOneLock(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	sem := semHolders(t, o, "l", 2)
	for _, g := range sem {
		expectMark(t, o, check("l", g.Token, "res", ""), fence.Current, g.Token)
	}
	for _, g := range sem {
		if ok, err := o.Release(ctx, "l", g.Token, g.Handle, "alice"); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	// Gone from the table, its slot unknown: judged by the binding (token 0).
	expectMark(t, o, check("l", sem[0].Token, "res", ""), fence.NotHeld, 0)
	mu, err := o.Acquire(ctx, acq("l", 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	expectMark(t, o, check("l", mu.Token, "res", ""), fence.Current, mu.Token)
	if m, ok := storedMark(t, cli, markPrefix+"res"); !ok || m.Lock != "l" || m.Token != mu.Token || m.Binding {
		t.Fatalf("the resource's own key after the mutex = %+v (%v), want a mark at %d", m, ok, mu.Token)
	}
	expectMark(t, o, check("l", sem[1].Token, "res", ""), fence.Fenced, mu.Token)
	if ok, err := o.Release(ctx, "l", mu.Token, mu.Handle, "alice"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	again := semHolders(t, o, "l", 2)
	for _, g := range again {
		expectMark(t, o, check("l", g.Token, "res", ""), fence.Current, g.Token)
	}
	if n := countKeys(t, cli, markPrefix+"res"); n != 3 {
		t.Fatalf("%d keys under the resource, want its mark and two slots' marks", n)
	}
	if m, _ := storedMark(t, cli, markPrefix+"res"); m.Token != mu.Token {
		t.Fatalf("the resource's own mark %d after the semaphore again, want %d", m.Token, mu.Token)
	}
}

// A validation of a semaphore holder at its cached slot mark sends nothing
// to etcd: its binding and its slot's mark are both cached.
func TestMarkCachedSlotValidationSendsNothing(t *testing.T) {
	e, _ := ownerEtcd(t)
	var markReqs atomic.Int64
	cli := countingClient(t, e, &markReqs)
	o := startOwner(t, cli)
	sem := semHolders(t, o, "cached-sem", 2)
	for _, g := range sem {
		expectMark(t, o, check("cached-sem", g.Token, "res", ""), fence.Current, g.Token)
	}
	before, rev := markReqs.Load(), etcdRev(t, cli)
	for range 100 {
		for _, g := range sem {
			expectMark(t, o, check("cached-sem", g.Token, "res", ""), fence.Current, g.Token)
		}
	}
	if n := markReqs.Load(); n != before {
		t.Fatalf("mark requests: %d before, %d after 200 cached slot validations", before, n)
	}
	if r := etcdRev(t, cli); r != rev {
		t.Fatalf("cached slot validations wrote: revision %d -> %d", rev, r)
	}
	// After a takeover of the cache (a new table), a slot validation reads
	// the binding and its mark in one request.
	s := o.shards[o.ShardOf("cached-sem")]
	s.mu.Lock()
	s.marks = nil
	s.mu.Unlock()
	before = markReqs.Load()
	expectMark(t, o, check("cached-sem", sem[0].Token, "res", ""), fence.Current, sem[0].Token)
	if n := markReqs.Load(); n != before+1 {
		t.Fatalf("%d mark requests for an uncached slot validation at its mark, want 1", n-before)
	}
}
