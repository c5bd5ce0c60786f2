package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/coordinator"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/server"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// ValidateToken with a resource on the shard-owner core: the queue core's
// contract (fence_test.go, marks_test.go, semaphore_test.go,
// rwlock_test.go), with the marks kept by the owners of the locks' shards.

// shardMarkShards is the shard count of these tests' coordinators.
const shardMarkShards = 16

// shardMarkKeys is where the shard core keeps the marks of these tests.
const shardMarkKeys = "/test/shards/marks/"

// startShardMarkCoord starts a coordinator on the shard core over etcd,
// serving on loopback once it serves every shard.
func startShardMarkCoord(t *testing.T, etcd *embedetcd.Server, srv []server.Option, opts ...shard.OwnerOption) (*coordinator.Coordinator, string) {
	t.Helper()
	c, err := coordinator.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()},
		coordinator.WithLease(lease.WithKeyPrefix("/test/")), coordinator.WithServer(srv...),
		coordinator.WithShardCore(append([]shard.OwnerOption{shard.WithShards(shardMarkShards), shard.WithLeaseTTL(2 * time.Second)}, opts...)...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.ServeInBackground(lis)
	served := map[uint32]bool{}
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; len(served) < shardMarkShards; i++ {
		n := fmt.Sprintf("probe/%d", i%1000)
		if served[c.Shards().ShardOf(n)] {
			continue
		}
		if _, err := c.Shards().Validate(n, 1); err == nil {
			served[c.Shards().ShardOf(n)] = true
		} else if time.Now().After(deadline) {
			t.Fatalf("the shard of %q is not served 15s after New: %v", n, err)
		} else {
			time.Sleep(10 * time.Millisecond)
		}
	}
	return c, lis.Addr().String()
}

// newShardMarkEnv is an env on the shard core (one member owning every
// shard), with gRPC server options and shard options.
func newShardMarkEnv(t *testing.T, srv []server.Option, opts ...shard.OwnerOption) *env {
	t.Helper()
	e := &env{t: t, dataDir: t.TempDir()}
	var err error
	e.etcd, err = embedetcd.Start(context.Background(), e.dataDir, embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.etcd.Close) // after the coordinator's Close (cleanups run last first)
	e.coord, e.addr = startShardMarkCoord(t, e.etcd, srv, opts...)
	e.cli, e.mgr, e.gs = e.coord.Etcd(), e.coord.Leases(), e.coord.GRPC()
	e.conn = e.dial()
	t.Cleanup(func() { e.conn.Close() })
	e.lc = coordinatorv1.NewLockServiceClient(e.conn)
	e.stopped = true // the cleanups above stop it
	return e
}

// shardMark is the shard core's stored mark of key under shardMarkKeys
// (its token; 0: none), read from etcd.
func (e *env) shardMark(key string) (token int64, lock string) {
	e.t.Helper()
	r, err := e.cli.Get(context.Background(), shardMarkKeys+key)
	if err != nil {
		e.t.Fatal(err)
	}
	if len(r.Kvs) == 0 {
		return 0, ""
	}
	var m struct {
		Token int64  `json:"token"`
		Lock  string `json:"lock"`
	}
	if err := json.Unmarshal(r.Kvs[0].Value, &m); err != nil {
		e.t.Fatal(err)
	}
	return m.Token, m.Lock
}

// countPrefix counts the keys under prefix.
func (e *env) countPrefix(prefix string) int64 {
	e.t.Helper()
	r, err := e.cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Count
}

// expectRefusal asserts an error's code and ErrorInfo reason.
func expectRefusal(t *testing.T, what string, err error, c codes.Code, reason string) {
	t.Helper()
	if code(err) != c || errorInfo(err).GetReason() != reason {
		t.Fatalf("%s: %v (reason %q), want %v %s", what, err, errorInfo(err).GetReason(), c, reason)
	}
}

// The queue core's TestTokenBelowMarkIsFencedForever and
// TestMarkBelongsToTheFirstLockThatRaisedIt on the shard core.
func TestShardMarksFenceTheFormerHolder(t *testing.T) {
	e := newShardMarkEnv(t, nil)
	const lock, res = "jobs/nightly", "bucket/reports"
	a := e.acquire(lock, 30*time.Second)
	e.expectReason(lock, a.Token, res, current)
	e.expectReason(lock, a.Token, res, current) // the same holder writes again
	if m, l := e.shardMark("bucket%2Freports"); m != a.Token || l != lock {
		t.Fatalf("mark after A = %d of %q, want %d of %q", m, l, a.Token, lock)
	}
	if !e.release(lock, a.Token, a.Handle) {
		t.Fatal("release A answered false")
	}
	e.expectReason(lock, a.Token, res, notHeld)
	b := e.acquire(lock, 30*time.Second)
	// B has not written yet: A is only superseded, as on the queue core.
	e.expectReason(lock, a.Token, res, superseded)
	e.expectReason(lock, b.Token, res, current)
	if m, _ := e.shardMark("bucket%2Freports"); m != b.Token {
		t.Fatalf("mark after B = %d, want %d", m, b.Token)
	}
	e.expectReason(lock, a.Token, res, fenced)
	if v := e.validateAt(lock, a.Token, res); v.CurrentToken != b.Token {
		t.Fatalf("current token of a fenced answer = %d, want B's %d", v.CurrentToken, b.Token)
	}
	e.expectReason(lock, b.Token, res, current)
	if !e.release(lock, b.Token, b.Handle) {
		t.Fatal("release B answered false")
	}
	e.expectReason(lock, a.Token, res, fenced) // forever, even once the lock is free
	e.expectReason(lock, a.Token, "", notHeld) // without the resource: just not held

	// Another lock's newer token is refused on the resource, and changes nothing.
	intruder := e.acquire("other-job", 30*time.Second)
	_, err := e.lc.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: "other-job", Token: intruder.Token, Resource: res})
	expectRefusal(t, "another lock's token", err, codes.FailedPrecondition, "MARK_OWNED_BY_OTHER_LOCK")
	if info := errorInfo(err); info.GetMetadata()["lock"] != lock || info.GetMetadata()["resource"] != res {
		t.Fatalf("ErrorInfo metadata %v, want lock %q resource %q", info.GetMetadata(), lock, res)
	}
	if m, _ := e.shardMark("bucket%2Freports"); m != b.Token {
		t.Fatalf("mark = %d after the refused intruder, want %d", m, b.Token)
	}
	e.expectReason("other-job", intruder.Token, "db/other", current)

	// Bad input is refused, naming the field.
	_, err = e.lc.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: lock, Token: b.Token, Resource: "bad\x00"})
	if code(err) != codes.InvalidArgument || fieldOf(err) != "resource" {
		t.Fatalf("a malformed resource: %v (field %q)", err, fieldOf(err))
	}
}

// The mark is in etcd: a new coordinator (the first one closed, its shards
// handed over) refuses the former holder's token as fenced, and writes
// nothing for the current holder's.
func TestShardMarkSurvivesATakeover(t *testing.T) {
	e := newShardMarkEnv(t, nil)
	const lock, res = "l", "r"
	a := e.acquire(lock, time.Minute)
	e.expectReason(lock, a.Token, res, current)
	e.release(lock, a.Token, a.Handle)
	b := e.acquire(lock, time.Minute)
	e.expectReason(lock, b.Token, res, current)
	e.coord.Close()

	c2, addr := startShardMarkCoord(t, e.etcd, nil)
	e.cli = c2.Etcd()
	conn, err := grpc.NewClient(addr, plaintext())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.lc = coordinatorv1.NewLockServiceClient(conn)
	rev := e.rev()
	e.expectReason(lock, a.Token, res, fenced)
	e.expectReason(lock, b.Token, res, current)
	if e.rev() != rev {
		t.Fatal("validations at the mark wrote to etcd after the takeover")
	}
}

// Two locks in different shards race, from many goroutines, to create one
// resource's mark: one lock owns it, every validation of the other answers
// MARK_OWNED_BY_OTHER_LOCK, and etcd holds one mark.
func TestShardMarkCreationRaceAcrossShards(t *testing.T) {
	e := newShardMarkEnv(t, nil)
	var names []string
	for i := 0; len(names) < 2; i++ {
		n := fmt.Sprintf("racer-%d", i)
		if len(names) == 0 || shard.ShardOf(n, shardMarkShards) != shard.ShardOf(names[0], shardMarkShards) {
			names = append(names, n)
		}
	}
	tokens := map[string]int64{}
	for _, n := range names {
		tokens[n] = e.acquire(n, time.Minute).Token
	}
	const per = 20
	var (
		wg             sync.WaitGroup
		mu             sync.Mutex
		valid, refused = map[string]int{}, map[string]int{}
		start          = make(chan struct{})
	)
	for i := range 2 * per {
		n := names[i%2]
		wg.Go(func() {
			<-start
			v, err := e.lc.ValidateToken(ctxT(t, 20*time.Second), &coordinatorv1.ValidateTokenRequest{Name: n, Token: tokens[n], Resource: "contested"})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && v.Valid:
				valid[n]++
			case code(err) == codes.FailedPrecondition && errorInfo(err).GetReason() == "MARK_OWNED_BY_OTHER_LOCK":
				refused[n]++
			default:
				t.Errorf("validate %s: %v, %v", n, v, err)
			}
		})
	}
	close(start)
	wg.Wait()
	m, owner := e.shardMark("contested")
	other := names[0]
	if owner == other {
		other = names[1]
	}
	if m != tokens[owner] || valid[owner] != per || refused[other] != per || valid[other] != 0 || refused[owner] != 0 {
		t.Fatalf("mark %d of %q: valid %v, refused %v", m, owner, valid, refused)
	}
	if n := e.countPrefix(shardMarkKeys); n != 1 {
		t.Fatalf("%d marks in etcd, want 1", n)
	}
}

// A reader's token is refused SHARED_HOLDER_CANNOT_FENCE; a semaphore's
// holders each raise the mark of their own slot (the queue core's
// TestRWLockMarks and TestSemaphoreSlotMarks).
func TestShardMarksOfReadersAndSemaphores(t *testing.T) {
	e := newShardMarkEnv(t, nil)
	ctx := func() context.Context { return ctxT(t, 20*time.Second) }
	w, err := e.lc.Acquire(ctx(), rwReq("rw", false, 0))
	if err != nil {
		t.Fatal(err)
	}
	e.expectReason("rw", w.Token, "db", current)
	e.release("rw", w.Token, w.Handle)
	r, err := e.lc.Acquire(ctx(), rwReq("rw", true, 0))
	if err != nil {
		t.Fatal(err)
	}
	e.expectReason("rw", r.Token, "", current) // valid without a resource
	rev := e.rev()
	_, err = e.lc.ValidateToken(ctx(), &coordinatorv1.ValidateTokenRequest{Name: "rw", Token: r.Token, Resource: "db"})
	expectRefusal(t, "a reader with a resource", err, codes.FailedPrecondition, "SHARED_HOLDER_CANNOT_FENCE")
	if e.rev() != rev {
		t.Fatal("a reader's validation wrote")
	}
	if m, _ := e.shardMark("db"); m != w.Token {
		t.Fatalf("mark = %d, want the writer's %d", m, w.Token)
	}

	paused, err := e.lc.Acquire(ctx(), semReq("sem", 2, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	other, err := e.lc.Acquire(ctx(), semReq("sem", 2, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []*coordinatorv1.AcquireResponse{paused, other} {
		e.expectReason("sem", g.Token, "db2", current)
		if m, l := e.shardMark(fmt.Sprintf("db2/slot/%d", g.Slot)); m != g.Token || l != "sem" {
			t.Fatalf("slot %d's mark = %d of %q, want %d", g.Slot, m, l, g.Token)
		}
	}
	// The paused holder stops renewing: its slot passes on.
	next, err := e.lc.Acquire(ctx(), semReq("sem", 2, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if next.Slot != paused.Slot || next.Token <= paused.Token {
		t.Fatalf("next holder slot %d token %d; the paused one had slot %d token %d", next.Slot, next.Token, paused.Slot, paused.Token)
	}
	e.expectReason("sem", next.Token, "db2", current)
	if v := e.validateAt("sem", paused.Token, "db2"); v.Valid {
		t.Fatalf("the paused former holder of slot %d: %v", paused.Slot, v)
	}
	e.expectReason("sem", other.Token, "db2", current) // its slot's mark is its own
	if n := e.countPrefix(shardMarkKeys + "db2/"); n != 2 {
		t.Fatalf("%d slot marks of db2, want 2", n)
	}
	if m, _ := e.shardMark("db2"); m != 0 {
		t.Fatalf("the semaphore raised the resource's own mark to %d", m)
	}
}

// Each identity creates at most the cap's marks: the third new resource
// answers RESOURCE_EXHAUSTED (TOO_MANY_MARKS) and nothing is written; its
// marks still validate, and another identity has its own cap.
func TestShardMarkCapPerIdentity(t *testing.T) {
	store, _ := authStore(t, marksPolicy, "ops", "team-a", "team-b")
	e := newShardMarkEnv(t, []server.Option{authOption(store)}, shard.WithMarkLimit(2))
	for _, w := range []struct{ id, lock, res string }{{"team-a", "a/w", "res-a/"}, {"team-b", "b/w", "res-b/"}} {
		lc := e.dialWith(plaintext(), grpc.WithPerRPCCredentials(bearer("tok-"+w.id)))
		g, err := lc.Acquire(ctxT(t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: w.lock, Ttl: dur(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		validate := func(res string) (*coordinatorv1.ValidateTokenResponse, error) {
			return lc.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: w.lock, Token: g.Token, Resource: res})
		}
		for i := range 2 {
			if v, err := validate(fmt.Sprintf("%s%d", w.res, i)); err != nil || !v.Valid {
				t.Fatalf("%s's mark %d: %v, %v", w.id, i, v, err)
			}
		}
		rev := e.rev()
		_, err = validate(w.res + "2")
		expectRefusal(t, w.id+"'s third mark", err, codes.ResourceExhausted, "TOO_MANY_MARKS")
		if l := errorInfo(err).GetMetadata()["limit"]; l != "2" {
			t.Fatalf("limit metadata %q, want 2", l)
		}
		if e.rev() != rev {
			t.Fatalf("%s's refused mark wrote to etcd", w.id)
		}
		if v, err := validate(w.res + "0"); err != nil || !v.Valid {
			t.Fatalf("%s's existing mark at the cap: %v, %v", w.id, v, err)
		}
	}
	if n := e.countPrefix(shardMarkKeys); n != 4 {
		t.Fatalf("%d marks in etcd, want 4", n)
	}
}

// GetEpoch is served on the shard core, as the marks' admin calls are
// (marksadmin_shard_test.go).
func TestShardServesGetEpoch(t *testing.T) {
	e := newShardMarkEnv(t, nil)
	r, err := e.fc().GetEpoch(ctxT(t, 10*time.Second), &coordinatorv1.GetEpochRequest{})
	if err != nil || r.GetEpoch() != 0 {
		t.Fatalf("GetEpoch = %v, %v; want epoch 0", r, err)
	}
}

// A validation at the mark (token == mark, mark cached) writes nothing: no
// new etcd revision over many of them.
func TestShardMarkCachedValidationWritesNothing(t *testing.T) {
	e := newShardMarkEnv(t, nil)
	g := e.acquire("c", time.Minute)
	e.expectReason("c", g.Token, "res", current)
	rev := e.rev()
	for range 50 {
		e.expectReason("c", g.Token, "res", current)
	}
	if r := e.rev(); r != rev {
		t.Fatalf("50 validations at the mark moved etcd from revision %d to %d", rev, r)
	}
}

// shardMarksUnder lists the shard core's marks of one resource (its escaped
// name esc): the resource's own key and its per-slot keys, by key (under
// shardMarkKeys) with the lock each is bound to and its token.
func (e *env) shardMarksUnder(esc string) map[string]struct {
	Lock  string
	Token int64
} {
	e.t.Helper()
	r, err := e.cli.Get(context.Background(), shardMarkKeys+esc, clientv3.WithPrefix())
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]struct {
		Lock  string
		Token int64
	}{}
	for _, kv := range r.Kvs {
		k := strings.TrimPrefix(string(kv.Key), shardMarkKeys)
		if k != esc && !strings.HasPrefix(k, esc+"/slot/") {
			continue // another resource's, whose name esc prefixes
		}
		var m struct {
			Lock  string `json:"lock"`
			Token int64  `json:"token"`
		}
		if err := json.Unmarshal(kv.Value, &m); err != nil {
			e.t.Fatal(err)
		}
		out[k] = struct {
			Lock  string
			Token int64
		}{m.Lock, m.Token}
	}
	return out
}

// shardMarkIdentities is an env on the shard core with marksPolicy's two
// identities: team-a (locks a/...) and team-b (locks b/...), who share the
// resources shared/...; it returns a client of each.
func shardMarkIdentities(t *testing.T) (e *env, a, b coordinatorv1.LockServiceClient) {
	t.Helper()
	store, _ := authStore(t, marksPolicy, "ops", "team-a", "team-b")
	e = newShardMarkEnv(t, []server.Option{authOption(store)})
	as := func(id string) coordinatorv1.LockServiceClient {
		return e.dialWith(plaintext(), grpc.WithPerRPCCredentials(bearer("tok-"+id)))
	}
	return e, as("team-a"), as("team-b")
}

// validateAs is ValidateToken with a resource by the client lc.
func validateAs(t *testing.T, lc coordinatorv1.LockServiceClient, name string, token int64, res string) (*coordinatorv1.ValidateTokenResponse, error) {
	t.Helper()
	return lc.ValidateToken(ctxT(t, 20*time.Second), &coordinatorv1.ValidateTokenRequest{Name: name, Token: token, Resource: res})
}

// acquireAs is an Acquire by the client lc that fails the test on an error.
func acquireAs(t *testing.T, lc coordinatorv1.LockServiceClient, req *coordinatorv1.AcquireRequest) *coordinatorv1.AcquireResponse {
	t.Helper()
	g, err := lc.Acquire(ctxT(t, 20*time.Second), req)
	if err != nil {
		t.Fatalf("acquire %q: %v", req.GetName(), err)
	}
	return g
}

// A semaphore cannot get around a mutex's mark: identity A's mutex fences
// a resource; identity B's semaphore's holders validating with it are
// refused MARK_OWNED_BY_OTHER_LOCK (valid false), and nothing is written
// under the resource's marks (no per-slot mark of B's).
func TestShardMarkSemaphoreRefusedOnAMutexResource(t *testing.T) {
	e, a, b := shardMarkIdentities(t)
	const lockA, semB, res, esc = "a/lockA", "b/semB", "shared/r1", "shared%2Fr1"
	ga := acquireAs(t, a, &coordinatorv1.AcquireRequest{Name: lockA, Ttl: dur(time.Minute)})
	if v, err := validateAs(t, a, lockA, ga.Token, res); err != nil || !v.Valid {
		t.Fatalf("A's mutex fences %q: %v, %v", res, v, err)
	}
	holders := []*coordinatorv1.AcquireResponse{acquireAs(t, b, semReq(semB, 2, time.Minute)), acquireAs(t, b, semReq(semB, 2, time.Minute))}
	rev := e.rev()
	for _, g := range holders {
		for range 2 { // the second one decides from what the first left cached
			v, err := validateAs(t, b, semB, g.Token, res)
			expectRefusal(t, fmt.Sprintf("B's semaphore holder (slot %d) on A's resource", g.Slot), err, codes.FailedPrecondition, "MARK_OWNED_BY_OTHER_LOCK")
			if v.GetValid() {
				t.Fatalf("B's semaphore holder answered valid: %v", v)
			}
			if l := errorInfo(err).GetMetadata()["lock"]; l != lockA {
				t.Fatalf("refusal names lock %q, want %q", l, lockA)
			}
		}
	}
	if n := e.countPrefix(shardMarkKeys + esc + "/slot/"); n != 0 {
		t.Fatalf("%d per-slot marks of %q written for B's semaphore, want none", n, res)
	}
	if m, l := e.shardMark(esc); m != ga.Token || l != lockA {
		t.Fatalf("mark of %q = %d of %q, want A's %d of %q", res, m, l, ga.Token, lockA)
	}
	if r := e.rev(); r != rev {
		t.Fatalf("B's refused validations wrote: revision %d -> %d", rev, r)
	}
	if v, err := validateAs(t, a, lockA, ga.Token, res); err != nil || !v.Valid {
		t.Fatalf("A after B's refusals: %v, %v", v, err)
	}
}

// The reverse: a semaphore's holder fences a resource first (a per-slot
// mark); another identity's mutex validating with it is refused
// MARK_OWNED_BY_OTHER_LOCK and writes nothing.
func TestShardMarkMutexRefusedOnASemaphoreResource(t *testing.T) {
	e, a, b := shardMarkIdentities(t)
	const lockA, semB, res, esc = "a/lockA", "b/semB", "shared/r2", "shared%2Fr2"
	gb := acquireAs(t, b, semReq(semB, 2, time.Minute))
	if v, err := validateAs(t, b, semB, gb.Token, res); err != nil || !v.Valid {
		t.Fatalf("B's semaphore holder fences %q: %v, %v", res, v, err)
	}
	before := e.shardMarksUnder(esc)
	if m, ok := before[fmt.Sprintf("%s/slot/%d", esc, gb.Slot)]; !ok || m.Lock != semB || m.Token != gb.Token {
		t.Fatalf("marks of %q after B: %v, want slot %d's at %d of %q", res, before, gb.Slot, gb.Token, semB)
	}
	ga := acquireAs(t, a, &coordinatorv1.AcquireRequest{Name: lockA, Ttl: dur(time.Minute)})
	rev := e.rev()
	for range 2 {
		v, err := validateAs(t, a, lockA, ga.Token, res)
		expectRefusal(t, "A's mutex on B's semaphore's resource", err, codes.FailedPrecondition, "MARK_OWNED_BY_OTHER_LOCK")
		if v.GetValid() {
			t.Fatalf("A's mutex answered valid: %v", v)
		}
		if l := errorInfo(err).GetMetadata()["lock"]; l != semB {
			t.Fatalf("refusal names lock %q, want %q", l, semB)
		}
	}
	if after := e.shardMarksUnder(esc); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("marks of %q changed by A's refused validations: %v -> %v", res, before, after)
	}
	if r := e.rev(); r != rev {
		t.Fatalf("A's refused validations wrote: revision %d -> %d", rev, r)
	}
	if v, err := validateAs(t, b, semB, gb.Token, res); err != nil || !v.Valid {
		t.Fatalf("B after A's refusals: %v, %v", v, err)
	}
}

// A semaphore's holders in slots 0 and 1 both fence one resource: one
// binding (the resource's own key, bound to the semaphore, token 0) and
// two per-slot marks; the next holder of slot 0 raises its slot's mark and
// the former holder of slot 0 is refused (superseded).
func TestShardMarkSemaphoreSlotsShareOneBinding(t *testing.T) {
	e := newShardMarkEnv(t, nil)
	const sem, res = "sem", "db3"
	g0, g1 := e.acquireSem(sem, 2), e.acquireSem(sem, 2)
	if g0.Slot != 0 || g1.Slot != 1 {
		t.Fatalf("slots %d, %d, want 0, 1", g0.Slot, g1.Slot)
	}
	for _, g := range []*coordinatorv1.AcquireResponse{g0, g1} {
		e.expectReason(sem, g.Token, res, current)
	}
	marks := e.shardMarksUnder(res)
	if len(marks) != 3 || marks[res].Lock != sem || marks[res].Token != 0 ||
		marks[res+"/slot/0"].Lock != sem || marks[res+"/slot/0"].Token != g0.Token ||
		marks[res+"/slot/1"].Lock != sem || marks[res+"/slot/1"].Token != g1.Token {
		t.Fatalf("marks of %q: %v, want a binding to %q (token 0) and slot 0 at %d, slot 1 at %d", res, marks, sem, g0.Token, g1.Token)
	}
	if !e.release(sem, g0.Token, g0.Handle) {
		t.Fatal("release of slot 0's holder answered false")
	}
	next := e.acquireSem(sem, 2)
	if next.Slot != 0 {
		t.Fatalf("next holder in slot %d, want 0", next.Slot)
	}
	e.expectReason(sem, next.Token, res, current)
	e.expectReason(sem, g1.Token, res, current)
	// The former holder of slot 0 holds nothing, so its slot is unknown: it
	// is judged against the resource's own key, the binding (token 0), and
	// refused as superseded, as before the binding existed.
	e.expectReason(sem, g0.Token, res, superseded)
	if m := e.shardMarksUnder(res); len(m) != 3 || m[res+"/slot/0"].Token != next.Token || m[res].Token != 0 {
		t.Fatalf("marks of %q: %v", res, m)
	}
}

// acquireSem acquires a holder of the semaphore name of limit n.
func (e *env) acquireSem(name string, n int32) *coordinatorv1.AcquireResponse {
	e.t.Helper()
	g, err := e.lc.Acquire(ctxT(e.t, 20*time.Second), semReq(name, n, time.Minute))
	if err != nil {
		e.t.Fatalf("acquire semaphore %q: %v", name, err)
	}
	return g
}

// A mutex and a semaphore (two identities, locks in different shards)
// race from many goroutines to create one resource's marks: exactly one
// lock owns everything under the resource's marks; every validation of the
// owner is valid, every one of the other refused MARK_OWNED_BY_OTHER_LOCK.
func TestShardMarkMutexAndSemaphoreRace(t *testing.T) {
	e, a, b := shardMarkIdentities(t)
	const res, esc = "shared/race", "shared%2Frace"
	lockA, semB := "a/lockA", ""
	for i := 0; semB == ""; i++ {
		if n := fmt.Sprintf("b/semB-%d", i); shard.ShardOf(n, shardMarkShards) != shard.ShardOf(lockA, shardMarkShards) {
			semB = n
		}
	}
	ga := acquireAs(t, a, &coordinatorv1.AcquireRequest{Name: lockA, Ttl: dur(time.Minute)})
	gb0, gb1 := acquireAs(t, b, semReq(semB, 2, time.Minute)), acquireAs(t, b, semReq(semB, 2, time.Minute))
	type holder struct {
		lc    coordinatorv1.LockServiceClient
		lock  string
		token int64
	}
	holders := []holder{{a, lockA, ga.Token}, {b, semB, gb0.Token}, {b, semB, gb1.Token}, {a, lockA, ga.Token}}
	const per = 12
	var (
		wg             sync.WaitGroup
		mu             sync.Mutex
		valid, refused = map[string]int{}, map[string]int{}
		start          = make(chan struct{})
	)
	for i := range len(holders) * per {
		h := holders[i%len(holders)]
		wg.Go(func() {
			<-start
			v, err := validateAs(t, h.lc, h.lock, h.token, res)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && v.Valid:
				valid[h.lock]++
			case code(err) == codes.FailedPrecondition && errorInfo(err).GetReason() == "MARK_OWNED_BY_OTHER_LOCK":
				refused[h.lock]++
			default:
				t.Errorf("validate %s token %d: %v, %v", h.lock, h.token, v, err)
			}
		})
	}
	close(start)
	wg.Wait()
	marks := e.shardMarksUnder(esc)
	owner, ok := marks[esc]
	if !ok {
		t.Fatalf("no mark at the resource's own key: %v", marks)
	}
	other := lockA
	if owner.Lock == lockA {
		other = semB
	}
	for k, m := range marks {
		if m.Lock != owner.Lock {
			t.Fatalf("two locks own marks of %q: %s of %q, and %q owns the resource's key (%v)", res, k, m.Lock, owner.Lock, marks)
		}
	}
	t.Logf("%q owns %q: marks %v", owner.Lock, res, marks)
	want := 2 * per
	if valid[owner.Lock] != want || refused[other] != want || valid[other] != 0 || refused[owner.Lock] != 0 {
		t.Fatalf("owner %q: valid %v, refused %v (marks %v)", owner.Lock, valid, refused, marks)
	}
	switch owner.Lock {
	case lockA:
		if len(marks) != 1 || owner.Token != ga.Token {
			t.Fatalf("the mutex owns %q: marks %v, want its one mark at %d", res, marks, ga.Token)
		}
	case semB:
		if len(marks) != 3 || owner.Token != 0 || marks[fmt.Sprintf("%s/slot/%d", esc, gb0.Slot)].Token != gb0.Token ||
			marks[fmt.Sprintf("%s/slot/%d", esc, gb1.Slot)].Token != gb1.Token {
			t.Fatalf("the semaphore owns %q: marks %v, want a binding and its two slots' marks", res, marks)
		}
	}
}
