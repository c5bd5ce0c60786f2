package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// Lock is a held lock. Its heartbeat runs until Release, Client.Close or
// the loss of the lock; then Done is closed, Context is cancelled and Err
// says why.
type Lock struct {
	c      *Client
	ref    GrantRef
	ttl    time.Duration
	margin time.Duration
	hold   *holdConn // the Hold stream that renews it; nil: unary KeepAlive
	slot   int32     // a semaphore permit's slot
	shared bool      // a read-write lock's reader

	mu        sync.Mutex
	safeUntil time.Time
	err       error
	done      chan struct{}
	ctx       context.Context
	cancelCtx context.CancelCauseFunc

	stop    context.CancelFunc // ends the heartbeat; nil before it starts
	exited  chan struct{}      // closed when the heartbeat has returned
	endOnce sync.Once
	endErr  error
}

// newLock is a Lock not yet granted: start makes it held.
func newLock(c *Client) *Lock {
	l := &Lock{c: c, done: make(chan struct{}), exited: make(chan struct{})}
	l.ctx, l.cancelCtx = context.WithCancelCause(context.Background())
	return l
}

// Slot is a semaphore permit's slot, 0..limit-1 (0 for a mutex or a
// read-write lock): tokens rise per slot, so a resource keeps one mark per
// (resource, slot).
func (l *Lock) Slot() int32 { return l.slot }

// Shared reports whether the lock is a read-write lock's reader's
// (RWMutex.RLock): its token may not raise a resource's mark.
func (l *Lock) Shared() bool { return l.shared }

// Name is the lock's name.
func (l *Lock) Name() string { return l.ref.Name }

// Token is the grant's fencing token: send it with every write to a
// protected resource.
func (l *Lock) Token() int64 { return l.ref.Token }

// TTL is the lease TTL the coordinator granted.
func (l *Lock) TTL() time.Duration { return l.ttl }

// SafeUntil is the local time until which the lock is known to be held:
// the send time of the last confirmed Acquire or renewal, plus the TTL,
// minus the safety margin. Past it, Done is closed.
func (l *Lock) SafeUntil() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.safeUntil
}

// Done is closed when the lock must no longer be used: lost, expired
// (safe_until passed without a confirmed renewal), released, or the client
// closed. It checks the clock itself, so after a pause it is already closed
// when it is called.
func (l *Lock) Done() <-chan struct{} {
	l.check()
	return l.done
}

// Err is nil while the lock is held, then ErrLost, ErrExpired, ErrReleased
// or ErrClosed (possibly wrapped with details; use errors.Is). Like Done, it
// checks the clock itself.
func (l *Lock) Err() error {
	l.check()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Context is a context cancelled when Done closes, with Err as its cause
// (context.Cause): pass it to the work done under the lock, so that the
// work is cancelled by the loss. Like Done it checks the clock when called;
// a process paused past safe_until in the middle of its work should still
// check Err before each write, or send Token with it.
func (l *Lock) Context() context.Context {
	l.check()
	return l.ctx
}

// Release stops the heartbeat and gives the lock up, so the next waiter is
// granted at once; Done is closed and Err is ErrReleased (unless the lock
// was lost before). Releasing a lock that was already lost or released is
// not an error. UNAVAILABLE is retried until ctx ends; if the release does
// not reach the coordinator, the lock ends with its TTL.
func (l *Lock) Release(ctx context.Context) error {
	return l.end(ctx, ErrReleased)
}

// check closes Done if safe_until has passed.
func (l *Lock) check() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil && !time.Now().Before(l.safeUntil) {
		l.loseLocked(fmt.Errorf("%w (safe until %s, TTL %v, margin %v)", ErrExpired, l.safeUntil.Format(time.RFC3339Nano), l.ttl, l.margin))
	}
}

// lose records the first reason the lock ended and closes Done.
func (l *Lock) lose(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.loseLocked(err)
}

func (l *Lock) loseLocked(err error) {
	if l.err == nil {
		l.err = err
		close(l.done)
		l.cancelCtx(err)
	}
}

// extend moves safe_until forward after a confirmed renewal; a lock
// already ended stays ended.
func (l *Lock) extend(until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil && until.After(l.safeUntil) {
		l.safeUntil = until
	}
}

// end stops the heartbeat, ends the lock with reason and releases it.
func (l *Lock) end(ctx context.Context, reason error) error {
	l.endOnce.Do(func() {
		if l.stop != nil {
			l.stop()
			<-l.exited
		}
		l.lose(reason)
		if l.hold != nil {
			l.endErr = l.hold.release(ctx, l.ref)
		} else {
			_, l.endErr = l.c.Release(ctx, l.ref)
		}
		l.c.untrack(l)
	})
	return l.endErr
}

// interval is the heartbeat period: a third of (TTL - margin), ±10%.
func (l *Lock) interval() time.Duration {
	base := (l.ttl - l.margin) / 3
	return base*9/10 + rand.N(base/5+1)
}

// renew sends one KeepAlive and, on success, extends safe_until from the
// moment it was sent. ErrLost when the coordinator says the grant is gone.
func (l *Lock) renew(ctx context.Context) error {
	sent := time.Now()
	var (
		resp *coordinatorv1.KeepAliveResponse
		err  error
	)
	if l.hold != nil {
		resp, err = l.hold.heartbeat(ctx, l.ref)
	} else {
		resp, err = l.c.keepAlive(ctx, l.ref)
	}
	if err == nil {
		l.extend(sent.Add(resp.GetTtl().AsDuration() - l.margin))
		return nil
	}
	if errors.Is(err, ErrLost) { // pushed on the Hold stream
		return err
	}
	if lostReason(err) {
		return fmt.Errorf("%w: %s", ErrLost, status.Convert(err).Message())
	}
	return err
}

// lostReason tells whether a renewal's refusal means the grant is gone:
// its reason says so (NOT_HELD, MAX_HOLD_REACHED, SESSION_NOT_FOUND) or, from a
// coordinator that sends no reason, its code is NOT_FOUND or
// FAILED_PRECONDITION. Anything else (UNAVAILABLE, a deadline) is retried
// while safe_until allows.
func lostReason(err error) bool {
	switch ReasonOf(err) {
	case ReasonNotHeld, ReasonMaxHoldReached, ReasonSessionNotFound:
		return true
	case "":
		c := status.Code(err)
		return c == codes.NotFound || c == codes.FailedPrecondition
	}
	return false
}

// confirm renews once, retrying UNAVAILABLE until ctx ends.
func (l *Lock) confirm(ctx context.Context) error {
	return l.c.retry(ctx, l.renew)
}

// heartbeat renews the lease until ctx ends (Release, Close) or the lock is
// lost. On loss it releases the grant, best effort, in case it still lives.
func (l *Lock) heartbeat(ctx context.Context) {
	defer close(l.exited)
	next := l.interval()
	failures := 0
	for {
		until := l.SafeUntil()
		t := time.NewTimer(min(next, time.Until(until)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-l.done: // lost, as the Hold stream said
			t.Stop()
			if !errors.Is(l.Err(), ErrExpired) {
				return
			}
		case <-t.C:
		}
		if l.Err() != nil { // safe_until passed: expired
			l.abandon(ctx)
			return
		}
		rctx, cancel := context.WithDeadline(ctx, l.SafeUntil())
		err := l.renew(rctx)
		cancel()
		switch {
		case err == nil:
			failures, next = 0, l.interval()
		case ctx.Err() != nil:
			return
		case errors.Is(err, ErrLost):
			l.lose(err)
			return
		default: // UNAVAILABLE, deadline, ...: retry until safe_until
			next = l.c.backoff(failures)
			failures++
		}
	}
}

// abandon releases an expired lock's grant, best effort: it may still live.
func (l *Lock) abandon(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	if l.hold != nil {
		l.hold.closeStream()
	}
	_, _ = l.c.releaseOnce(ctx, l.ref)
}
