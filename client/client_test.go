package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/client"
)

func dial(t *testing.T, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.Dial(coordinatorAddr, append([]client.Option{client.WithDialOptions(faults.dialOptions()...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func isDone(l *client.Lock) bool {
	select {
	case <-l.Done():
		return true
	default:
		return false
	}
}

// waitDone waits up to d for Done to close.
func waitDone(t *testing.T, l *client.Lock, d time.Duration) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(d):
		t.Fatalf("Done not closed after %v (err %v)", d, l.Err())
	}
}

func TestAcquireTryAcquireRelease(t *testing.T) {
	c1, c2 := dial(t), dial(t)
	before := time.Now()
	l, err := c1.Acquire(ctxT(t, 10*time.Second), "t/basic", client.WithTTL(2*time.Second), client.WithOwner("test"))
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() <= 0 || l.Name() != "t/basic" || l.TTL() != 2*time.Second {
		t.Fatalf("lock = token %d name %q ttl %v", l.Token(), l.Name(), l.TTL())
	}
	// safe_until = send time + TTL - max(TTL/10, 500ms) = send time + 1.5s.
	if su := l.SafeUntil(); su.Before(before.Add(1500*time.Millisecond)) || su.After(time.Now().Add(1500*time.Millisecond)) {
		t.Fatalf("SafeUntil %v not within [%v, %v]", su, before.Add(1500*time.Millisecond), time.Now().Add(1500*time.Millisecond))
	}
	if isDone(l) || l.Err() != nil {
		t.Fatalf("fresh lock done=%v err=%v", isDone(l), l.Err())
	}

	_, err = c2.TryAcquire(ctxT(t, 10*time.Second), "t/basic")
	var held *client.HeldError
	if !errors.Is(err, client.ErrLockHeld) || !errors.As(err, &held) || held.HolderToken != l.Token() || status.Code(err) != codes.Aborted {
		t.Fatalf("TryAcquire of a held lock: %v, want HeldError with holder %d", err, l.Token())
	}
	_, err = c2.Acquire(ctxT(t, 10*time.Second), "t/basic", client.WithWait(100*time.Millisecond))
	if !errors.Is(err, client.ErrLockHeld) {
		t.Fatalf("Acquire with a short wait on a held lock: %v, want ErrLockHeld", err)
	}

	if err := l.Release(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if !isDone(l) || !errors.Is(l.Err(), client.ErrReleased) {
		t.Fatalf("after Release done=%v err=%v", isDone(l), l.Err())
	}
	if err := l.Release(ctxT(t, 10*time.Second)); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	l2, err := c2.TryAcquire(ctxT(t, 10*time.Second), "t/basic")
	if err != nil {
		t.Fatalf("TryAcquire after Release: %v", err)
	}
	if l2.Token() <= l.Token() {
		t.Fatalf("token %d after %d", l2.Token(), l.Token())
	}
	_ = l2.Release(ctxT(t, 10*time.Second))
}

func TestHeartbeatsKeepTheLock(t *testing.T) {
	c := dial(t)
	// A 2s TTL leaves a 1.5s safe window renewed every ~500ms; under the
	// race detector (slower, no timing assertions) a wider one.
	ttl := 2 * time.Second
	if raceEnabled {
		ttl = 5 * time.Second
	}
	l, err := c.Acquire(ctxT(t, 10*time.Second), "t/heartbeat", client.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	// Three TTLs: without heartbeats the lease would be gone.
	deadline := time.Now().Add(3 * ttl)
	for time.Now().Before(deadline) {
		if isDone(l) {
			t.Fatalf("lock lost while heartbeating: %v", l.Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
	v, err := c.ValidateToken(ctxT(t, 10*time.Second), "t/heartbeat", l.Token(), "")
	if err != nil || !v.Valid {
		t.Fatalf("validate after 3 TTLs: %+v, %v", v, err)
	}
	if time.Until(l.SafeUntil()) <= 0 {
		t.Fatal("SafeUntil not moved forward by renewals")
	}
	_ = l.Release(ctxT(t, 10*time.Second))
}

// The coordinator cannot be reached for renewals: Done closes with
// ErrExpired by safe_until, before the lease ends in etcd.
func TestDoneClosesAtSafeUntilWithoutRenewal(t *testing.T) {
	c := dial(t)
	l, err := c.Acquire(ctxT(t, 10*time.Second), "nokeepalive/x", client.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	su := l.SafeUntil()
	waitDone(t, l, 5*time.Second)
	if !errors.Is(l.Err(), client.ErrExpired) {
		t.Fatalf("Err = %v, want ErrExpired", l.Err())
	}
	if time.Now().Before(su) {
		t.Fatalf("Done closed before SafeUntil %v", su)
	}
	_ = l.Release(ctxT(t, 10*time.Second))
}

// Done and Err check the clock themselves: a caller that looks after
// safe_until sees the loss even if the heartbeat goroutine has not run.
func TestErrChecksTheClock(t *testing.T) {
	c := dial(t)
	l, err := c.Acquire(ctxT(t, 10*time.Second), "nokeepalive/clock", client.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(l.SafeUntil()))
	if l.Err() == nil {
		t.Fatal("Err is nil at SafeUntil")
	}
	_ = l.Release(ctxT(t, 10*time.Second))
}

// The grant disappears behind the client's back (an operator's
// ForceRelease): the next heartbeat gets NOT_FOUND and Done closes with
// ErrLost.
func TestLostWhenTheGrantIsForceReleased(t *testing.T) {
	c := dial(t)
	l, err := c.Acquire(ctxT(t, 10*time.Second), "t/revoked", client.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := c.ForceRelease(ctxT(t, 10*time.Second), "t/revoked", l.Token()); err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v; want true", ok, err)
	}
	waitDone(t, l, 5*time.Second)
	if !errors.Is(l.Err(), client.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", l.Err())
	}
	_ = l.Release(ctxT(t, 10*time.Second))
}

func TestAcquireRetriesUnavailableWithOneRequestID(t *testing.T) {
	c := dial(t, client.WithBackoff(10*time.Millisecond, 50*time.Millisecond))
	l, err := c.Acquire(ctxT(t, 10*time.Second), "unavailable-2/x", client.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ids := faults.ids("unavailable-2/x")
	if len(ids) != 3 || ids[0] == "" || ids[0] != ids[1] || ids[1] != ids[2] {
		t.Fatalf("request ids of the attempts: %q, want 3 equal non-empty ids", ids)
	}
	_ = l.Release(ctxT(t, 10*time.Second))
}

// The first answer is lost after the grant: the retry, with the same
// request id, gets the same grant; no second grant or waiter exists.
func TestAcquireRetryAfterLostAnswerGetsTheSameGrant(t *testing.T) {
	c := dial(t, client.WithBackoff(10*time.Millisecond, 50*time.Millisecond))
	lc := coordinatorv1.NewLockServiceClient(mustConn(t))
	l, err := c.Acquire(ctxT(t, 10*time.Second), "lostack/x", client.WithTTL(5*time.Second), client.WithOwner("retrier"))
	if err != nil {
		t.Fatal(err)
	}
	if lost := faults.lostToken("lostack/x"); lost == 0 || l.Token() != lost {
		t.Fatalf("retry after a lost answer got token %d; the lost grant had token %d (a second grant was made)", l.Token(), lost)
	}
	d, err := lc.Describe(ctxT(t, 10*time.Second), &coordinatorv1.DescribeRequest{Name: "lostack/x"})
	if err != nil {
		t.Fatal(err)
	}
	if d.GetHolder().GetToken() != l.Token() || len(d.GetWaiters()) != 0 {
		t.Fatalf("after a retried Acquire: holder %v waiters %d; want holder token %d and no waiter", d.GetHolder(), len(d.GetWaiters()), l.Token())
	}
	_ = l.Release(ctxT(t, 10*time.Second))
}

func TestAcquireCancelledWhileWaiting(t *testing.T) {
	c1, c2 := dial(t), dial(t)
	l, err := c1.Acquire(ctxT(t, 10*time.Second), "t/cancel", client.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := c2.Acquire(ctx, "t/cancel"); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("Acquire past its deadline: %v, want DEADLINE_EXCEEDED", err)
	}
	_ = l.Release(ctxT(t, 10*time.Second))
}

// After a long wait the send-time bound is stale; Acquire confirms the grant
// with a renewal so the lock it returns is safe for a full window.
func TestLockAfterLongWaitIsConfirmed(t *testing.T) {
	c1, c2 := dial(t), dial(t)
	a, err := c1.Acquire(ctxT(t, 10*time.Second), "t/longwait", client.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *client.Lock, 1)
	go func() {
		b, err := c2.Acquire(ctxT(t, 20*time.Second), "t/longwait", client.WithTTL(2*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	time.Sleep(3 * time.Second) // longer than B's TTL
	_ = a.Release(ctxT(t, 10*time.Second))
	b := <-got
	if b == nil {
		return
	}
	if b.Err() != nil || (!raceEnabled && time.Until(b.SafeUntil()) < time.Second) {
		t.Fatalf("lock after a 3s wait: err %v, safe for %v; want a fresh window", b.Err(), time.Until(b.SafeUntil()))
	}
	_ = b.Release(ctxT(t, 10*time.Second))
}

func TestCloseReleasesLocks(t *testing.T) {
	c1, err := client.Dial(coordinatorAddr)
	if err != nil {
		t.Fatal(err)
	}
	var locks []*client.Lock
	for _, n := range []string{"t/close1", "t/close2"} {
		l, err := c1.Acquire(ctxT(t, 10*time.Second), n, client.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, l)
	}
	if err := c1.Close(); err != nil {
		t.Fatal(err)
	}
	for _, l := range locks {
		if !isDone(l) || !errors.Is(l.Err(), client.ErrClosed) {
			t.Fatalf("after Close: done=%v err=%v", isDone(l), l.Err())
		}
	}
	c2 := dial(t)
	for _, l := range locks {
		l2, err := c2.TryAcquire(ctxT(t, 10*time.Second), l.Name())
		if err != nil {
			t.Fatalf("TryAcquire %q after the holder's Close: %v (Close should release)", l.Name(), err)
		}
		_ = l2.Release(ctxT(t, 10*time.Second))
	}
	if _, err := c1.Acquire(ctxT(t, 10*time.Second), "t/close3"); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Acquire after Close: %v, want ErrClosed", err)
	}
}

func TestBadInputIsNotRetried(t *testing.T) {
	c := dial(t)
	_, err := c.Acquire(ctxT(t, 10*time.Second), "")
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Acquire with an empty name: %v, want INVALID_ARGUMENT", err)
	}
}

// Renewal refused at max_hold: the Lock reports ErrLost.
func TestMaxHoldEndsTheLock(t *testing.T) {
	c := dial(t)
	l, err := c.Acquire(ctxT(t, 10*time.Second), "t/maxhold", client.WithTTL(time.Second), client.WithMaxHold(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, l, 10*time.Second)
	// Under the race detector a slow renewal may let safe_until pass first.
	if !errors.Is(l.Err(), client.ErrLost) && (!raceEnabled || !errors.Is(l.Err(), client.ErrExpired)) {
		t.Fatalf("Err = %v, want ErrLost (renewal refused at max hold)", l.Err())
	}
	_ = l.Release(ctxT(t, 10*time.Second))
}
