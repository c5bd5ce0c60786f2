package server_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

func TestMutualExclusion(t *testing.T) {
	e := newEnv(t)
	const clients, rounds = 16, 5
	var (
		counter  int // guarded by the lock under test only
		inside   atomic.Int32
		overlaps atomic.Int32
		wg       sync.WaitGroup
		lastTok  atomic.Int64
		badOrder atomic.Int32
	)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				r, err := e.lc.Acquire(ctxT(t, 30*time.Second), &coordinatorv1.AcquireRequest{Name: "counter", Ttl: dur(10 * time.Second), Owner: fmt.Sprint("c", c)})
				if err != nil {
					t.Errorf("acquire: %v", err)
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				if prev := lastTok.Swap(r.Token); r.Token <= prev {
					badOrder.Add(1)
				}
				v := counter
				time.Sleep(time.Millisecond) // widen the race window
				counter = v + 1
				inside.Add(-1)
				if !e.release("counter", r.Token, r.Handle) {
					t.Errorf("release of a live grant answered false")
				}
			}
		}()
	}
	wg.Wait()
	if counter != clients*rounds {
		t.Errorf("counter = %d, want %d", counter, clients*rounds)
	}
	if n := overlaps.Load(); n != 0 {
		t.Errorf("%d times two holders were inside at once", n)
	}
	if n := badOrder.Load(); n != 0 {
		t.Errorf("%d grants had a token not above the previous holder's", n)
	}
	if n := e.queueKeys("counter"); n != 0 {
		t.Errorf("%d queue keys left behind", n)
	}
}

func TestTokensIncreaseAcrossRestart(t *testing.T) {
	e := newEnv(t)
	var last int64
	for i := range 3 {
		r := e.acquire("job", 5*time.Second)
		if r.Token <= last {
			t.Fatalf("grant %d: token %d not above %d", i, r.Token, last)
		}
		last = r.Token
		if !e.release("job", r.Token, r.Handle) {
			t.Fatal("release answered false")
		}
	}
	// A holder that is still live when everything restarts keeps its grant;
	// the next holder's token is still greater.
	held := e.acquire("job", 30*time.Second)
	if held.Token <= last {
		t.Fatalf("token %d not above %d", held.Token, last)
	}
	e.restart()
	if v := e.validate("job", held.Token); !v.Valid {
		t.Fatalf("grant lost across a restart: %v", v)
	}
	if !e.release("job", held.Token, held.Handle) {
		t.Fatal("release after restart answered false")
	}
	after := e.acquire("job", 5*time.Second)
	if after.Token <= held.Token {
		t.Fatalf("token after restart %d not above %d", after.Token, held.Token)
	}
}

func TestFIFO(t *testing.T) {
	e := newEnv(t)
	holder := e.acquire("fifo", 30*time.Second)
	const n = 6
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := e.lc.Acquire(ctxT(t, 30*time.Second), &coordinatorv1.AcquireRequest{Name: "fifo", Ttl: dur(10 * time.Second), Owner: fmt.Sprint("w", i)})
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			e.release("fifo", r.Token, r.Handle)
		}()
		// Arrival order: wait until waiter i is queued before starting i+1.
		eventually(t, 10*time.Second, fmt.Sprintf("waiter %d queued", i), func() bool {
			return len(e.describe("fifo").Waiters) == i+1
		})
	}
	d := e.describe("fifo")
	for i, w := range d.Waiters {
		if w.Owner != fmt.Sprint("w", i) {
			t.Fatalf("Describe lists waiter %d as %q, want w%d", i, w.Owner, i)
		}
	}
	if d.Holder.GetToken() != holder.Token {
		t.Fatalf("Describe holder token %d, want %d", d.Holder.GetToken(), holder.Token)
	}
	e.release("fifo", holder.Token, holder.Handle)
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("grant order %v, want 0..%d", order, n-1)
		}
	}
}

func TestTryLockAndBoundedWait(t *testing.T) {
	e := newEnv(t)
	holder := e.acquire("busy", 30*time.Second)

	start := time.Now()
	_, err := e.tryAcquire("busy")
	tryTook := time.Since(start)
	if code(err) != codes.Aborted {
		t.Fatalf("try-lock on a held lock: %v, want ABORTED", err)
	}
	if got := holderToken(t, err); got != holder.Token {
		t.Fatalf("ABORTED carries holder token %d, want %d", got, holder.Token)
	}

	const wait = 300 * time.Millisecond
	start = time.Now()
	_, err = e.lc.Acquire(ctxT(t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: "busy", Wait: dur(wait)})
	waitTook := time.Since(start)
	if code(err) != codes.Aborted {
		t.Fatalf("bounded wait on a held lock: %v, want ABORTED", err)
	}
	if waitTook < wait {
		t.Fatalf("bounded wait answered after %v, before the %v wait", waitTook, wait)
	}
	if !raceEnabled { // timings are meaningless under the race detector
		if tryTook > time.Second {
			t.Errorf("try-lock took %v, want it prompt", tryTook)
		}
		if waitTook > wait+time.Second {
			t.Errorf("bounded wait of %v answered after %v", wait, waitTook)
		}
	}
	// Neither left a queue entry behind.
	if n := e.queueKeys("busy"); n != 1 {
		t.Fatalf("%d queue keys, want only the holder's", n)
	}
	// The caller's own deadline, shorter than wait, is DEADLINE_EXCEEDED.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = e.lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "busy", Wait: dur(time.Minute)})
	if code(err) != codes.DeadlineExceeded {
		t.Fatalf("deadline before wait: %v, want DEADLINE_EXCEEDED", err)
	}
}

func TestGiveUpLeavesNothing(t *testing.T) {
	cases := []struct {
		name   string
		giveUp func(e *env) // returns once the waiter has given up
	}{
		{"wait elapsed", func(e *env) {
			_, err := e.lc.Acquire(ctxT(e.t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: "x", Wait: dur(100 * time.Millisecond)})
			if code(err) != codes.Aborted {
				e.t.Fatalf("got %v, want ABORTED", err)
			}
		}},
		{"deadline", func(e *env) {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			_, err := e.lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "x"})
			if code(err) != codes.DeadlineExceeded {
				e.t.Fatalf("got %v, want DEADLINE_EXCEEDED", err)
			}
		}},
		{"cancel", func(e *env) {
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				eventually(e.t, 10*time.Second, "waiter queued", func() bool { return e.queueKeys("x") == 2 })
				cancel()
			}()
			_, err := e.lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "x"})
			if code(err) != codes.Canceled {
				e.t.Fatalf("got %v, want CANCELLED", err)
			}
		}},
		{"disconnect", func(e *env) {
			conn := e.dial()
			done := make(chan error, 1)
			go func() {
				_, err := coordinatorv1.NewLockServiceClient(conn).Acquire(context.Background(), &coordinatorv1.AcquireRequest{Name: "x"})
				done <- err
			}()
			eventually(e.t, 10*time.Second, "waiter queued", func() bool { return e.queueKeys("x") == 2 })
			conn.Close()
			e.t.Logf("disconnected waiter: %v", <-done)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			holder := e.acquire("x", 30*time.Second)
			tc.giveUp(e)
			eventually(t, 5*time.Second, "the waiter's queue key is removed", func() bool { return e.queueKeys("x") == 1 })
			if w := e.describe("x").Waiters; len(w) != 0 {
				t.Fatalf("Describe still lists %d waiters", len(w))
			}
			e.release("x", holder.Token, holder.Handle)
			if _, err := e.tryAcquire("x"); err != nil {
				t.Fatalf("the next contender is blocked after the waiter gave up: %v", err)
			}
		})
	}
}

func TestExpiryHandsOver(t *testing.T) {
	e := newEnv(t)
	const ttl = time.Second
	old := e.acquire("exp", ttl)
	granted := time.Now()
	r, err := e.lc.Acquire(ctxT(t, 20*time.Second), &coordinatorv1.AcquireRequest{Name: "exp", Ttl: dur(10 * time.Second)})
	if err != nil {
		t.Fatalf("waiter: %v", err)
	}
	took := time.Since(granted)
	t.Logf("next waiter granted %v after the unrenewed grant", took)
	if !raceEnabled && took > ttl+time.Second {
		t.Errorf("next waiter granted after %v, want within TTL + 1s", took)
	}
	if r.Token <= old.Token {
		t.Fatalf("token %d not above the expired holder's %d", r.Token, old.Token)
	}
	v := e.validate("exp", old.Token)
	if v.Valid || v.Reason != coordinatorv1.ValidateTokenResponse_REASON_SUPERSEDED || v.CurrentToken != r.Token {
		t.Fatalf("old token validates as %v, want superseded by %d", v, r.Token)
	}
	// The expired holder can neither renew nor release.
	_, err = e.lc.KeepAlive(ctxT(t, 5*time.Second), &coordinatorv1.KeepAliveRequest{Name: "exp", Token: old.Token, Handle: old.Handle})
	if code(err) != codes.NotFound {
		t.Fatalf("KeepAlive after expiry: %v, want NOT_FOUND", err)
	}
	if e.release("exp", old.Token, old.Handle) {
		t.Fatal("release after expiry answered true")
	}
	if v := e.validate("exp", r.Token); !v.Valid {
		t.Fatalf("the new holder's token is not valid after the stale release: %v", v)
	}
}

func TestKeepAliveKeepsTheLock(t *testing.T) {
	e := newEnv(t)
	const ttl = 2 * time.Second // renewals every ttl/5: robust on a slow -race run
	g := e.acquire("kept", ttl)
	if g.Ttl.AsDuration() != ttl {
		t.Fatalf("granted TTL %v, want %v", g.Ttl.AsDuration(), ttl)
	}
	if time.Until(g.ExpiresAt.AsTime()) > ttl {
		t.Fatalf("expires_at %v is more than the TTL away", g.ExpiresAt.AsTime())
	}
	for range 12 { // 4.8s: more than twice the TTL
		time.Sleep(ttl / 5)
		r, err := e.lc.KeepAlive(ctxT(t, 5*time.Second), &coordinatorv1.KeepAliveRequest{Name: "kept", Token: g.Token, Handle: g.Handle})
		if err != nil {
			t.Fatalf("KeepAlive: %v", err)
		}
		if r.Ttl.AsDuration() != ttl || !r.ExpiresAt.AsTime().After(g.ExpiresAt.AsTime()) {
			t.Fatalf("KeepAlive answered ttl %v expires_at %v", r.Ttl.AsDuration(), r.ExpiresAt.AsTime())
		}
	}
	if v := e.validate("kept", g.Token); !v.Valid {
		t.Fatalf("renewed grant not valid: %v", v)
	}
}

func TestReleaseHandsOverAtOnce(t *testing.T) {
	e := newEnv(t)
	h := e.acquire("rel", 30*time.Second)
	got := make(chan time.Time, 1)
	go func() {
		r, err := e.lc.Acquire(ctxT(t, 20*time.Second), &coordinatorv1.AcquireRequest{Name: "rel", Ttl: dur(10 * time.Second)})
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		_ = r
		got <- time.Now()
	}()
	eventually(t, 10*time.Second, "waiter queued", func() bool { return e.queueKeys("rel") == 2 })
	released := time.Now()
	if !e.release("rel", h.Token, h.Handle) {
		t.Fatal("release answered false")
	}
	handoff := (<-got).Sub(released)
	t.Logf("hand-off after release took %v", handoff)
	// A TTL-bound hand-off would take 30s; "at once" is far below that.
	if handoff > 10*time.Second {
		t.Fatalf("hand-off after release took %v", handoff)
	}
	if e.release("rel", h.Token, h.Handle) {
		t.Fatal("a second release answered true")
	}
}

func TestWrongHandleOrStaleTokenChangesNothing(t *testing.T) {
	e := newEnv(t)
	g := e.acquire("own", 30*time.Second)
	other := e.acquire("own-other", 30*time.Second)
	dot, otherDot := strings.LastIndexByte(g.Handle, '.'), strings.LastIndexByte(other.Handle, '.')
	forged := g.Handle[:dot] + other.Handle[otherDot:] // right grant (or lease), wrong secret
	cases := []struct {
		name   string
		token  int64
		handle string
	}{
		{"wrong secret", g.Token, forged},
		{"another grant's handle", g.Token, other.Handle},
		{"stale token", g.Token - 1, g.Handle},
		{"future token", g.Token + 1000, g.Handle},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := e.rev()
			if e.release("own", tc.token, tc.handle) {
				t.Fatal("release answered true")
			}
			_, err := e.lc.KeepAlive(ctxT(t, 5*time.Second), &coordinatorv1.KeepAliveRequest{Name: "own", Token: tc.token, Handle: tc.handle})
			if code(err) != codes.NotFound {
				t.Fatalf("KeepAlive: %v, want NOT_FOUND", err)
			}
			if after := e.rev(); after != before {
				t.Fatalf("etcd revision moved from %d to %d", before, after)
			}
			if v := e.validate("own", g.Token); !v.Valid {
				t.Fatalf("the real grant is no longer valid: %v", v)
			}
		})
	}
}

func TestValidateReasons(t *testing.T) {
	e := newEnv(t)
	const (
		current    = coordinatorv1.ValidateTokenResponse_REASON_CURRENT
		superseded = coordinatorv1.ValidateTokenResponse_REASON_SUPERSEDED
		notHeld    = coordinatorv1.ValidateTokenResponse_REASON_NOT_HELD
	)
	check := func(what string, token int64, valid bool, reason coordinatorv1.ValidateTokenResponse_Reason, cur int64) {
		t.Helper()
		v := e.validate("v", token)
		if v.Valid != valid || v.Reason != reason || v.CurrentToken != cur {
			t.Fatalf("%s: validate(%d) = %v, want valid=%v reason=%v current=%d", what, token, v, valid, reason, cur)
		}
	}
	check("never issued, lock free", 12345, false, notHeld, 0)
	a := e.acquire("v", 30*time.Second)
	check("holder", a.Token, true, current, a.Token)
	check("never issued, above the holder", a.Token+100, false, notHeld, a.Token)
	e.release("v", a.Token, a.Handle)
	check("released, lock free", a.Token, false, notHeld, 0)
	b := e.acquire("v", 30*time.Second)
	check("released, newer holder", a.Token, false, superseded, b.Token)
	check("new holder", b.Token, true, current, b.Token)
}

// A cleanly released grant's lease is recycled for the next grant with the
// same TTL; the old handle must stay useless against the new grant.
func TestRecycledLeaseKeepsOldHandlesUseless(t *testing.T) {
	e := newEnv(t)
	old := e.acquire("rc", 20*time.Second)
	if !e.release("rc", old.Token, old.Handle) {
		t.Fatal("release answered false")
	}
	for _, name := range []string{"rc", "rc-other"} {
		n := e.acquire(name, 20*time.Second)
		if n.LeaseId != old.LeaseId {
			t.Logf("lease not recycled for %q (%d vs %d)", name, n.LeaseId, old.LeaseId)
		}
		if e.release(name, old.Token, old.Handle) || e.release(name, n.Token, old.Handle) {
			t.Fatalf("the old handle released the new grant of %q", name)
		}
		_, err := e.lc.KeepAlive(ctxT(t, 5*time.Second), &coordinatorv1.KeepAliveRequest{Name: name, Token: n.Token, Handle: old.Handle})
		if code(err) != codes.NotFound {
			t.Fatalf("KeepAlive of the new grant with the old handle: %v, want NOT_FOUND", err)
		}
		if v := e.validate(name, n.Token); !v.Valid {
			t.Fatalf("new grant of %q invalid: %v", name, v)
		}
		if !e.release(name, n.Token, n.Handle) {
			t.Fatal("release of the new grant answered false")
		}
		old = n
	}
	// The pool is used: the second acquisition reused the first lease.
	a := e.acquire("rc2", 7*time.Second)
	e.release("rc2", a.Token, a.Handle)
	b := e.acquire("rc2", 7*time.Second)
	if b.LeaseId != a.LeaseId {
		t.Fatalf("lease %d not recycled (got %d)", a.LeaseId, b.LeaseId)
	}
	if b.Ttl.AsDuration() != 7*time.Second || time.Until(b.ExpiresAt.AsTime()) < 6*time.Second {
		t.Fatalf("recycled lease not refreshed: ttl %v, expires in %v", b.Ttl.AsDuration(), time.Until(b.ExpiresAt.AsTime()))
	}
}
