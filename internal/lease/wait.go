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

func (m *Manager) holderToken(ctx context.Context, queue string) int64 {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if r, err := m.cli.Get(rctx, queue, clientv3.WithFirstCreate()...); err == nil && len(r.Kvs) > 0 {
		return r.Kvs[0].CreateRevision
	}
	return 0
}

var (
	errTimeout = errors.New("wait elapsed")
	errLost    = errors.New("waiter lease lost")
)

// wait blocks until the attempt heads its queue and no other grant's
// lock-delay is pending. It keeps the waiter's lease alive meanwhile (the
// caller is actively waiting), and fails at once with ErrLostWhileWaiting if
// the waiter's own key disappears.
func (m *Manager) wait(ctx, parent context.Context, a *attempt, timeout <-chan time.Time) error {
	ctx, cancel := context.WithCancel(ctx)
	var (
		wg       sync.WaitGroup
		lost     = make(chan struct{})
		lostOnce sync.Once
	)
	markLost := func() { lostOnce.Do(func() { close(lost) }) }
	wg.Add(2)
	go func() {
		defer wg.Done()
		m.keepWaiterAlive(ctx, a, markLost)
	}()
	ownCreated := make(chan error, 1)
	go func() {
		defer wg.Done()
		m.watchOwn(ctx, a, markLost, ownCreated)
	}()
	defer func() { cancel(); wg.Wait() }()
	// own is the state of the watch of our own key: its creation is awaited
	// (and our key checked once after it) together with the first target's.
	own := &ownWatch{created: ownCreated}

	ended := func() error {
		select {
		case <-lost:
			return ErrLostWhileWaiting
		default:
		}
		return m.etcdErr(parent, "wait", ctx.Err())
	}
	delayKey := m.ks.delay(a.name)
	for first := true; ; first = false {
		if !first {
			// Something we waited for is gone: most often we now head the
			// queue, so try to claim the lock in one round trip.
			claimed, err := m.tryClaim(ctx, a)
			if err != nil {
				if ctx.Err() != nil {
					return ended()
				}
				return m.etcdErr(parent, "claim", err)
			}
			if claimed {
				return nil
			}
		}
		// The immediate predecessor: the newest key older than ours (known
		// from the join at first).
		target := ""
		if first && a.pred != "" {
			target = a.pred
		} else if r, err := m.cli.Get(ctx, a.queue, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(a.token-1), clientv3.WithKeysOnly())...); err != nil {
			if ctx.Err() != nil {
				return ended()
			}
			return m.etcdErr(parent, "find predecessor", err)
		} else if len(r.Kvs) > 0 {
			target = string(r.Kvs[0].Key)
		}
		if target == "" {
			// Head of the queue: wait out another grant's lock-delay.
			d, err := m.cli.Get(ctx, delayKey, clientv3.WithKeysOnly())
			if err != nil {
				if ctx.Err() != nil {
					return ended()
				}
				return m.etcdErr(parent, "read lock-delay", err)
			}
			if len(d.Kvs) == 0 || d.Kvs[0].CreateRevision == a.token {
				if err := own.ready(ctx, m, a, markLost); err != nil {
					if ctx.Err() != nil {
						return ended()
					}
					return m.etcdErr(parent, "watch own entry", err)
				}
				select {
				case <-lost:
					return ErrLostWhileWaiting
				default:
				}
				return nil
			}
			target = delayKey
		}
		// Watch from "now" (a synced watcher, woken at once), wait until the
		// watch exists, then re-check: a delete after this Get is seen.
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := m.cli.Watch(wctx, target, clientv3.WithCreatedNotify(), clientv3.WithFilterPut())
		err := m.awaitDelete(ctx, a, target, wch, timeout, lost, own, markLost)
		wcancel()
		switch {
		case errors.Is(err, errTimeout):
			return &NotGrantedError{Name: a.name, HolderToken: m.holderToken(ctx, a.queue)}
		case errors.Is(err, errLost):
			return ended()
		case err != nil:
			if ctx.Err() != nil {
				return ended()
			}
			return m.etcdErr(parent, "watch predecessor", err)
		}
		// The target is gone: find the next one, or hold the lock.
	}
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
func (m *Manager) awaitDelete(ctx context.Context, a *attempt, key string, wch clientv3.WatchChan, timeout <-chan time.Time, lost <-chan struct{}, own *ownWatch, markLost func()) error {
	created := false
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-lost:
			return errLost
		case <-timeout:
			return errTimeout
		case wr, ok := <-wch:
			if !ok || wr.Canceled {
				return nil // look again
			}
			if wr.Created && !created {
				created = true
				if !own.checked {
					if err := own.await(ctx); err != nil {
						return err
					}
					r, err := m.cli.Txn(ctx).Then(
						clientv3.OpGet(key, clientv3.WithCountOnly()),
						clientv3.OpGet(a.key, clientv3.WithCountOnly())).Commit()
					if err != nil {
						return err
					}
					own.checked = true
					if r.Responses[1].GetResponseRange().GetCount() == 0 {
						markLost()
						return errLost
					}
					if r.Responses[0].GetResponseRange().GetCount() == 0 {
						return nil
					}
					continue
				}
				r, err := m.cli.Get(ctx, key, clientv3.WithCountOnly())
				if err != nil {
					return err
				}
				if r.Count == 0 {
					return nil
				}
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					return nil
				}
			}
		}
	}
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
