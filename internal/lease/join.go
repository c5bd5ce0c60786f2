package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// The join: the first write of an acquisition, which puts the caller's
// queue entry (and, when the lock is free, the grant) in one transaction.
// Its steps: refuse early if a limit is full, choose the lease, describe
// the entry, commit (jointxn.go), and read the outcome.

// join writes a new queue entry (and the request record, the limit slots,
// and the lock-delay key if the lock is free) in one transaction, and
// places the caller: granted at once, or waiting. A join whose lease turned
// out gone before it committed is redone with a new lease.
func (m *Manager) join(ctx, parent context.Context, name string, o acquireOptions) (placed, error) {
	for rejoins := maxRejoins; ; rejoins-- {
		p, err := m.joinOnce(ctx, parent, name, o, rejoins == maxRejoins)
		if !errors.Is(err, errRejoin) {
			return p, err
		}
		if rejoins == 0 {
			return placed{}, fmt.Errorf("%w: joining %q: the queue entry's lease expired before etcd committed the join (etcd is slow or changing leader); retry", ErrUnavailable, name)
		}
	}
}

// maxRejoins bounds how often a join is redone with a new lease: when a
// recycled lease turns out gone, and when a fresh lease expired before the
// join committed (etcd stalled longer than its TTL: a leader crash, say).
// Beyond, the join answers ErrUnavailable.
const maxRejoins = 2

// errRejoin: the join's lease turned out gone; its entry is withdrawn and
// the join is to be redone with a new lease.
var errRejoin = errors.New("the join's lease is gone: join again with a new lease")

// joinOnce is one try of join; pooled says whether it may put the entry on
// a pooled lease (only the first try may).
func (m *Manager) joinOnce(ctx, parent context.Context, name string, o acquireOptions, pooled bool) (placed, error) {
	start := m.now()
	a := &attempt{name: name, queue: m.ks.Queue(name)}
	sl := m.slotsFor(name, o)
	if err := m.refuseIfFull(ctx, parent, a, o, sl); err != nil {
		return placed{}, err
	}
	l, err := m.chooseLease(ctx, parent, a, o, start, pooled)
	if err != nil {
		return placed{}, err
	}
	defer l.settle() // every path waits for the refresh goroutine
	if err := m.grantDelayLease(ctx, parent, a, o); err != nil {
		return placed{}, err
	}
	m.describeEntry(a, o, start)
	ans, err := m.commitJoin(ctx, a, o, sl)
	if err != nil {
		return placed{}, err
	}
	return m.joinOutcome(ctx, parent, a, o, ans, l)
}

// refuseIfFull refuses the join before anything is written when a limit it
// needs was recently seen full and still is (limits.go).
func (m *Manager) refuseIfFull(ctx, parent context.Context, a *attempt, o acquireOptions, sl slots) error {
	full, err := m.stillFull(ctx, sl)
	switch {
	case err != nil:
		return m.etcdErr(parent, "count limit slots", err)
	case full != nil:
		return m.refusal(a, o, sl, full, func() int64 { return m.holderToken(ctx, a.name) })
	}
	return nil
}

// joinLease is the lease a join's entry is put on, as the join's outcome
// needs to know it. A recycled lease (pool.go) was pooled less than half
// its TTL ago, so it lives; it is refreshed alongside the join, and,
// refreshed, it is as good as a new one. A recycled lease refreshed very
// recently is used as it is: the grant then counts its TTL from that
// refresh (base).
type joinLease struct {
	base    time.Time     // the instant a grant at once counts its TTL from
	refresh chan kaResult // the refresh of a recycled lease, nil if none runs
	failed  bool          // the recycled lease turned out gone or unrenewable
}

// settle waits for the recycled lease's refresh, if one runs, and reports
// whether the lease failed: the join is then withdrawn and redone with a
// new lease.
func (l *joinLease) settle() bool {
	if l.refresh != nil {
		r := <-l.refresh
		l.refresh = nil
		if r.err != nil || r.ttl <= 0 {
			l.failed = true
		}
	}
	return l.failed
}

// chooseLease puts the attempt on a lease: its session's, a recycled one
// (if pooled allows), or a new one.
func (m *Manager) chooseLease(ctx, parent context.Context, a *attempt, o acquireOptions, start time.Time, pooled bool) (*joinLease, error) {
	l := &joinLease{base: start}
	if o.session != nil {
		a.id, a.ttl, a.session = o.session.id, o.session.ttl, true
		return l, nil
	}
	ttlSec := int64((o.ttl + time.Second - 1) / time.Second)
	if p, ok := m.pool.get(ttlSec, start); ok && pooled {
		a.id, a.ttl = p.id, ttlSec
		if !p.refreshed.IsZero() && start.Sub(p.refreshed) < freshFor(ttlSec) {
			l.base = p.refreshed
			return l, nil
		}
		l.refresh = make(chan kaResult, 1)
		go func() {
			ttl, err := m.keepAliveOnce(ctx, p.id)
			l.refresh <- kaResult{ttl, err}
		}()
		return l, nil
	}
	lr, err := m.cli.Grant(ctx, ttlSec)
	if err != nil {
		return nil, m.etcdErr(parent, "grant lease", err)
	}
	a.id, a.ttl = lr.ID, lr.TTL
	return l, nil
}

// grantDelayLease grants the lease of the attempt's lock-delay key, if it
// asks for a lock delay: it outlives the grant's lease by the delay.
func (m *Manager) grantDelayLease(ctx, parent context.Context, a *attempt, o acquireOptions) error {
	if o.lockDelay <= 0 {
		return nil
	}
	dl, err := m.cli.Grant(ctx, a.ttl+int64((o.lockDelay+time.Second-1)/time.Second))
	if err != nil {
		m.discard(a)
		return m.etcdErr(parent, "grant lock-delay lease", err)
	}
	a.delay = dl.ID
	return nil
}

// describeEntry fills in what the entry says of itself: its key, its handle
// (the session's, one derived from the request id, or a fresh secret) and
// its record.
func (m *Manager) describeEntry(a *attempt, o acquireOptions, start time.Time) {
	var sum []byte
	switch {
	case o.session != nil:
		a.handle, sum = o.session.handle, o.session.hash
	case o.requestID != "":
		req := newRequestRecord(a.id, o)
		a.handle, sum = req.handle(a.id, o, a.name)
		a.reqRecord = req.encode()
	default:
		a.handle, sum = newHandle(a.id)
	}
	a.key = m.ks.key(a.name, a.id)
	a.rec = record{Owner: o.owner, HandleHash: sum, Since: start.UnixNano(), MaxHold: int64(o.maxHold),
		LockDelay: int64(o.lockDelay), DelayLease: int64(a.delay), Session: a.session,
		Limit: o.shape.Limit, Shared: o.shape.Shared}
	if !a.session {
		a.rec.TTL = a.ttl
	}
	if o.requestID != "" {
		a.rec.Req = m.ks.request(o.caller, a.name, o.requestID)
	}
}

// joinOutcome reads a committed join's answer and places the caller:
// granted at once, or queued behind its predecessor (known from the join's
// read); a join a concurrent one guarded against becomes that one's
// (guardRefused). A join whose lease turned out gone answers errRejoin;
// any other failure withdraws the entry, which may have been written.
func (m *Manager) joinOutcome(ctx, parent context.Context, a *attempt, o acquireOptions, ans joinAnswer, l *joinLease) (placed, error) {
	res := ans.res
	if res.err == nil && (!ans.shape.nested || res.ok) {
		a.token, a.modRev = res.rev, res.rev // written at res.rev
	}
	recycleFailed := l.settle()
	leaseGone := errors.Is(res.err, rpctypes.ErrLeaseNotFound)
	if (recycleFailed || leaseGone) && ctx.Err() == nil {
		if leaseGone {
			m.discard(a) // refused as a whole: nothing written
		} else {
			m.withdraw(a)
		}
		return placed{}, errRejoin
	}
	if err := res.err; err != nil {
		m.withdraw(a) // the join may have been committed
		return placed{}, m.etcdErr(parent, "join queue", err)
	}
	if ans.shape.guardFailed(res) {
		return m.guardRefused(ctx, parent, a, o)
	}
	granted, resps := ans.shape.inner(res)
	if !granted {
		if len(resps) >= 2 { // [put, get, the slot puts if any]
			pred, err := m.admissionOf(a).joinBlocker(resps[1].GetResponseRange(), a.token)
			if err != nil {
				m.withdraw(a)
				return placed{}, err
			}
			a.pred = pred
		}
		return placed{waiter: a}, nil
	}
	a.rec = ans.held
	m.remember(a, res.rev, l.base)
	return placed{grant: m.grantOf(a, l.base, time.Duration(a.ttl)*time.Second)}, nil
}

// guardRefused answers a join its guard refused (nothing written): a
// concurrent attempt with the same request id won the race, and this call
// takes it over; or the session already has a key in this queue.
func (m *Manager) guardRefused(ctx, parent context.Context, a *attempt, o acquireOptions) (placed, error) {
	m.discard(a)
	if a.session {
		return placed{}, ErrSessionBusy
	}
	p, err := m.retryRequest(ctx, parent, a.name, o)
	if err == nil && !p.found() {
		return placed{}, fmt.Errorf("%w: a concurrent retry's acquisition vanished; retry", ErrUnavailable)
	}
	return p, err
}
