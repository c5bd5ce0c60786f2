package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The join: the first write of an acquisition, which puts the caller's
// queue entry (and, when the lock is free, the grant) in one transaction.

// join writes a new queue key (and the request record, the limit slots,
// and the lock-delay key if the lock is free) in one transaction.
func (m *Manager) join(ctx, parent context.Context, name string, o acquireOptions) (*attempt, *Grant, error) {
	return m.joinWith(ctx, parent, name, o, maxRejoins)
}

// maxRejoins bounds how often a join is redone with a new lease: when a
// recycled lease turns out gone, and when a fresh lease expired before the
// join committed (etcd stalled longer than its TTL: a leader crash, say).
// Beyond, the join answers ErrUnavailable.
const maxRejoins = 2

// joinWith is join; rejoins is how many more times it may be redone with a
// new lease (only the first try may use a pooled one).
func (m *Manager) joinWith(ctx, parent context.Context, name string, o acquireOptions, rejoins int) (*attempt, *Grant, error) {
	start := m.now()
	a := &attempt{name: name, queue: m.ks.Queue(name)}
	sl := m.slotsFor(name, o)
	if full, err := m.stillFull(ctx, sl); err != nil || full != nil {
		if err != nil {
			return nil, nil, m.etcdErr(parent, "count limit slots", err)
		}
		return nil, nil, m.refusal(a, o, sl, full, func() int64 { return m.holderToken(ctx, a.queue) })
	}
	// refreshed, if not nil, delivers the refresh of a recycled lease, which
	// runs alongside the join (a recycled lease was pooled less than half
	// its TTL ago, so it lives; refreshed, it is as good as a new one).
	// A recycled lease refreshed very recently is used as it is: the grant
	// then counts its TTL from that refresh (base).
	var refreshed chan kaResult
	base := start
	if o.session != nil {
		a.id, a.ttl, a.session = o.session.id, o.session.ttl, true
	} else {
		ttlSec := int64((o.ttl + time.Second - 1) / time.Second)
		if p, ok := m.pool.get(ttlSec, start); ok && rejoins == maxRejoins {
			a.id, a.ttl = p.id, ttlSec
			if !p.refreshed.IsZero() && start.Sub(p.refreshed) < freshFor(ttlSec) {
				base = p.refreshed
			} else {
				refreshed = make(chan kaResult, 1)
				go func() {
					ttl, err := m.keepAliveOnce(ctx, p.id)
					refreshed <- kaResult{ttl, err}
				}()
			}
		}
		if a.id == 0 {
			lr, err := m.cli.Grant(ctx, ttlSec)
			if err != nil {
				return nil, nil, m.etcdErr(parent, "grant lease", err)
			}
			a.id, a.ttl = lr.ID, lr.TTL
		}
	}
	// recycleFailed: the recycled lease turned out gone or unrenewable;
	// the join is withdrawn and redone with a new lease.
	recycleFailed := false
	awaitRefresh := func() {
		if refreshed == nil {
			return
		}
		r := <-refreshed
		refreshed = nil
		if r.err != nil || r.ttl <= 0 {
			recycleFailed = true
		}
	}
	defer awaitRefresh() // every path waits for the refresh goroutine
	if o.lockDelay > 0 {
		dl, err := m.cli.Grant(ctx, a.ttl+int64((o.lockDelay+time.Second-1)/time.Second))
		if err != nil {
			m.discard(a)
			return nil, nil, m.etcdErr(parent, "grant lock-delay lease", err)
		}
		a.delay = dl.ID
	}
	var sum []byte
	switch {
	case o.session != nil:
		a.handle, sum = o.session.handle, o.session.hash
	case o.requestID != "":
		req := newRequestRecord(a.id, o)
		a.handle, sum = req.handle(a.id, o, name)
		a.reqRecord = req.encode()
	default:
		a.handle, sum = newHandle(a.id)
	}
	a.key = m.ks.key(name, a.id)
	a.rec = record{Owner: o.owner, HandleHash: sum, Since: start.UnixNano(), MaxHold: int64(o.maxHold),
		LockDelay: int64(o.lockDelay), DelayLease: int64(a.delay), Session: a.session}
	if !a.session {
		a.rec.TTL = a.ttl
	}
	if o.requestID != "" {
		a.rec.Req = m.ks.request(o.caller, name, o.requestID)
	}

	// Commit the join, claiming a free slot of each limit (limits.go): a
	// slot lost to a concurrent join is picked again among the free ones.
	var (
		held  record
		res   txnRes
		shape joinShape
	)
	for round := 1; ; round++ {
		sl.stamp(&a.rec)
		held = a.rec
		held.Acquired = a.rec.Since
		res, shape = m.joinTxn(ctx, a, o, sl, held)
		if res.err != nil || res.ok || !shape.nested || shape.guardFailed(res) {
			break
		}
		if full := sl.repick(res.resps[shape.slotReads():]); full != nil || round == maxSlotRounds {
			if full != nil {
				m.full.saw(full.prefix, m.now())
			}
			m.discard(a)
			return nil, nil, m.refusal(a, o, sl, full, func() int64 { return m.holderToken(ctx, a.queue) })
		}
	}
	if res.err == nil && !(shape.nested && !res.ok) {
		a.token, a.modRev = res.rev, res.rev // written at res.rev
	}
	awaitRefresh()
	leaseGone := errors.Is(res.err, rpctypes.ErrLeaseNotFound)
	if (recycleFailed || leaseGone) && ctx.Err() == nil {
		if leaseGone {
			m.discard(a) // refused as a whole: nothing written
		} else {
			m.withdraw(a)
		}
		if rejoins > 0 {
			return m.joinWith(ctx, parent, name, o, rejoins-1)
		}
		return nil, nil, fmt.Errorf("%w: joining %q: the queue entry's lease expired before etcd committed the join (etcd is slow or changing leader); retry", ErrUnavailable, name)
	}
	if err := res.err; err != nil {
		m.withdraw(a) // the join may have been committed
		return nil, nil, m.etcdErr(parent, "join queue", err)
	}
	if shape.guardFailed(res) {
		// A concurrent attempt with the same request id won the race (we
		// take it over), or the session already has a key in this queue.
		m.discard(a)
		if a.session {
			return nil, nil, ErrSessionBusy
		}
		r, err := m.adoptRequest(ctx, parent, name, o)
		if err != nil {
			return nil, nil, err
		}
		if r == nil {
			return nil, nil, fmt.Errorf("%w: a concurrent retry's acquisition vanished; retry", ErrUnavailable)
		}
		if r.rec.Acquired != 0 {
			g, err := m.regrant(ctx, parent, r)
			return nil, g, err
		}
		return r, nil, nil
	}
	granted, resps := res.ok, res.resps
	if shape.nested {
		granted, resps = res.resps[0].GetResponseTxn().GetSucceeded(), res.resps[0].GetResponseTxn().GetResponses()
	}
	if !granted {
		if len(resps) >= 2 { // [put, get, the slot puts if any]
			if kvs := resps[1].GetResponseRange().GetKvs(); len(kvs) == 2 && kvs[0].CreateRevision == a.token {
				a.pred = string(kvs[1].Key)
			}
		}
		return a, nil, nil
	}
	a.rec = held
	m.remember(a, res.rev, base)
	return nil, m.grantOf(a, base, time.Duration(a.ttl)*time.Second), nil
}

// joinShape says how a join transaction's answer reads. Without a guard or
// a limit it is flat: If(free) Then(hold) Else(queue). Otherwise the outer
// transaction compares the guard (the request record's or the session
// key's absence) and the limit slots' absence; its Then nests the flat one
// first, and its Else reads the guard key (count only) and then each limit
// scope's slots.
type joinShape struct {
	nested  bool
	guarded bool
}

// guardFailed: the outer compare failed because the guard key exists.
func (s joinShape) guardFailed(res txnRes) bool {
	return s.guarded && !res.ok && res.err == nil && res.resps[0].GetResponseRange().GetCount() > 0
}

// slotReads is the index of the first slot read in a failed outer Else.
func (s joinShape) slotReads() int {
	if s.guarded {
		return 1
	}
	return 0
}

// joinTxn commits a's join with the slots sl (held is the record of a
// grant at once): through group commit, except a session's join (which
// writes the session index), committed alone.
func (m *Manager) joinTxn(ctx context.Context, a *attempt, o acquireOptions, sl slots, held record) (txnRes, joinShape) {
	// If the queue is empty and no lock-delay is pending: hold at once.
	// Otherwise: queue, and read the holder.
	delayKey := m.ks.delay(a.name)
	free := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(a.queue), "=", 0).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(delayKey), "=", 0),
	}
	hold := []clientv3.Op{clientv3.OpPut(a.key, held.encode(), clientv3.WithLease(a.id))}
	if a.delay != 0 {
		hold = append(hold, clientv3.OpPut(delayKey, "", clientv3.WithLease(a.delay)))
	}
	queue := []clientv3.Op{
		clientv3.OpPut(a.key, a.rec.encode(), clientv3.WithLease(a.id)),
		// The newest two keys: ours (the put above is visible here) and
		// our immediate predecessor, the first key the wait watches.
		clientv3.OpGet(a.queue, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(2),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend)),
	}
	hold, queue = append(hold, sl.puts(a.id)...), append(queue, sl.puts(a.id)...)
	var (
		guard string // a key that must not exist: the request record, or a session's key in this queue
		extra []clientv3.Op
	)
	switch {
	case o.requestID != "":
		guard = a.rec.Req
		extra = []clientv3.Op{clientv3.OpPut(guard, a.reqRecord, clientv3.WithLease(a.id))}
	case a.session:
		// A session has one key per queue: refuse a second.
		guard = a.key
		extra = []clientv3.Op{clientv3.OpPut(m.ks.sessionIndex(a.id)+escape(a.name), "", clientv3.WithLease(a.id))}
	}
	shape := joinShape{nested: guard != "" || sl.limited(), guarded: guard != ""}
	conflicts := append([]string{a.name}, sl.conflicts()...)
	if !shape.nested {
		return m.batch.doExclusive(ctx, conflicts, free, hold, queue), shape
	}
	cmps, els := sl.cmps(), sl.reads()
	if guard != "" {
		cmps = append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(guard), "=", 0)}, cmps...)
		els = append([]clientv3.Op{clientv3.OpGet(guard, clientv3.WithCountOnly())}, els...)
	}
	then := append([]clientv3.Op{clientv3.OpTxn(free, hold, queue)}, extra...)
	if !a.session {
		return m.batch.doExclusive(ctx, conflicts, cmps, then, els), shape
	}
	resp, err := m.cli.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
	if err != nil {
		return txnRes{err: err}, shape
	}
	return txnRes{rev: resp.Header.Revision, ok: resp.Succeeded, resps: resp.Responses}, shape
}
