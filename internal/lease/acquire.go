package lease

import (
	"context"
	"errors"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Grant is a granted lock.
type Grant struct {
	Name      string
	Token     int64
	Handle    string
	LeaseID   int64
	TTL       time.Duration
	ExpiresAt time.Time
	// SafeUntil is ExpiresAt minus the safety margin (see SafetyMargin):
	// the instant the holder must stop working unless renewed.
	SafeUntil  time.Time
	AcquiredAt time.Time
	// Resumed is true when a retry with the same request id returned an
	// existing grant.
	Resumed bool
	// Slot is a semaphore holder's slot (0..limit-1); Shared marks a
	// read-write lock's reader.
	Slot   int32
	Shared bool
}

// SafetyMargin is how long before expires_at a holder must stop working:
// max(ttl/10, 500ms), at most ttl/2. It covers network delay and clock drift
// between the client and the server; etcd never expires a lease before the
// server's expires_at estimate.
func SafetyMargin(ttl time.Duration) time.Duration {
	return min(max(ttl/safetyMarginPart, minSafetyMargin), ttl/2)
}

// attempt is one acquisition in progress: its queue key and leases.
type attempt struct {
	name    string
	key     string
	queue   string
	id      clientv3.LeaseID // the lease of the queue key
	delay   clientv3.LeaseID // the lease of the lock-delay key, 0 if none
	ttl     int64            // seconds
	token   int64
	handle  string
	rec     record
	session bool   // id is a session's lease: withdraw by deleting the key, never revoke
	pred    target // the immediate predecessor when the attempt joined, if known (key "" if not)
	// reqRecord is the encoded request record a request-id join writes.
	reqRecord string
	modRev    int64 // the queue key's mod revision as this attempt last wrote or read it, 0 if unknown (withdraw.go)

	refreshed    time.Time // when the lease was refreshed alongside a claim
	refreshedTTL int64     // its TTL then, 0 if not refreshed
}

// Acquire queues for the lock and returns the grant. It fails with a
// *NotGrantedError when the wait elapses first, with ctx's error when ctx
// ends first, with a *FieldError on bad input (nothing written), with
// ErrLostWhileWaiting when the waiter's lease ends, and with ErrUnavailable
// or ErrShuttingDown; beyond a limit, with a *TooManyWaitersError or a
// *TooManyLocksError (limits.go). Whatever the failure, the caller's queue
// key is removed (or, if etcd cannot be reached, ends with its lease),
// unless a retry with the same request id may have taken it over
// (withdraw.go).
//
// The phases, one file each: the options, resolved and checked once
// (options.go); the start: a retry of a request id takes its acquisition
// over (retry.go), anything else joins the queue (join.go), granted at once
// when the lock is free; a queued caller waits until the queue admits it
// (wait.go, admission.go) and then claims the lock (claim.go).
func (m *Manager) Acquire(ctx context.Context, name string, opts ...AcquireOption) (*Grant, error) {
	o, err := m.resolveOptions(ctx, name, opts)
	if err != nil {
		return nil, err
	}
	parent := ctx
	ctx, done, err := m.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	timeout, stop := waitTimer(o) // the wait counts from here, the join included
	defer stop()
	p, err := m.start(ctx, parent, name, o)
	if err != nil || p.grant != nil {
		return p.grant, err
	}
	return m.queued(ctx, parent, p.waiter, o, timeout)
}

// placed is where the start of an acquisition left the caller: granted
// (grant) or waiting in the queue (waiter). Exactly one is set, unless
// nothing was found to place (see retryRequest).
type placed struct {
	grant  *Grant
	waiter *attempt
}

func (p placed) found() bool { return p.grant != nil || p.waiter != nil }

// waitTimer fires when o's wait elapses; nil (never) when the wait is
// unbounded or 0 (try once: queued gives up without waiting).
func waitTimer(o acquireOptions) (<-chan time.Time, func()) {
	if !o.hasWait || o.wait <= 0 {
		return nil, func() {}
	}
	t := time.NewTimer(o.wait)
	return t.C, func() { t.Stop() }
}

// start takes over the acquisition of o.requestID if there is one, or
// joins the queue.
func (m *Manager) start(ctx, parent context.Context, name string, o acquireOptions) (placed, error) {
	if o.requestID != "" {
		if p, err := m.retryRequest(ctx, parent, name, o); err != nil || p.found() {
			return p, err
		}
	}
	return m.join(ctx, parent, name, o)
}

// queued waits until the queue admits a queued attempt, then claims the
// lock for it; whatever fails withdraws the attempt's entry.
func (m *Manager) queued(ctx, parent context.Context, a *attempt, o acquireOptions, timeout <-chan time.Time) (*Grant, error) {
	if o.hasWait && o.wait == 0 {
		return m.tryOnce(ctx, parent, a)
	}
	if err := m.wait(ctx, parent, a, timeout); err != nil {
		m.withdraw(a)
		return nil, err
	}
	g, err := m.claim(ctx, parent, a)
	if err != nil && !errors.Is(err, ErrLostWhileWaiting) {
		m.withdraw(a)
	}
	return g, err
}

// tryOnce answers a try-lock (wait 0) that did not hold at once: refused,
// unless a reader's or a semaphore's entry, whose admission no join
// compares, is admitted by one read; then it claims.
func (m *Manager) tryOnce(ctx, parent context.Context, a *attempt) (*Grant, error) {
	if q := m.admissionOf(a); !q.comparable() {
		t, slot, op, err := q.blocker(ctx, m.cli, a.token)
		var mismatch *LimitMismatchError
		switch {
		case errors.As(err, &mismatch):
			m.withdraw(a)
			return nil, err
		case err != nil:
			m.withdraw(a)
			return nil, m.etcdErr(parent, op, err)
		case t.key == "":
			a.rec.Slot = slot
			g, err := m.claim(ctx, parent, a)
			if err != nil && !errors.Is(err, ErrLostWhileWaiting) {
				m.withdraw(a)
			}
			return g, err
		}
	}
	holder := m.holderToken(ctx, a.name)
	m.withdraw(a)
	return nil, &NotGrantedError{Name: a.name, HolderToken: holder}
}

// grantOf is the grant of a, its lease refreshed at refreshed for ttl.
func (m *Manager) grantOf(a *attempt, refreshed time.Time, ttl time.Duration) *Grant {
	exp := refreshed.Add(ttl)
	return &Grant{Name: a.name, Token: a.token, Handle: a.handle, LeaseID: int64(a.id), TTL: ttl,
		ExpiresAt: exp, SafeUntil: exp.Add(-SafetyMargin(ttl)), AcquiredAt: unixTime(a.rec.Acquired),
		Slot: a.rec.Slot, Shared: a.rec.Shared}
}
