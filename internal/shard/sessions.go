package shard

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/locktable"
)

// Sessions on the shard core. A session lives on the owner of its home
// shard, ShardOf(its id): its record (identity, the SHA-256 of its
// handle's secret, TTL) is written to etcd under
// <prefix>shards/sessions/%05d/<id> in the owner's guarded commits before
// OpenSession answers, and deleted when it closes or expires; its expiry
// is kept in memory and renewed by KeepAliveSession without a write (a new
// owner honours every session for a full TTL from its takeover, as it
// does grants). The locks held through a session live in their own
// shards' tables (locktable.Acquire.Session, handle the session's): the
// server fans a session's keep-alive and close out to them.

// SessionRecord is what etcd keeps of a session.
type SessionRecord struct {
	ID      string `json:"id"`
	Caller  string `json:"c,omitempty"`
	Owner   string `json:"o,omitempty"`
	TTLms   int64  `json:"ttl"`
	SinceMs int64  `json:"at"`
	Secret  string `json:"h"` // SHA-256 of the handle's secret, hex
}

// TTL is the session's TTL.
func (r SessionRecord) TTL() time.Duration { return time.Duration(r.TTLms) * time.Millisecond }

// sessionEntry is an open session on its home shard's owner.
type sessionEntry struct {
	rec     SessionRecord
	expires time.Time // on the owner's clock
}

// Session is an open session as its opener sees it.
type Session struct {
	ID        string
	Handle    string
	TTL       time.Duration
	ExpiresAt time.Time
}

// sessionsPrefix is where the sessions of a shard are kept.
func (o *Owner) sessionsPrefix(shard uint32) string {
	return fmt.Sprintf("%sshards/sessions/%05d/", o.prefix, shard)
}

// sessionShard is the home shard of a session id.
func (o *Owner) sessionShard(id string) *shardState { return o.shards[ShardOf(id, len(o.shards))] }

// OpenSession opens a session on a shard this member serves, so that no
// call needs forwarding; a member serving none answers NotServingError
// naming the owner of some shard, where the call is forwarded to.
func (o *Owner) OpenSession(ctx context.Context, ttl time.Duration, owner, caller string) (*Session, error) {
	var id string
	var s *shardState
	for range 16 * len(o.shards) {
		id = newSessionID()
		s = o.sessionShard(id)
		s.mu.Lock()
		err := o.serving(s)
		s.mu.Unlock()
		if err == nil {
			break
		}
		s = nil
	}
	if s == nil {
		s := o.sessionShard(id)
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := o.serving(s); err != nil {
			return nil, err
		}
		return nil, o.lostDuringCall(s)
	}
	secret := randomSecret()
	now := o.clock.Now()
	rec := SessionRecord{ID: id, Caller: caller, Owner: owner, TTLms: ttl.Milliseconds(), SinceMs: time.Now().UnixMilli(),
		Secret: locktable.SecretSum(secret)}
	v, _ := json.Marshal(rec) // strings and numbers always encode
	if err := o.writeSession(ctx, s, Op{Key: o.sessionsPrefix(s.n) + id, Value: string(v), Conflict: "session:" + id}, func() {
		if s.sessions == nil {
			s.sessions = map[string]*sessionEntry{}
		}
		s.sessions[id] = &sessionEntry{rec: rec, expires: now.Add(ttl)}
	}); err != nil {
		return nil, err
	}
	return &Session{ID: id, Handle: locktable.SessionHandle(id, secret), TTL: ttl, ExpiresAt: o.wall(now.Add(ttl))}, nil
}

// newSessionID is a random session id: "s" and 32 hex digits (never a
// grant id, which starts with the owner's term).
func newSessionID() string {
	b := randomSecret()
	return "s" + hex.EncodeToString(b[:])
}

// writeSession commits one session write on s (guarded by its owner key,
// in the committer's batches) and waits for it; applied runs under s.mu if
// it committed while s's table is still the one it was made for (else the
// next table loads the session from etcd, or no longer owns it).
func (o *Owner) writeSession(ctx context.Context, s *shardState, op Op, applied func()) error {
	done := make(chan error, 1)
	s.mu.Lock()
	if err := o.serving(s); err != nil {
		s.mu.Unlock()
		return err
	}
	o.submitOwn(s, []Op{op}, func(_ int64, err error, current bool) {
		if err == nil && current {
			applied()
		}
		done <- err
	})
	s.mu.Unlock()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%w: the session's write did not commit (%s); retry", lease.ErrUnavailable, err.Error())
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// session is the live session of the handle for the caller, on its home
// shard s (under s.mu, s served).
func (o *Owner) session(s *shardState, handle, caller string) (*sessionEntry, error) {
	id, secret, ok := locktable.ParseSessionHandle(handle)
	if !ok {
		return nil, lease.ErrSessionNotFound
	}
	e := s.sessions[id]
	if e == nil || !e.expires.After(o.clock.Now()) || !locktable.SecretMatches(secret, e.rec.Secret) {
		return nil, lease.ErrSessionNotFound
	}
	if e.rec.Caller != caller {
		return nil, lease.ErrSessionForbidden
	}
	return e, nil
}

// KeepAliveSession renews the session for its TTL, in memory, on its home
// shard's owner (NotServingError elsewhere). The locks held through it are
// renewed by RenewSessionGrants on each member.
func (o *Owner) KeepAliveSession(handle, caller string) (*locktable.Renewal, error) {
	id, _, ok := locktable.ParseSessionHandle(handle)
	if !ok {
		return nil, lease.ErrSessionNotFound
	}
	s := o.sessionShard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := o.serving(s); err != nil {
		return nil, err
	}
	e, err := o.session(s, handle, caller)
	if err != nil {
		return nil, err
	}
	e.expires = o.clock.Now().Add(e.rec.TTL())
	return &locktable.Renewal{TTL: e.rec.TTL(), ExpiresAt: o.wall(e.expires)}, nil
}

// CloseSession ends the session on its home shard's owner: no keep-alive
// renews it from now on, and its record is deleted. The locks held through
// it are released by ReleaseSessionGrants on each member.
func (o *Owner) CloseSession(ctx context.Context, handle, caller string) error {
	id, _, ok := locktable.ParseSessionHandle(handle)
	if !ok {
		return lease.ErrSessionNotFound
	}
	s := o.sessionShard(id)
	s.mu.Lock()
	if err := o.serving(s); err != nil {
		s.mu.Unlock()
		return err
	}
	if _, err := o.session(s, handle, caller); err != nil {
		s.mu.Unlock()
		return err
	}
	delete(s.sessions, id)
	s.mu.Unlock()
	return o.writeSession(ctx, s, Op{Key: o.sessionsPrefix(s.n) + id, Delete: true}, func() {})
}

// CheckSession is the session of the handle, for an Acquire through it on
// any member: from memory on its home shard's owner, else from etcd (its
// record exists until it closes or its owner expires it).
func (o *Owner) CheckSession(ctx context.Context, handle, caller string) (SessionRecord, error) {
	id, secret, ok := locktable.ParseSessionHandle(handle)
	if !ok {
		return SessionRecord{}, lease.ErrSessionNotFound
	}
	s := o.sessionShard(id)
	s.mu.Lock()
	if o.serving(s) == nil {
		e, err := o.session(s, handle, caller)
		s.mu.Unlock()
		if err != nil {
			return SessionRecord{}, err
		}
		return e.rec, nil
	}
	s.mu.Unlock()
	r, err := o.cli.Get(ctx, o.sessionsPrefix(s.n)+id)
	if err != nil {
		return SessionRecord{}, markErr(ctx, "read session", err)
	}
	var rec SessionRecord
	if len(r.Kvs) == 0 || json.Unmarshal(r.Kvs[0].Value, &rec) != nil || !locktable.SecretMatches(secret, rec.Secret) {
		return SessionRecord{}, lease.ErrSessionNotFound
	}
	if rec.Caller != caller {
		return SessionRecord{}, lease.ErrSessionForbidden
	}
	return rec, nil
}

// SessionGrants are the locks held through the session on the shards
// this member serves now.
func (o *Owner) SessionGrants(handle, caller string) []locktable.Holder {
	var out []locktable.Holder
	for _, s := range o.shards {
		s.mu.Lock()
		if o.serving(s) == nil {
			for _, h := range s.tab.SessionGrants(o.clock.Now(), handle, caller) {
				h.AcquiredAt, h.ExpiresAt = o.wall(h.AcquiredAt), o.wall(h.ExpiresAt)
				out = append(out, h)
			}
		}
		s.mu.Unlock()
	}
	return out
}

// RenewSessionGrants renews every lock held through the session on the
// shards this member serves (memory-only, as KeepAlive), and returns those
// whose names may (nil: all) allows, as renewed.
func (o *Owner) RenewSessionGrants(handle, caller string, may func(string) bool) []locktable.Holder {
	var out []locktable.Holder
	for _, s := range o.shards {
		s.mu.Lock()
		if o.serving(s) == nil {
			now := o.clock.Now()
			for _, h := range s.tab.SessionGrants(now, handle, caller) {
				s.tab.KeepAlive(now, locktable.CallID(o.nextCall.Add(1)), h.Name, h.Token, handle, caller) // its reply reaches nobody
			}
			o.flush(s)
			for _, h := range s.tab.SessionGrants(now, handle, caller) {
				if may == nil || may(h.Name) {
					h.AcquiredAt, h.ExpiresAt = o.wall(h.AcquiredAt), o.wall(h.ExpiresAt)
					out = append(out, h)
				}
			}
		}
		s.mu.Unlock()
	}
	return out
}

// ReleaseSessionGrants releases the locks held through the session on the
// shards this member serves whose names may (nil: all) allows, waits for
// their deletes, and returns those it released.
func (o *Owner) ReleaseSessionGrants(ctx context.Context, handle, caller string, may func(string) bool) ([]locktable.Holder, error) {
	type result struct {
		h   locktable.Holder
		ok  bool
		err error
	}
	var hs []locktable.Holder
	for _, h := range o.SessionGrants(handle, caller) {
		if may == nil || may(h.Name) {
			hs = append(hs, h)
		}
	}
	results := make(chan result, len(hs))
	for _, h := range hs {
		go func() {
			ok, err := o.Release(ctx, h.Name, h.Token, handle, caller)
			results <- result{h: h, ok: ok, err: err}
		}()
	}
	var out []locktable.Holder
	var firstErr error
	for range hs {
		r := <-results
		switch {
		case r.err != nil && firstErr == nil:
			firstErr = r.err
		case r.ok:
			out = append(out, r.h)
		}
	}
	return out, firstErr
}

// readSessions is every session etcd holds for the shard, each honoured
// for a full TTL from now (the takeover).
func (o *Owner) readSessions(ctx context.Context, shard uint32, now time.Time) (map[string]*sessionEntry, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	r, err := o.cli.Get(ctx, o.sessionsPrefix(shard), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := make(map[string]*sessionEntry, len(r.Kvs))
	for _, kv := range r.Kvs {
		var rec SessionRecord
		if err := json.Unmarshal(kv.Value, &rec); err != nil || rec.ID == "" || rec.TTLms <= 0 {
			return nil, fmt.Errorf("shard: session record %q is malformed", kv.Key)
		}
		out[rec.ID] = &sessionEntry{rec: rec, expires: now.Add(rec.TTL())}
	}
	return out, nil
}

// reapSessions deletes the sessions past their expiry on the shards this
// member serves; it runs every sessionReapInterval until the owner closes.
func (o *Owner) reapSessions() {
	t := time.NewTicker(sessionReapInterval)
	defer t.Stop()
	for {
		select {
		case <-o.ctx.Done():
			return
		case <-t.C:
		}
		for _, s := range o.shards {
			s.mu.Lock()
			if o.serving(s) == nil {
				now := o.clock.Now()
				for id, e := range s.sessions {
					if e.expires.After(now) {
						continue
					}
					delete(s.sessions, id)
					o.submitOwn(s, []Op{{Key: o.sessionsPrefix(s.n) + id, Delete: true}}, func(int64, error, bool) {})
				}
			}
			s.mu.Unlock()
		}
	}
}

// sessionReapInterval is how often expired sessions are deleted.
const sessionReapInterval = 200 * time.Millisecond
