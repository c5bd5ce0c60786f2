package lease

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// held is a live grant found by lookup.
type held struct {
	name    string
	key     string
	id      clientv3.LeaseID
	token   int64
	modRev  int64
	rec     record
	session bool
	// refreshed: when this manager last sent a refresh of the lease (zero
	// if unknown).
	refreshed time.Time
}

// lookup returns the grant (name, token, handle), or ErrNotHeld; for a grant
// held through a session, ErrSessionForbidden unless caller opened it.
func (m *Manager) lookup(ctx context.Context, name string, token int64, handle, caller string) (*held, error) {
	if err := ValidateName("name", name, false); err != nil {
		return nil, err
	}
	if err := ValidateToken(token); err != nil {
		return nil, err
	}
	id, sum, err := parseHandle(handle)
	if err != nil {
		return nil, err
	}
	key := m.ks.key(name, id)
	r, err := m.cli.Get(ctx, key)
	if err != nil {
		return nil, m.etcdErr(ctx, "read grant", err)
	}
	if len(r.Kvs) == 0 {
		return nil, ErrNotHeld
	}
	kv := r.Kvs[0]
	rec := decodeRecord(kv.Value)
	if kv.CreateRevision != token || clientv3.LeaseID(kv.Lease) != id || !sameHash(rec.HandleHash, sum) || rec.Acquired == 0 {
		return nil, ErrNotHeld
	}
	h := &held{name: name, key: key, id: id, token: token, modRev: kv.ModRevision, rec: rec, session: rec.Session}
	if h.session {
		if err := m.checkSessionOwner(ctx, h, caller); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// cachedGrant returns the grant (name, token, handle) as this manager
// granted it, or nil if it has no record of it (then lookup reads it).
func (m *Manager) cachedGrant(name string, token int64, handle string) *held {
	id, sum, err := parseHandle(handle)
	if err != nil || token <= 0 {
		return nil
	}
	key := m.ks.key(name, id)
	g, ok := m.grants.get(key)
	if !ok || g.token != token || !sameHash(g.rec.HandleHash, sum) || g.rec.Acquired == 0 {
		return nil
	}
	return &held{name: name, key: key, id: id, token: token, modRev: g.modRev, rec: g.rec, session: g.rec.Session, refreshed: g.refreshed}
}

// remember records a grant this manager just made (for cachedGrant), and
// when it sent the refresh of its lease (zero if it did not).
func (m *Manager) remember(a *attempt, modRev int64, refreshed time.Time) {
	m.grants.put(a.key, cachedGrant{token: a.token, modRev: modRev, rec: a.rec, refreshed: refreshed})
}

// Renewal is the outcome of KeepAlive.
type Renewal struct {
	TTL       time.Duration
	ExpiresAt time.Time
	SafeUntil time.Time
}

// KeepAlive renews the grant's lease for a full TTL. ErrNotHeld if the grant
// is gone or the token or handle does not match it; ErrMaxHold once the
// grant reached its max hold (the lease is left to end);
// ErrSessionForbidden if it is held through another identity's session.
func (m *Manager) KeepAlive(ctx context.Context, name string, token int64, handle string, opts ...CallOption) (*Renewal, error) {
	h, err := m.lookup(ctx, name, token, handle, callOptionsOf(opts).caller)
	if err != nil {
		return nil, err
	}
	start := m.now()
	if h.rec.MaxHold > 0 && !start.Before(unixTime(h.rec.Acquired).Add(time.Duration(h.rec.MaxHold))) {
		return nil, ErrMaxHold
	}
	ttl, err := m.renew(ctx, h.id, clientv3.LeaseID(h.rec.DelayLease))
	if err != nil {
		if errors.Is(err, ErrNotHeld) {
			return nil, err
		}
		return nil, m.etcdErr(ctx, "renew lease", err)
	}
	d := time.Duration(ttl) * time.Second
	exp := start.Add(d)
	if !m.now().Before(exp) {
		return nil, errLateRenewal
	}
	m.grants.touch(h.key, start)
	return &Renewal{TTL: d, ExpiresAt: exp, SafeUntil: exp.Add(-SafetyMargin(d))}, nil
}

// Release ends the grant and frees the lock at once (no lock-delay). It
// reports false, changing nothing, when the grant already ended or the token
// or handle does not match it; ErrSessionForbidden if it is held through
// another identity's session.
func (m *Manager) Release(ctx context.Context, name string, token int64, handle string, opts ...CallOption) (bool, error) {
	caller := callOptionsOf(opts).caller
	if h := m.cachedGrant(name, token, handle); h != nil && !h.session {
		ok, err := m.end(ctx, h, endReleased)
		if ok || err != nil {
			return ok, err
		}
		// Changed since: read it.
	}
	h, err := m.lookup(ctx, name, token, handle, caller)
	if errors.Is(err, ErrNotHeld) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return m.end(ctx, h, endReleased)
}

// holderEntry is the entry of name's holder of token, or nil if token is
// no holder's: the oldest entry (a mutex's holder, read alone as before
// semaphores), or, behind a reader's or a semaphore's oldest entry, the
// entry of token if the queue admits it.
func (m *Manager) holderEntry(ctx context.Context, name string, token int64) (*mvccpb.KeyValue, error) {
	q := m.admission(name)
	key, opts := q.holderRead()
	r, err := m.cli.Get(ctx, key, opts...)
	if err != nil {
		return nil, m.etcdErr(ctx, "read holder", err)
	}
	if len(r.Kvs) == 0 || r.Kvs[0].CreateRevision > token {
		return nil, nil
	}
	if r.Kvs[0].CreateRevision == token {
		return r.Kvs[0], nil
	}
	if s, _ := keyspace.ShapeOf(r.Kvs[0].Value); s.Plain() {
		return nil, nil // a mutex's or a writer's: the only holder
	}
	r, err = m.cli.Get(ctx, q.queue, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(token),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, m.etcdErr(ctx, "read holders", err)
	}
	n := len(r.Kvs)
	if n == 0 || r.Kvs[n-1].CreateRevision != token || !q.admittedAt(shapesOf(r.Kvs), n-1) {
		return nil, nil
	}
	return r.Kvs[n-1], nil
}

// ForceRelease ends the current grant of name if its token is token, as an
// operator would: the holder's lock-delay, if any, applies. It reports false
// when token is not the current holder's.
func (m *Manager) ForceRelease(ctx context.Context, name string, token int64) (bool, error) {
	if err := ValidateName("name", name, false); err != nil {
		return false, err
	}
	if err := ValidateToken(token); err != nil {
		return false, err
	}
	kv, err := m.holderEntry(ctx, name, token)
	if err != nil || kv == nil {
		return false, err
	}
	rec := decodeRecord(kv.Value)
	h := &held{name: name, key: string(kv.Key), id: clientv3.LeaseID(kv.Lease), token: token, modRev: kv.ModRevision, rec: rec, session: rec.Session}
	return m.end(ctx, h, endForced)
}
