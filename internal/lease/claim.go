package lease

import (
	"context"
	"errors"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The claim: a waiter that heads its queue marks its entry granted and
// refreshes its lease for a full TTL.

// tryClaim marks the attempt granted if, in etcd's view, the queue admits
// it (it heads its queue and no lock-delay is pending), in one transaction; the lease refresh
// that a grant needs runs alongside, so a hand-off costs one round trip.
func (m *Manager) tryClaim(ctx context.Context, a *attempt) (bool, error) {
	held, ops := m.claimOps(a)
	type renewal struct {
		at  time.Time
		ttl int64
		err error
	}
	rc := make(chan renewal, 1)
	go func() {
		at := m.now()
		ttl, err := m.renew(ctx, a.id, a.delay)
		rc <- renewal{at, ttl, err}
	}()
	own := clientv3.Compare(clientv3.CreateRevision(a.key), "=", a.token)
	res := m.batch.do(ctx, "", append([]clientv3.Cmp{own}, m.admission(a.name).admits(a.token)...), ops, nil)
	r := <-rc
	if res.err != nil || !res.ok {
		return false, res.err
	}
	a.rec, a.modRev = held, res.rev
	if r.err == nil {
		a.refreshed, a.refreshedTTL = r.at, r.ttl
	}
	m.remember(a, res.rev, a.refreshed)
	return true, nil
}

// claim marks the head of the queue as granted (writing the lock-delay key
// if asked) and refreshes its lease for a full TTL.
func (m *Manager) claim(ctx, parent context.Context, a *attempt) (*Grant, error) {
	if a.rec.Acquired == 0 {
		held, ops := m.claimOps(a)
		tr, err := m.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(a.key), "=", a.token)).
			Then(ops...).
			Commit()
		if err != nil {
			return nil, m.etcdErr(parent, "mark grant", err)
		}
		if !tr.Succeeded {
			return nil, ErrLostWhileWaiting
		}
		a.rec, a.modRev = held, tr.Header.Revision
		m.remember(a, tr.Header.Revision, time.Time{})
	}
	if a.refreshedTTL > 0 { // refreshed alongside the claim
		return m.grantOf(a, a.refreshed, time.Duration(a.refreshedTTL)*time.Second), nil
	}
	refreshed := m.now()
	ttl, err := m.renew(ctx, a.id, a.delay)
	if errors.Is(err, ErrNotHeld) {
		return nil, ErrLostWhileWaiting
	}
	if err != nil {
		return nil, m.etcdErr(parent, "refresh lease", err)
	}
	m.grants.touch(a.key, refreshed)
	return m.grantOf(a, refreshed, time.Duration(ttl)*time.Second), nil
}

// claimOps is what a claim writes: the entry's record, marked granted now
// (held), and the lock-delay key if the entry asked for a lock delay.
func (m *Manager) claimOps(a *attempt) (record, []clientv3.Op) {
	held := a.rec
	held.Acquired = m.now().UnixNano()
	ops := []clientv3.Op{clientv3.OpPut(a.key, held.encode(), clientv3.WithIgnoreLease())}
	if a.delay != 0 {
		ops = append(ops, clientv3.OpPut(m.ks.SlotDelay(a.name, a.rec.Slot), "", clientv3.WithLease(a.delay)))
	}
	return held, ops
}
