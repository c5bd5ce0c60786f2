package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The wait: a queued entry watches only the key it waits for, keeps its
// lease alive, and notices at once if its own entry disappears.

var (
	errTimeout = errors.New("wait elapsed")
	errLost    = errors.New("waiter lease lost")
)

// wait blocks until the queue admits the attempt (admission.go): it heads
// its queue and no other grant's lock-delay is pending. It keeps the
// waiter's lease alive meanwhile (the caller is actively waiting), and
// fails at once with ErrLostWhileWaiting if the waiter's own key
// disappears.
func (m *Manager) wait(ctx, parent context.Context, a *attempt, timeout <-chan time.Time) error {
	w, stop := m.startWaiter(ctx, parent, a)
	defer stop()
	q := m.admissionOf(a)
	for first := true; ; first = false {
		if !first && q.comparable() {
			// Something we waited for is gone: most often we now head the
			// queue, so try to claim the lock in one round trip.
			claimed, err := m.tryClaim(w.ctx, a)
			if err != nil {
				return w.fail("claim", err)
			}
			if claimed {
				return nil
			}
		}
		// What stands between us and admission (our immediate predecessor
		// is known from the join at first).
		t := a.pred
		if !first || t.key == "" {
			next, slot, op, err := q.blocker(w.ctx, m.cli, a.token)
			if err != nil {
				return w.refused(op, err)
			}
			t, a.rec.Slot = next, slot
		}
		if t.key == "" {
			return w.admitted()
		}
		if err := w.watchGone(t, timeout); err != nil {
			return err
		}
		// The target is gone: find the next one, or hold the lock.
	}
}

// waiter is one wait in progress: its context (which ends the watchers and
// the keepalive), the lost signal they raise, and the watch of its own key.
type waiter struct {
	m           *Manager
	a           *attempt
	ctx, parent context.Context
	lost        chan struct{}
	lostOnce    sync.Once
	// own is the state of the watch of our own key: its creation is
	// awaited (and our key checked once after it) together with the first
	// target's.
	own *ownWatch
}

// startWaiter starts the waiter's keepalive and the watch of its own key;
// stop ends them and waits for them.
func (m *Manager) startWaiter(ctx, parent context.Context, a *attempt) (w *waiter, stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	ownCreated := make(chan error, 1)
	w = &waiter{m: m, a: a, ctx: ctx, parent: parent, lost: make(chan struct{}), own: &ownWatch{created: ownCreated}}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		m.keepWaiterAlive(ctx, a, w.markLost)
	}()
	go func() {
		defer wg.Done()
		m.watchOwn(ctx, a, w.markLost, ownCreated)
	}()
	return w, func() { cancel(); wg.Wait() }
}

func (w *waiter) markLost() { w.lostOnce.Do(func() { close(w.lost) }) }

// ended is why the wait ended with its context: the waiter's own entry was
// lost, or the caller's context ended.
func (w *waiter) ended() error {
	select {
	case <-w.lost:
		return ErrLostWhileWaiting
	default:
	}
	return w.m.etcdErr(w.parent, "wait", w.ctx.Err())
}

// fail answers a failed step op of the wait.
func (w *waiter) fail(op string, err error) error {
	if w.ctx.Err() != nil {
		return w.ended()
	}
	return w.m.etcdErr(w.parent, op, err)
}

// refused answers a failed blocker read op: a *LimitMismatchError as it
// is, anything else as fail does.
func (w *waiter) refused(op string, err error) error {
	var mismatch *LimitMismatchError
	if errors.As(err, &mismatch) {
		return err
	}
	return w.fail(op, err)
}

// admitted ends a wait that nothing blocks any more, once the waiter's own
// entry is known to exist.
func (w *waiter) admitted() error {
	if err := w.own.ready(w.ctx, w.m, w.a, w.markLost); err != nil {
		return w.fail("watch own entry", err)
	}
	select {
	case <-w.lost:
		return ErrLostWhileWaiting
	default:
	}
	return nil
}

// watchGone returns nil once target is deleted (or its watch broke: the
// caller looks again); a *NotGrantedError when the wait elapses first.
// Watch from "now" (a synced watcher, woken at once), wait until the watch
// exists, then re-check: a delete after the caller's read is seen.
func (w *waiter) watchGone(t target, timeout <-chan time.Time) error {
	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(w.ctx))
	opts := []clientv3.OpOption{clientv3.WithCreatedNotify()}
	if !t.puts {
		opts = append(opts, clientv3.WithFilterPut())
	}
	if t.prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	if t.rev > 0 {
		opts = append(opts, clientv3.WithRev(t.rev+1))
	}
	wch := w.m.cli.Watch(wctx, t.key, opts...)
	err := w.awaitDelete(t, wch, timeout)
	wcancel()
	switch {
	case errors.Is(err, errTimeout):
		return &NotGrantedError{Name: w.a.name, HolderToken: w.m.holderToken(w.ctx, w.a.name)}
	case errors.Is(err, errLost):
		return w.ended()
	case err != nil:
		return w.fail("watch predecessor", err)
	}
	return nil
}

// watchOwn closes lost (via markLost) as soon as the attempt's own queue
// key is deleted. It reports on created once the watch is in place; the
// waiter then checks once that the key still exists (ownWatch.ready).
func (m *Manager) watchOwn(ctx context.Context, a *attempt, markLost func(), created chan<- error) {
	wch := m.cli.Watch(clientv3.WithRequireLeader(ctx), a.key, clientv3.WithCreatedNotify(), clientv3.WithFilterPut())
	first := true
	for {
		select {
		case <-ctx.Done():
			if first {
				created <- ctx.Err()
			}
			return
		case wr, ok := <-wch:
			if !ok || wr.Canceled {
				if first {
					// %w keeps etcd's error (no leader, ...) visible to
					// classify: UNAVAILABLE, not INTERNAL.
					err := wr.Err()
					if err == nil {
						err = rpctypes.ErrTimeoutDueToConnectionLost
					}
					created <- fmt.Errorf("watch of own queue entry closed: %w", err)
				}
				return // the keepalive loop still detects a lost lease
			}
			if wr.Created && first {
				first = false
				created <- nil // the waiter checks that the key exists
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					markLost()
					return
				}
			}
		}
	}
}

// ownWatch is a waiter's view of the watch of its own key.
type ownWatch struct {
	created <-chan error
	checked bool // the watch exists and the key was seen after that
}

// ready waits for the own-key watch and then checks the key, unless done.
func (o *ownWatch) ready(ctx context.Context, m *Manager, a *attempt, markLost func()) error {
	if o.checked {
		return nil
	}
	if err := o.await(ctx); err != nil {
		return err
	}
	r, err := m.cli.Get(ctx, a.key, clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	if r.Count == 0 {
		markLost()
	}
	o.checked = true
	return nil
}

func (o *ownWatch) await(ctx context.Context) error {
	select {
	case err := <-o.created:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// awaitDelete returns when key is deleted (or its watch broke, which the
// caller answers by looking again). Once key's watch exists, it checks that
// key still exists, and, the first time, that the waiter's own key does
// (own): both in one read.
func (w *waiter) awaitDelete(t target, wch clientv3.WatchChan, timeout <-chan time.Time) error {
	created := false
	for {
		select {
		case <-w.ctx.Done():
			return w.ctx.Err()
		case <-w.lost:
			return errLost
		case <-timeout:
			return errTimeout
		case wr, ok := <-wch:
			if !ok || wr.Canceled {
				return nil // look again
			}
			if wr.Created && !created {
				created = true
				if gone, err := w.stillThere(t); gone || err != nil {
					return err
				}
			}
			if len(wr.Events) > 0 { // a delete (or, if watched, a put)
				return nil
			}
		}
	}
}

// stillThere checks, once t's watch exists, whether the entry it waits for
// is gone already (its key deleted, or written again as another entry:
// target); the first time, together with the waiter's own key (errLost if
// that one is gone). A prefix is never gone: its watch started at the
// revision of the read that chose it, and delivers every end since.
func (w *waiter) stillThere(t target) (gone bool, err error) {
	ctx := w.ctx
	keyOp := clientv3.OpGet(t.key, clientv3.WithKeysOnly())
	if t.prefix {
		keyOp = clientv3.OpGet(t.key, clientv3.WithPrefix(), clientv3.WithCountOnly())
	}
	if w.own.checked {
		if t.prefix {
			return false, nil
		}
		r, err := w.m.cli.Get(ctx, t.key, clientv3.WithKeysOnly())
		if err != nil {
			return false, err
		}
		return !t.present(r.Kvs), nil
	}
	if err := w.own.await(ctx); err != nil {
		return false, err
	}
	r, err := w.m.cli.Txn(ctx).Then(keyOp, clientv3.OpGet(w.a.key, clientv3.WithCountOnly())).Commit()
	if err != nil {
		return false, err
	}
	w.own.checked = true
	if r.Responses[1].GetResponseRange().GetCount() == 0 {
		w.markLost()
		return true, errLost
	}
	return !t.prefix && !t.present(r.Responses[0].GetResponseRange().GetKvs()), nil
}

// keepWaiterAlive renews a waiter's leases every third of the TTL until ctx
// ends; it calls markLost if the lease is gone.
func (m *Manager) keepWaiterAlive(ctx context.Context, a *attempt, markLost func()) {
	every := max(time.Duration(a.ttl)*time.Second/3, 100*time.Millisecond)
	retry := min(every, 250*time.Millisecond) // after a failed renewal: sooner
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, every)
		_, err := m.renew(rctx, a.id, a.delay)
		cancel()
		switch {
		case errors.Is(err, ErrNotHeld):
			markLost()
			return
		case err != nil && ctx.Err() == nil:
			m.log.Warn("renewing a waiter's lease failed; retrying", "lease", formatLease(a.id), "err", err)
			t.Reset(retry)
		default:
			t.Reset(every)
		}
	}
}
