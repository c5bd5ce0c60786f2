package locktable

import "time"

// CallID names one call in progress; the owner picks it and the table
// answers it by it, exactly once.
type CallID uint64

// Acquire is a request for a lock, already validated by its caller (names,
// durations and limits are in range).
type Acquire struct {
	Call      CallID
	Name      string
	Caller    string // the authenticated identity ("" when authentication is off)
	Owner     string // a free-form label shown in Describe
	RequestID string // "" or the caller's idempotency key
	TTL       time.Duration
	Wait      time.Duration // 0: try once
	MaxHold   time.Duration // 0: no bound on renewals
	LockDelay time.Duration // after an expiry (not a release) the lock stays free of holders this long
	Limit     int32         // 0 or 1: a mutex (or a read-write lock); N > 1: a semaphore of N
	Shared    bool          // a read-write lock's reader
	// Secret is 16 random bytes from the owner: the secret of the handle
	// (ignored with a RequestID, whose handle is derived from it, so that a
	// retry on any owner gets the same handle). With a Session, it is the
	// session's secret, and the handle is the session's.
	Secret [16]byte
	// Session is the id of the session the grant is held through ("" for
	// none): its handle is the session's handle, and the session's
	// keep-alives and close reach it by this id (SessionGrants).
	Session string
	// Reservation is the id of the slot of its caller's per-identity lock
	// count the acquisition holds ("" for none): kept in the grant's
	// record, where any owner of the grant finds it (reservation.go).
	Reservation string
}

// Outcome is how a call ended.
type Outcome int

// Outcomes.
const (
	// Granted: Grant is the caller's (Resumed when a retry found it).
	Granted Outcome = iota + 1
	// Released: Released says whether the call ended a grant.
	Released
	// Renewed: Renewal is the new expiry.
	Renewed
	// NotGranted: the wait elapsed; HolderToken is the current holder's.
	NotGranted
	// NotHeld: no live grant matches the name, token and handle.
	NotHeld
	// MaxHoldReached: the renewal is refused, the grant reached its max hold.
	MaxHoldReached
	// RequestIDReused: the request id was sent with other parameters.
	RequestIDReused
	// TooManyWaiters: the lock's queue is full (Limit of Reply).
	TooManyWaiters
	// LimitMismatch: the lock is in force with another limit or mode
	// (InForce of Reply).
	LimitMismatch
	// Forbidden: the grant or request belongs to another identity.
	Forbidden
	// Cancelled: the owner cancelled the call (its caller went away).
	Cancelled
	// SessionBusy: the session already holds or waits for this lock.
	SessionBusy
	// Unavailable: the table was dropped (ownership lost, an unknown
	// commit outcome); the call may be retried, with its request id.
	Unavailable
)

// Reply is the answer to one call.
type Reply struct {
	Call        CallID
	Outcome     Outcome
	Grant       *Grant
	Released    bool
	Renewal     Renewal
	HolderToken int64 // NotGranted: the current holder's token, 0 if free
	InForce     int32 // LimitMismatch: the limit in force; TooManyWaiters: the limit
	Shared      bool  // LimitMismatch: the lock is a read-write lock
}

// Grant is a granted lock as its holder sees it.
type Grant struct {
	Name       string
	Token      int64
	Handle     string
	TTL        time.Duration
	ExpiresAt  time.Time
	AcquiredAt time.Time
	Resumed    bool
	Slot       int32
	Shared     bool
	Limit      int32
}

// Renewal is the expiry a KeepAlive moved a grant to.
type Renewal struct {
	TTL       time.Duration
	ExpiresAt time.Time
}

// Unit is a set of etcd writes that must commit together, in order with the
// table's other units. Its revision is the token of every grant it puts.
type Unit struct {
	ID  uint64
	Ops []Op
}

// Op is one etcd write: a put of a grant's key and record, a delete, or
// a put of a lock's end marker (Ephemeral, ended.go).
type Op struct {
	Key    string
	Value  string // the grant's record (or the end marker), for a put
	Delete bool
	Name   string // the lock the key belongs to
	// Ephemeral: a put that lives only as long as the owner's member (an
	// end marker): the owner writes it on its member's etcd lease.
	Ephemeral bool
}

// Ready is what the owner must do after a step: persist the units in
// order, send the replies, tell the watchers of the grants that ended.
type Ready struct {
	Units   []Unit
	Replies []Reply
	// Ended are the grants whose end this step made final: every grant
	// whose delete committed (Committed), and every visible grant of a
	// table dropped by Fail (Dropped). A grant is reported once per table
	// it lived in: a grant dropped with a table is loaded again by the
	// next one (Load), which reports its end in turn.
	Ended []Ended
}

// Ended is a grant the table no longer holds. At most one flag is set;
// none: released with its handle (Release, or the table's own release of
// a grant nobody was left to answer).
type Ended struct {
	Name    string
	Token   int64
	Expired bool // its TTL (or max hold) ran out without a renewal
	Forced  bool // ForceRelease ended it
	// Dropped: the table was dropped (Fail), not the grant. It may live
	// on in etcd and in the next table; only that table can tell.
	Dropped bool
}
