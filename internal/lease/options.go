package lease

import (
	"context"
	"time"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// Acquire's options: what a caller may ask of one acquisition, and the
// checks that refuse bad input before anything is read or written.

type acquireOptions struct {
	ttl       time.Duration
	wait      time.Duration
	hasWait   bool
	owner     string
	requestID string
	maxHold   time.Duration
	lockDelay time.Duration
	session   *sessionRef
	// sessionHandle is resolved to session by resolveOptions.
	sessionHandle string
	identity      string         // WithIdentity
	caller        string         // WithCaller
	given         given          // which grant parameters the caller set (for the request digest)
	limit         int32          // WithLimit
	mode          Mode           // WithMode
	shape         keyspace.Shape // of limit and mode, set by checkShape
}

// AcquireOption configures one Acquire.
type AcquireOption func(*acquireOptions)

// WithTTL asks for a lease TTL; it is rounded up to a whole second.
func WithTTL(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.ttl, o.given = d, o.given|givenTTL }
}

// WithWait bounds the wait in the queue; 0 means try once. Without it,
// Acquire waits until ctx ends.
func WithWait(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.wait, o.hasWait = d, true }
}

// WithOwner describes the caller for Describe and List.
func WithOwner(s string) AcquireOption { return func(o *acquireOptions) { o.owner = s } }

// WithRequestID makes Acquire idempotent: a retry by the same caller
// (WithCaller) with the same id, name and parameters returns the same grant
// (same token and handle) while it lives, or takes the same queue position
// while it waits; with other parameters it fails with ErrRequestIDReused,
// writing nothing. Another caller's id is another key (request.go). The id
// must be unguessable: with the caller's identity, it takes over the
// acquisition.
func WithRequestID(id string) AcquireOption { return func(o *acquireOptions) { o.requestID = id } }

// WithMaxHold bounds renewals: KeepAlive past AcquiredAt+d fails with
// ErrMaxHold. Without it the manager's cap applies.
func WithMaxHold(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.maxHold, o.given = d, o.given|givenMaxHold }
}

// WithLockDelay asks that, if this grant ends involuntarily (expiry or
// force-release), the next grant of the lock waits d. A clean release never
// delays.
func WithLockDelay(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.lockDelay, o.given = d, o.given|givenLockDelay }
}

// WithLimit makes the lock a counting semaphore of n holders (n > 1); 0 or
// 1 is a mutex. Every acquisition of a name must ask for the same limit
// (*LimitMismatchError).
func WithLimit(n int32) AcquireOption { return func(o *acquireOptions) { o.limit = n } }

// Mode is how an acquisition shares its lock.
type Mode int

// Modes: unspecified and exclusive are the same (a writer, or a mutex).
const (
	ModeUnspecified Mode = iota
	ModeExclusive
	ModeShared
)

// WithMode makes the acquisition a read-write lock's writer (ModeExclusive,
// as a mutex is) or reader (ModeShared).
func WithMode(mode Mode) AcquireOption { return func(o *acquireOptions) { o.mode = mode } }

// checkShape refuses a limit or mode that no queue has (a negative or too
// large limit, an unknown mode, a limit with a mode, a reader with a lock
// delay) and sets the entry's shape.
func (o *acquireOptions) checkShape() error {
	switch l := o.limit; {
	case o.mode < ModeUnspecified || o.mode > ModeShared:
		return fieldErr("mode", "is not a known mode (%d); use LOCK_MODE_EXCLUSIVE or LOCK_MODE_SHARED", o.mode)
	case l < 0:
		return fieldErr("limit", "must not be negative, got %d; leave it unset (or 1) for a mutex", l)
	case l > keyspace.MaxLimit:
		return fieldErr("limit", "is %d; at most %d holders are allowed", l, keyspace.MaxLimit)
	case l > 1 && o.mode != ModeUnspecified:
		return fieldErr("mode", "must be unset with limit %d: a semaphore's permits are all alike (a mode makes a read-write lock, whose limit is 1)", l)
	case o.mode == ModeShared && o.lockDelay > 0:
		return fieldErr("lock_delay", "is not supported for a shared (reader's) acquisition: a reader changes nothing a writer's delay protects")
	}
	o.shape = keyspace.Shape{Shared: o.mode == ModeShared}
	if o.limit > 1 {
		o.shape.Limit = o.limit
	}
	return nil
}

// resolveOptions is the options of one Acquire, resolved and checked once:
// acquireOptions, then the session handle (if any) resolved to its session,
// whose lease the lock will be held on, and the options checked against it.
func (m *Manager) resolveOptions(ctx context.Context, name string, opts []AcquireOption) (acquireOptions, error) {
	o, err := m.acquireOptions(name, opts)
	if err != nil || o.sessionHandle == "" {
		return o, err
	}
	if o.session, err = m.sessionOf(ctx, "session_handle", o.sessionHandle, o.caller); err != nil {
		return o, err
	}
	return o, o.checkSession()
}

// acquireOptions applies opts over the manager's defaults and refuses bad
// input (a *FieldError naming the field) before anything is read or
// written.
func (m *Manager) acquireOptions(name string, opts []AcquireOption) (acquireOptions, error) {
	o := acquireOptions{ttl: m.defaultTTL, maxHold: m.maxHold}
	for _, opt := range opts {
		opt(&o)
	}
	if err := m.caps.capWait(&o); err != nil { // first: beyond the cap is the answer whatever else is wrong
		return o, err
	}
	if err := ValidateName("name", name, false); err != nil {
		return o, err
	}
	switch {
	case o.ttl <= 0:
		return o, fieldErr("ttl", "must be at least 1s, got %v", o.ttl)
	case o.ttl > m.maxTTL:
		return o, fieldErr("ttl", "is %v; the server allows at most %v (--max-ttl)", o.ttl, m.maxTTL)
	}
	if o.hasWait && o.wait < 0 {
		return o, fieldErr("wait", "must not be negative, got %v; use 0 to try once or leave it unset to wait until your deadline", o.wait)
	}
	switch {
	case o.maxHold <= 0:
		return o, fieldErr("max_hold", "must be positive, got %v; leave it unset for the server's cap %v", o.maxHold, m.maxHold)
	case o.maxHold > m.maxHold:
		return o, fieldErr("max_hold", "is %v; the server allows at most %v (--max-hold)", o.maxHold, m.maxHold)
	}
	switch {
	case o.lockDelay < 0:
		return o, fieldErr("lock_delay", "must not be negative, got %v", o.lockDelay)
	case o.lockDelay > m.maxDelay:
		return o, fieldErr("lock_delay", "is %v; the server allows at most %v (--max-lock-delay)", o.lockDelay, m.maxDelay)
	}
	if err := validateOwner(o.owner); err != nil {
		return o, err
	}
	if err := validateRequestID(o.requestID); err != nil {
		return o, err
	}
	if err := o.checkShape(); err != nil {
		return o, err
	}
	return o, nil
}

// checkSession refuses what a lock held through a session cannot have. The
// session's lease and TTL replace the acquisition's own.
func (o acquireOptions) checkSession() error {
	if o.lockDelay > 0 {
		return fieldErr("lock_delay", "is not supported for locks held through a session")
	}
	if o.requestID != "" {
		return fieldErr("request_id", "is not supported for locks held through a session: the session already makes a retry safe (a second Acquire of the same lock answers FAILED_PRECONDITION)")
	}
	return nil
}

// Checked is an acquisition's parameters, resolved over the manager's
// defaults and checked as Acquire checks them (a *FieldError naming the
// field, nothing written): for the shard-owner core, which decides the
// acquisition itself. TTL is rounded up to a whole second as Acquire
// rounds it; Wait is negative when the caller waits until its deadline.
type Checked struct {
	TTL, Wait, MaxHold, LockDelay time.Duration
	Owner, RequestID, Caller      string
	Limit                         int32
	Shared                        bool
	SessionHandle                 string
}

// Check resolves and checks an acquisition's options without reading or
// writing anything.
func (m *Manager) Check(name string, opts ...AcquireOption) (Checked, error) {
	o, err := m.acquireOptions(name, opts)
	if err != nil {
		return Checked{}, err
	}
	c := Checked{TTL: (o.ttl + time.Second - 1).Truncate(time.Second), Wait: -1, MaxHold: o.maxHold, LockDelay: o.lockDelay,
		Owner: o.owner, RequestID: o.requestID, Caller: o.caller, Limit: o.limit, Shared: o.mode == ModeShared,
		SessionHandle: o.sessionHandle}
	if o.hasWait {
		c.Wait = o.wait
	}
	return c, nil
}
