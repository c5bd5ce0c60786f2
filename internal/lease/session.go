package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrSessionNotFound: the session expired, was closed, or the handle is wrong.
var ErrSessionNotFound = errors.New("lease: no live session matches this handle; it expired or was closed: its locks are gone, open a new session")

// sessionRef is a session an acquisition attaches to: its lease carries the
// queue key, and its handle proves ownership of every lock it holds.
type sessionRef struct {
	id     clientv3.LeaseID
	ttl    int64
	handle string
	hash   []byte
}

// WithSession attaches the acquisition to the session whose handle is h.
func WithSession(h string) AcquireOption {
	return func(o *acquireOptions) { o.sessionHandle = h }
}

type sessionRecord struct {
	Owner      string `json:"owner,omitempty"`
	HandleHash []byte `json:"hh"`
	Since      int64  `json:"since"`
	// Ident is the hash of the identity that opened the session (AsCaller),
	// "" if unauthenticated: the session answers that identity only. A
	// session opened by an older version records none, so under
	// authentication it answers nobody: it ends with its lease.
	Ident string `json:"ih,omitempty"`
}

func decodeSessionRecord(v []byte) sessionRecord {
	var rec sessionRecord
	_ = json.Unmarshal(v, &rec) // a foreign value reads as an empty record
	return rec
}

// Session is an open session.
type Session struct {
	Handle    string
	LeaseID   int64
	TTL       time.Duration
	ExpiresAt time.Time
	SafeUntil time.Time
}

// OpenSession creates a session: one lease that many locks can share. It
// belongs to the caller (AsCaller): its handle answers no other identity.
func (m *Manager) OpenSession(ctx context.Context, ttl time.Duration, owner string, opts ...CallOption) (*Session, error) {
	c := callOptionsOf(opts)
	ttl, err := m.SessionTTL(ttl, owner)
	if err != nil {
		return nil, err
	}
	start := m.now()
	lr, err := m.cli.Grant(ctx, int64((ttl+time.Second-1)/time.Second))
	if err != nil {
		return nil, m.etcdErr(ctx, "grant session lease", err)
	}
	handle, sum := newHandle(lr.ID)
	v, _ := json.Marshal(sessionRecord{Owner: owner, HandleHash: sum, Since: start.UnixNano(), Ident: callerHash(c.caller)})
	if _, err := m.cli.Put(ctx, m.ks.session(lr.ID), string(v), clientv3.WithLease(lr.ID)); err != nil {
		m.withdraw(&attempt{id: lr.ID})
		return nil, m.etcdErr(ctx, "write session", err)
	}
	d := time.Duration(lr.TTL) * time.Second
	exp := start.Add(d)
	return &Session{Handle: handle, LeaseID: int64(lr.ID), TTL: d, ExpiresAt: exp, SafeUntil: exp.Add(-SafetyMargin(d))}, nil
}

// sessionOf resolves a session handle presented by caller: ErrSessionNotFound
// if no live session has it, ErrSessionForbidden if another identity opened
// the session.
func (m *Manager) sessionOf(ctx context.Context, field, handle, caller string) (*sessionRef, error) {
	id, sum, err := parseHandle(handle)
	if err != nil {
		return nil, fieldErr(field, "is malformed; pass the session handle exactly as OpenSession returned it")
	}
	r, err := m.cli.Get(ctx, m.ks.session(id))
	if err != nil {
		return nil, m.etcdErr(ctx, "read session", err)
	}
	if len(r.Kvs) == 0 || clientv3.LeaseID(r.Kvs[0].Lease) != id {
		return nil, ErrSessionNotFound
	}
	rec := decodeSessionRecord(r.Kvs[0].Value)
	if !sameHash(rec.HandleHash, sum) {
		return nil, ErrSessionNotFound
	}
	if rec.Ident != callerHash(caller) {
		return nil, ErrSessionForbidden
	}
	t, err := m.cli.TimeToLive(ctx, id)
	if err != nil {
		return nil, m.etcdErr(ctx, "read session lease", err)
	}
	if t.TTL < 0 { // -1: gone; 0: under a second left
		return nil, ErrSessionNotFound
	}
	return &sessionRef{id: id, ttl: t.GrantedTTL, handle: handle, hash: sum}, nil
}

// sessionHolders lists the locks a session holds now, through its index.
func (m *Manager) sessionHolders(ctx context.Context, s *sessionRef) ([]Holder, []*held, error) {
	r, err := m.cli.Get(ctx, m.ks.sessionIndex(s.id), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, nil, m.etcdErr(ctx, "read session index", err)
	}
	var (
		hs    []Holder
		helds []*held
	)
	for _, kv := range r.Kvs {
		esc := strings.TrimPrefix(string(kv.Key), m.ks.sessionIndex(s.id))
		name := unescape(esc)
		k, err := m.cli.Get(ctx, m.ks.key(name, s.id))
		if err != nil {
			return nil, nil, m.etcdErr(ctx, "read session lock", err)
		}
		if len(k.Kvs) == 0 {
			continue
		}
		rec := decodeRecord(k.Kvs[0].Value)
		if rec.Acquired == 0 {
			continue // waiting
		}
		hs = append(hs, Holder{Name: name, Token: k.Kvs[0].CreateRevision, Owner: rec.Owner, AcquiredAt: unixTime(rec.Acquired)})
		helds = append(helds, &held{name: name, key: string(k.Kvs[0].Key), id: s.id, token: k.Kvs[0].CreateRevision, modRev: k.Kvs[0].ModRevision, rec: rec, session: true})
	}
	return hs, helds, nil
}

// KeepAliveSession renews the session's lease, and so all its locks, and
// lists the locks it holds (those in the caller's scope, InScope).
func (m *Manager) KeepAliveSession(ctx context.Context, handle string, opts ...CallOption) (*Renewal, []Holder, error) {
	c := callOptionsOf(opts)
	s, err := m.sessionOf(ctx, "handle", handle, c.caller)
	if err != nil {
		return nil, nil, err
	}
	start := m.now()
	ttl, err := m.renew(ctx, s.id, 0)
	if errors.Is(err, ErrNotHeld) {
		return nil, nil, ErrSessionNotFound
	}
	if err != nil {
		return nil, nil, m.etcdErr(ctx, "renew session", err)
	}
	hs, _, err := m.sessionHolders(ctx, s)
	if err != nil {
		return nil, nil, err
	}
	hs, _ = c.scoped(hs, nil)
	d := time.Duration(ttl) * time.Second
	exp := start.Add(d)
	if !m.now().Before(exp) {
		return nil, nil, fmt.Errorf("%w (the renewal's answer came after the expiry it would promise: the session may have ended meanwhile)", ErrSessionNotFound)
	}
	return &Renewal{TTL: d, ExpiresAt: exp, SafeUntil: exp.Add(-SafetyMargin(d))}, hs, nil
}

// CloseSession releases every lock of the session in the caller's scope
// (cleanly, InScope) and ends the session, and with it the rest of its
// locks. It reports false if the session was already gone.
func (m *Manager) CloseSession(ctx context.Context, handle string, opts ...CallOption) (bool, []Holder, error) {
	c := callOptionsOf(opts)
	s, err := m.sessionOf(ctx, "handle", handle, c.caller)
	if errors.Is(err, ErrSessionNotFound) {
		return false, nil, nil
	}
	if err != nil {
		return false, nil, err
	}
	hs, helds, err := m.sessionHolders(ctx, s)
	if err != nil {
		return false, nil, err
	}
	hs, helds = c.scoped(hs, helds)
	// End each grant as released (watchers see a release, not an expiry).
	for _, h := range helds {
		if _, err := m.end(ctx, h, endReleased); err != nil {
			return false, nil, err
		}
	}
	if _, err := m.cli.Revoke(ctx, s.id); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return false, nil, nil
		}
		return false, nil, m.etcdErr(ctx, "revoke session", err)
	}
	return true, hs, nil
}

// SessionTTL resolves a session's TTL (0: the default) and checks it and
// the owner label, as OpenSession does; it reads and writes nothing.
func (m *Manager) SessionTTL(ttl time.Duration, owner string) (time.Duration, error) {
	if ttl == 0 {
		ttl = m.defaultTTL
	}
	switch {
	case ttl < 0 || ttl < time.Second:
		return 0, fieldErr("ttl", "must be at least 1s, got %v", ttl)
	case ttl > m.maxTTL:
		return 0, fieldErr("ttl", "is %v; the server allows at most %v (--max-ttl)", ttl, m.maxTTL)
	}
	if err := validateOwner(owner); err != nil {
		return 0, err
	}
	return ttl, nil
}
