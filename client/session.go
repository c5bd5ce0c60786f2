package client

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// Session is one lease that many grants share: every lock acquired through
// it lives on the session's lease, so one KeepAlive renews them all, and
// the session's end (Close, or no renewal within its TTL) ends them all.
// Nothing renews a session in the background: call KeepAlive well within
// its TTL. A session belongs to the identity that opened it; Handle is its
// secret, and the handle of each of its grants. Never log it.
type Session struct {
	c      *Client
	Handle string
	// LeaseID is the etcd lease of the session (informational).
	LeaseID int64
	// TTL is the session lease's TTL; ExpiresAt and SafeUntil are as in
	// Grant, as of the opening.
	TTL                  time.Duration
	ExpiresAt, SafeUntil time.Time
}

// String shows the session without its handle.
func (s *Session) String() string {
	return fmt.Sprintf("session of lease %x, TTL %v (handle hidden)", s.LeaseID, s.TTL)
}

type sessionOptions struct {
	ttl   time.Duration
	owner string
}

// SessionOption configures OpenSession.
type SessionOption func(*sessionOptions)

// WithSessionTTL asks for the session lease's TTL (default: the
// coordinator's, as for WithTTL).
func WithSessionTTL(d time.Duration) SessionOption { return func(o *sessionOptions) { o.ttl = d } }

// WithSessionOwner describes the caller, as WithOwner does.
func WithSessionOwner(s string) SessionOption { return func(o *sessionOptions) { o.owner = s } }

// OpenSession opens a session. UNAVAILABLE is not retried: an answer lost
// would leave a second session behind, to end with its TTL.
func (c *Client) OpenSession(ctx context.Context, opts ...SessionOption) (*Session, error) {
	o := sessionOptions{}
	for _, opt := range opts {
		opt(&o)
	}
	req := &coordinatorv1.OpenSessionRequest{Owner: o.owner}
	if o.ttl != 0 {
		req.Ttl = durationpb.New(o.ttl)
	}
	resp, err := c.lc.OpenSession(ctx, req)
	if err != nil {
		return nil, err
	}
	return &Session{c: c, Handle: resp.GetHandle(), LeaseID: resp.GetLeaseId(), TTL: resp.GetTtl().AsDuration(),
		ExpiresAt: asTime(resp.GetExpiresAt()), SafeUntil: asTime(resp.GetSafeUntil())}, nil
}

// ResumeSession is the session whose secret handle is handle, opened
// earlier, maybe by another process (coordctl's session commands pass the
// handle so). KeepAlive, Close and Acquire work on it as on the Session
// OpenSession returned; its LeaseID, TTL and times are zero: KeepAlive
// tells the TTL and times. The call makes no request: a handle that is not
// a live session's is found out by the first call (NOT_FOUND).
func (c *Client) ResumeSession(handle string) *Session { return &Session{c: c, Handle: handle} }

// Acquire acquires the lock name through the session, as AcquireGrant
// does; WithTTL and WithRequestID do not apply (the session's lease is the
// grant's) and WithLockDelay is refused. The grant's Handle is the
// session's. A session holds or waits for a lock at most once: a second
// Acquire of the same name answers FAILED_PRECONDITION. For that reason
// UNAVAILABLE is not retried (a retry after a lost answer would be refused
// so): Describe the lock, or acquire again after a FAILED_PRECONDITION.
func (s *Session) Acquire(ctx context.Context, name string, opts ...AcquireOption) (Grant, error) {
	o := resolveAcquire(opts)
	o.ttl, o.requestID, o.session = 0, "", s.Handle
	g, _, err := s.c.acquire(ctx, name, o)
	return g, err
}

// KeepAlive renews the session's lease, and so every grant held through
// it, and returns the locks held through it now. UNAVAILABLE is retried
// until ctx ends; NOT_FOUND once the session is gone.
func (s *Session) KeepAlive(ctx context.Context) (Renewal, []Holder, error) {
	var resp *coordinatorv1.KeepAliveSessionResponse
	err := s.c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = s.c.lc.KeepAliveSession(ctx, &coordinatorv1.KeepAliveSessionRequest{Handle: s.Handle})
		return err
	})
	if err != nil {
		return Renewal{}, nil, err
	}
	r := Renewal{TTL: resp.GetTtl().AsDuration(), ExpiresAt: asTime(resp.GetExpiresAt()), SafeUntil: asTime(resp.GetSafeUntil())}
	return r, holdersOf(resp.GetHolders()), nil
}

// Close ends the session and releases every lock held through it at once
// (cleanly: no lock-delay). It reports whether this call ended the session,
// and the locks it released. UNAVAILABLE is retried until ctx ends (a retry
// after a lost answer reports false: the session is gone either way).
func (s *Session) Close(ctx context.Context) (bool, []Holder, error) {
	var resp *coordinatorv1.CloseSessionResponse
	err := s.c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = s.c.lc.CloseSession(ctx, &coordinatorv1.CloseSessionRequest{Handle: s.Handle})
		return err
	})
	if err != nil {
		return false, nil, err
	}
	return resp.GetClosed(), holdersOf(resp.GetReleased()), nil
}

func holdersOf(hs []*coordinatorv1.Holder) []Holder {
	out := make([]Holder, 0, len(hs))
	for _, h := range hs {
		out = append(out, *holderOf(h))
	}
	return out
}
