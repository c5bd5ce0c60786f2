package server_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/wrapperspb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/chaos"
	"github.com/coordinatord/coordinatord/internal/counter"
	"github.com/coordinatord/coordinatord/internal/server"
)

// newCounterEnv is newEnv with options of the counters (of the coordinator
// and of its replicas).
func newCounterEnv(t *testing.T, opts ...counter.Option) *env {
	t.Helper()
	e := &env{t: t, dataDir: t.TempDir(), counterOpts: opts}
	e.start()
	t.Cleanup(e.stop)
	return e
}

func (e *env) counters() coordinatorv1.CounterServiceClient {
	return coordinatorv1.NewCounterServiceClient(e.conn)
}

func (r *replica) counters() coordinatorv1.CounterServiceClient {
	return coordinatorv1.NewCounterServiceClient(r.conn)
}

func hits(n int64) *wrapperspb.Int64Value { return wrapperspb.Int64(n) }

// counterKeys counts the keys of the counters' subtrees (counters and
// request records).
func (e *env) counterKeys() int64 {
	e.t.Helper()
	var n int64
	for _, p := range []string{"/test/counters/", "/test/counterreqs/"} {
		r, err := e.cli.Get(context.Background(), p, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			e.t.Fatal(err)
		}
		n += r.Count
	}
	return n
}

// Issue 16: 64 callers on two replicas hit one counter at once; exactly
// limit are allowed (the count never exceeds the limit, and no allowed hit
// is lost), and the counter holds exactly that count.
func TestCounterBurstAcrossReplicasIsExact(t *testing.T) {
	e := newCounterEnv(t)
	r := e.replica()
	clients := []coordinatorv1.CounterServiceClient{e.counters(), r.counters()}
	for _, limit := range []int64{1, 25} {
		t.Run(fmt.Sprint("limit ", limit), func(t *testing.T) {
			name := fmt.Sprint("burst/", limit)
			var allowed, refused atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					resp, err := clients[i%2].Hit(ctxT(t, 20*time.Second), &coordinatorv1.HitRequest{Name: name, Limit: limit, Window: dur(time.Minute)})
					switch {
					case err != nil:
						t.Errorf("hit: %v", err)
					case resp.Allowed:
						allowed.Add(1)
						if resp.Count > limit || resp.Remaining != limit-resp.Count {
							t.Errorf("allowed with count %d, remaining %d (limit %d)", resp.Count, resp.Remaining, limit)
						}
					default:
						refused.Add(1)
						if resp.Count != limit || resp.RetryAfter.AsDuration() <= 0 {
							t.Errorf("refused with count %d, retry_after %v", resp.Count, resp.RetryAfter.AsDuration())
						}
					}
				}()
			}
			close(start)
			wg.Wait()
			if allowed.Load() != limit || refused.Load() != 64-limit {
				t.Fatalf("allowed %d, refused %d; want exactly %d allowed", allowed.Load(), refused.Load(), limit)
			}
			g, err := clients[1].Get(ctxT(t, 5*time.Second), &coordinatorv1.GetRequest{Name: name})
			if err != nil || g.Count != limit || !g.Exists {
				t.Fatalf("Get = %v, %v; want count %d", g, err, limit)
			}
		})
	}
}

// Issue 16: the window is anchored at its first hit and a hit after its end
// starts a fresh window (never a stale count).
func TestCounterWindowAnchoredAtFirstHit(t *testing.T) {
	e := newCounterEnv(t)
	cc := e.counters()
	const window = 400 * time.Millisecond
	hit := func() *coordinatorv1.HitResponse {
		t.Helper()
		r, err := cc.Hit(ctxT(t, 5*time.Second), &coordinatorv1.HitRequest{Name: "w", Limit: 2, Window: dur(window)})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	before := time.Now()
	first := hit()
	after := time.Now()
	if end := first.ResetAt.AsTime(); !first.Allowed || first.Count != 1 || end.Before(before.Add(window)) || end.After(after.Add(window)) {
		t.Fatalf("first hit %v: want allowed, count 1, reset_at first hit + %v", first, window)
	}
	if r := hit(); !r.Allowed || r.Count != 2 || !r.ResetAt.AsTime().Equal(first.ResetAt.AsTime()) {
		t.Fatalf("second hit %v: want allowed, count 2, the same window end", r)
	}
	refused := hit()
	if refused.Allowed || refused.Count != 2 || refused.Remaining != 0 || refused.RetryAfter.AsDuration() > window || refused.RetryAfter.AsDuration() <= 0 {
		t.Fatalf("third hit %v: want refused, count 2, 0 < retry_after <= window", refused)
	}
	time.Sleep(time.Until(first.ResetAt.AsTime()) + 10*time.Millisecond)
	fresh := hit()
	if !fresh.Allowed || fresh.Count != 1 || !fresh.ResetAt.AsTime().After(first.ResetAt.AsTime()) {
		t.Fatalf("hit after the window %v: want a fresh window, count 1", fresh)
	}
}

// Issue 16: a retried hit with the same request_id is counted once and
// answers the first answer, also when the retries race; the same id with
// other parameters is REQUEST_ID_REUSED.
func TestCounterRequestIDCountedOnce(t *testing.T) {
	e := newCounterEnv(t)
	r := e.replica()
	clients := []coordinatorv1.CounterServiceClient{e.counters(), r.counters()}
	req := &coordinatorv1.HitRequest{Name: "rid", Limit: 10, Window: dur(time.Minute), RequestId: "0123456789abcdef-1"}
	var replayed atomic.Int64
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := clients[i%2].Hit(ctxT(t, 10*time.Second), req)
			if err != nil || !resp.Allowed || resp.Count != 1 {
				t.Errorf("retry %d: %v, %v; want the first answer (allowed, count 1)", i, resp, err)
				return
			}
			if resp.Replayed {
				replayed.Add(1)
			}
		}()
	}
	wg.Wait()
	if replayed.Load() != 15 {
		t.Fatalf("%d answers replayed, want 15", replayed.Load())
	}
	g, err := clients[0].Get(ctxT(t, 5*time.Second), &coordinatorv1.GetRequest{Name: "rid"})
	if err != nil || g.Count != 1 {
		t.Fatalf("Get = %v, %v: want count 1", g, err)
	}
	other := &coordinatorv1.HitRequest{Name: "rid", Limit: 9, Window: dur(time.Minute), RequestId: req.RequestId}
	_, err = clients[1].Hit(ctxT(t, 5*time.Second), other)
	if code(err) != codes.FailedPrecondition || errorInfo(err).GetReason() != "REQUEST_ID_REUSED" {
		t.Fatalf("same id, other limit: %v; want FAILED_PRECONDITION REQUEST_ID_REUSED", err)
	}
}

// Issue 16: bad input is INVALID_ARGUMENT naming the field, and nothing is
// written.
func TestCounterBadInputWritesNothing(t *testing.T) {
	e := newCounterEnv(t)
	cc := e.counters()
	ok := func() *coordinatorv1.HitRequest {
		return &coordinatorv1.HitRequest{Name: "bad", Limit: 5, Window: dur(time.Second), RequestId: "0123456789abcdef-2"}
	}
	for _, tc := range []struct {
		name  string
		edit  func(r *coordinatorv1.HitRequest)
		field string
	}{
		{"empty name", func(r *coordinatorv1.HitRequest) { r.Name = "" }, "name"},
		{"control character in name", func(r *coordinatorv1.HitRequest) { r.Name = "a\nb" }, "name"},
		{"limit 0", func(r *coordinatorv1.HitRequest) { r.Limit = 0 }, "limit"},
		{"negative limit", func(r *coordinatorv1.HitRequest) { r.Limit = -1 }, "limit"},
		{"window unset", func(r *coordinatorv1.HitRequest) { r.Window = nil }, "window"},
		{"window 0", func(r *coordinatorv1.HitRequest) { r.Window = dur(0) }, "window"},
		{"window below 1ms", func(r *coordinatorv1.HitRequest) { r.Window = dur(time.Microsecond) }, "window"},
		{"negative hits", func(r *coordinatorv1.HitRequest) { r.Hits = hits(-1) }, "hits"},
		{"hits above the limit", func(r *coordinatorv1.HitRequest) { r.Hits = hits(6) }, "hits"},
		{"short request id", func(r *coordinatorv1.HitRequest) { r.RequestId = "short" }, "request_id"},
		{"unknown algorithm", func(r *coordinatorv1.HitRequest) { r.Algorithm = 9 }, "algorithm"},
		{"unknown policy", func(r *coordinatorv1.HitRequest) { r.OnUnavailable = 9 }, "on_unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := ok()
			tc.edit(req)
			_, err := cc.Hit(ctxT(t, 5*time.Second), req)
			if code(err) != codes.InvalidArgument || fieldOf(err) != tc.field || errorInfo(err).GetReason() != "INVALID_FIELD" {
				t.Fatalf("Hit = %v; want INVALID_ARGUMENT naming %s", err, tc.field)
			}
		})
	}
	for _, call := range []func() error{
		func() error { _, err := cc.Get(ctxT(t, 5*time.Second), &coordinatorv1.GetRequest{}); return err },
		func() error { _, err := cc.Reset(ctxT(t, 5*time.Second), &coordinatorv1.ResetRequest{}); return err },
	} {
		if err := call(); code(err) != codes.InvalidArgument || fieldOf(err) != "name" {
			t.Fatalf("Get/Reset without a name = %v; want INVALID_ARGUMENT naming name", err)
		}
	}
	if n := e.counterKeys(); n != 0 {
		t.Fatalf("%d counter keys written by refused requests", n)
	}
}

// Issue 16: counters are authorized by the lock prefixes: an identity hits,
// reads and resets the counters of its own prefixes only; admins all.
func TestCounterAuthorizationByPrefix(t *testing.T) {
	store, _ := authStore(t, testPolicy, "ops", "b.example", "stranger")
	e := newEnvWith(t, []server.Option{authOption(store)})
	as := func(id string) coordinatorv1.CounterServiceClient {
		conn, err := grpc.NewClient(e.addr, plaintext(), grpc.WithPerRPCCredentials(bearer("tok-"+id)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return coordinatorv1.NewCounterServiceClient(conn)
	}
	calls := map[string]func(cc coordinatorv1.CounterServiceClient, name string) error{
		"Hit": func(cc coordinatorv1.CounterServiceClient, name string) error {
			_, err := cc.Hit(ctxT(t, 5*time.Second), &coordinatorv1.HitRequest{Name: name, Limit: 5, Window: dur(time.Minute)})
			return err
		},
		"Get": func(cc coordinatorv1.CounterServiceClient, name string) error {
			_, err := cc.Get(ctxT(t, 5*time.Second), &coordinatorv1.GetRequest{Name: name})
			return err
		},
		"Reset": func(cc coordinatorv1.CounterServiceClient, name string) error {
			_, err := cc.Reset(ctxT(t, 5*time.Second), &coordinatorv1.ResetRequest{Name: name})
			return err
		},
	}
	for _, caller := range []string{"b.example", "ops", "stranger"} {
		cc := as(caller)
		for method, call := range calls {
			for _, name := range []string{"b/c", "a/c"} {
				t.Run(fmt.Sprintf("%s/%s/%s", method, caller, name), func(t *testing.T) {
					allowed := caller == "ops" || caller == "b.example" && name == "b/c"
					err := call(cc, name)
					if allowed && err != nil || !allowed && code(err) != codes.PermissionDenied {
						t.Fatalf("%s of %s by %s = %v (allowed: %v)", method, name, caller, err, allowed)
					}
				})
			}
		}
	}
}

// Issue 16: with etcd unreachable, FAIL_CLOSED (the default) answers
// UNAVAILABLE and FAIL_OPEN answers allowed, uncounted; a server policy of
// FailOpen applies to hits that name none.
func TestCounterUnavailableStorePolicies(t *testing.T) {
	e := newCounterEnv(t, counter.WithStoreTimeout(300*time.Millisecond))
	r := e.replica()
	cc := r.counters()
	req := func(p coordinatorv1.UnavailablePolicy) *coordinatorv1.HitRequest {
		return &coordinatorv1.HitRequest{Name: "down", Limit: 5, Window: dur(time.Minute), OnUnavailable: p}
	}
	if _, err := cc.Hit(ctxT(t, 5*time.Second), req(0)); err != nil {
		t.Fatal(err)
	}
	r.proxy.Set(chaos.Blackhole, 0)
	for _, tc := range []struct {
		name   string
		policy coordinatorv1.UnavailablePolicy
		open   bool
	}{
		{"default is fail closed", coordinatorv1.UnavailablePolicy_UNAVAILABLE_POLICY_UNSPECIFIED, false},
		{"fail closed", coordinatorv1.UnavailablePolicy_UNAVAILABLE_POLICY_FAIL_CLOSED, false},
		{"fail open", coordinatorv1.UnavailablePolicy_UNAVAILABLE_POLICY_FAIL_OPEN, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := cc.Hit(ctxT(t, 10*time.Second), req(tc.policy))
			if tc.open {
				if err != nil || !resp.Allowed || !resp.Uncounted {
					t.Fatalf("Hit = %v, %v; want allowed, uncounted", resp, err)
				}
				return
			}
			if code(err) != codes.Unavailable || errorInfo(err).GetReason() != "ETCD_UNAVAILABLE" {
				t.Fatalf("Hit = %v, %v; want UNAVAILABLE ETCD_UNAVAILABLE", resp, err)
			}
		})
	}
	r.proxy.Set(chaos.Pass, 0)
	g, err := e.counters().Get(ctxT(t, 5*time.Second), &coordinatorv1.GetRequest{Name: "down"})
	if err != nil || g.Count != 1 {
		t.Fatalf("Get after the outage = %v, %v: want count 1 (nothing counted while etcd was away)", g, err)
	}
}

// Issue 16: no immortal key when the caller or its replica dies: the
// counter and its end are created in one transaction on a lease, so a
// replica killed right after a hit leaves a key that goes after the window.
func TestCounterKeyGoneAfterReplicaDies(t *testing.T) {
	e := newCounterEnv(t, counter.WithLeaseSpan(100*time.Millisecond, 500*time.Millisecond), counter.WithRequestRetention(200*time.Millisecond))
	r := e.replica()
	if _, err := r.counters().Hit(ctxT(t, 5*time.Second), &coordinatorv1.HitRequest{Name: "orphan", Limit: 3, Window: dur(300 * time.Millisecond),
		RequestId: "0123456789abcdef-3"}); err != nil {
		t.Fatal(err)
	}
	r.crash()
	if n := e.counterKeys(); n != 2 {
		t.Fatalf("%d counter keys after the hit, want the counter and its request record", n)
	}
	eventually(t, 10*time.Second, "the counter's keys are gone after its window", func() bool { return e.counterKeys() == 0 })
}

// Issue 16: Get reads a counter without counting, Reset deletes it (the next
// hit starts afresh); a token bucket refills; a hit of the other algorithm
// on a live counter is COUNTER_ALGORITHM_MISMATCH.
func TestCounterGetResetAndTokenBucket(t *testing.T) {
	e := newCounterEnv(t)
	cc := e.counters()
	ctx := func() context.Context { return ctxT(t, 5*time.Second) }
	bucket := &coordinatorv1.HitRequest{Name: "tb", Limit: 3, Window: dur(300 * time.Millisecond), Algorithm: coordinatorv1.Algorithm_ALGORITHM_TOKEN_BUCKET}
	for i := range 3 {
		if r, err := cc.Hit(ctx(), bucket); err != nil || !r.Allowed {
			t.Fatalf("bucket hit %d: %v, %v", i, r, err)
		}
	}
	refused, err := cc.Hit(ctx(), bucket)
	if err != nil || refused.Allowed || refused.RetryAfter.AsDuration() <= 0 || refused.RetryAfter.AsDuration() > 100*time.Millisecond {
		t.Fatalf("4th bucket hit: %v, %v; want refused, retry within one token's refill (100ms)", refused, err)
	}
	time.Sleep(refused.RetryAfter.AsDuration())
	if r, err := cc.Hit(ctx(), bucket); err != nil || !r.Allowed {
		t.Fatalf("bucket hit after retry_after: %v, %v", r, err)
	}
	_, err = cc.Hit(ctx(), &coordinatorv1.HitRequest{Name: "tb", Limit: 3, Window: dur(time.Second)})
	if code(err) != codes.FailedPrecondition || errorInfo(err).GetReason() != "COUNTER_ALGORITHM_MISMATCH" {
		t.Fatalf("fixed-window hit on a live bucket: %v", err)
	}

	if _, err := cc.Hit(ctx(), &coordinatorv1.HitRequest{Name: "g", Hits: hits(4), Limit: 10, Window: dur(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	peek, err := cc.Hit(ctx(), &coordinatorv1.HitRequest{Name: "g", Hits: hits(0), Limit: 10, Window: dur(time.Minute)})
	if err != nil || !peek.Allowed || peek.Count != 4 {
		t.Fatalf("peek: %v, %v; want count 4, nothing counted", peek, err)
	}
	g, err := cc.Get(ctx(), &coordinatorv1.GetRequest{Name: "g"})
	if err != nil || !g.Exists || g.Count != 4 || g.Limit != 10 || g.Remaining != 6 ||
		g.Algorithm != coordinatorv1.Algorithm_ALGORITHM_FIXED_WINDOW || g.Window.AsDuration() != time.Minute {
		t.Fatalf("Get = %v, %v", g, err)
	}
	for i, want := range []bool{true, false} {
		if r, err := cc.Reset(ctx(), &coordinatorv1.ResetRequest{Name: "g"}); err != nil || r.Existed != want {
			t.Fatalf("Reset %d = %v, %v; want existed %v", i, r, err, want)
		}
	}
	if g, err := cc.Get(ctx(), &coordinatorv1.GetRequest{Name: "g"}); err != nil || g.Exists || g.Count != 0 {
		t.Fatalf("Get after Reset = %v, %v", g, err)
	}
}
