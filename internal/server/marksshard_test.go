package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
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

// The FenceService's mark calls read the queue core's marks: on the shard
// core they answer UNIMPLEMENTED (NOT_ON_SHARD_CORE) rather than show or
// change the wrong marks. GetEpoch is served.
func TestShardMarkAdminCallsAreNotOnTheShardCore(t *testing.T) {
	e := newShardMarkEnv(t, nil)
	g := e.acquire("l", time.Minute)
	e.expectReason("l", g.Token, "r", current)
	fc, ctx := e.fc(), ctxT(t, 10*time.Second)
	for method, call := range map[string]func() error{
		"GetMark": func() error {
			_, err := fc.GetMark(ctx, &coordinatorv1.GetMarkRequest{Resource: "r"})
			return err
		},
		"ListMarks": func() error {
			_, err := fc.ListMarks(ctx, &coordinatorv1.ListMarksRequest{})
			return err
		},
		"DeleteMark": func() error {
			_, err := fc.DeleteMark(ctx, &coordinatorv1.DeleteMarkRequest{Resource: "r"})
			return err
		},
		"RebindMark": func() error {
			_, err := fc.RebindMark(ctx, &coordinatorv1.RebindMarkRequest{Resource: "r", Lock: "x"})
			return err
		},
	} {
		err := call()
		expectRefusal(t, method, err, codes.Unimplemented, "NOT_ON_SHARD_CORE")
		if m := errorInfo(err).GetMetadata()["method"]; m != method {
			t.Fatalf("%s: metadata method %q", method, m)
		}
	}
	if _, err := fc.GetEpoch(ctx, &coordinatorv1.GetEpochRequest{}); err != nil {
		t.Fatalf("GetEpoch: %v", err)
	}
	if m, _ := e.shardMark("r"); m != g.Token {
		t.Fatalf("mark %d after the refused admin calls, want %d", m, g.Token)
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
