package lease

import (
	"errors"
	"fmt"

	"github.com/coordinatord/coordinatord/internal/etcdx"
	"github.com/coordinatord/coordinatord/internal/keyspace"
)

var (
	// ErrNotGranted: the lock was not granted within the requested wait.
	// Returned as *NotGrantedError, which carries the holder's token.
	ErrNotGranted = errors.New("lease: lock not granted within the wait")
	// ErrNotHeld: no live grant matches the name, token and handle (it
	// expired or was released, or the token or handle is wrong).
	ErrNotHeld = errors.New("lease: no live grant matches this name, token and handle; it expired or was released: stop working under the lock and acquire again")
	// ErrUnavailable: etcd is unreachable or has no quorum; the operation
	// may be retried.
	ErrUnavailable = etcdx.ErrUnavailable
	// ErrMaxHold: renewal refused because the grant reached its max hold;
	// the lease is left to end.
	ErrMaxHold = errors.New("lease: renewal refused: the grant reached its max hold; finish up, let it expire (or release it) and acquire again")
	// ErrLostWhileWaiting: the waiter's own lease ended (revoked, expired)
	// while it was queued; it is never granted.
	ErrLostWhileWaiting = errors.New("lease: the queue entry's lease ended while waiting (revoked or expired); acquire again")
	// ErrSessionBusy: the session already holds or waits for this lock.
	ErrSessionBusy = errors.New("lease: this session already holds or waits for this lock")
	// ErrShuttingDown: the manager is closing; retry on another replica.
	ErrShuttingDown = errors.New("lease: coordinator shutting down; retry on another replica")
	// ErrStoreFull: etcd refused a write because its store reached its
	// quota (etcd's NOSPACE alarm); writes fail until space is reclaimed
	// and the alarm disarmed, reads go on. Retry later.
	ErrStoreFull = etcdx.ErrStoreFull
)

// errLateRenewal: the renewal reached etcd, but this replica saw its answer
// only after the expiry it would promise (the process was paused, say): the
// lease may have ended and the lock passed on meanwhile, so it is reported
// as gone.
var errLateRenewal = fmt.Errorf("%w (the renewal's answer came after the expiry it would promise: the lease may have ended meanwhile)", ErrNotHeld)

// NotGrantedError reports who holds the lock when a wait ends ungranted.
type NotGrantedError struct {
	Name string
	// HolderToken is the current holder's token, 0 if the lock was free by
	// the time it was read.
	HolderToken int64
}

func (e *NotGrantedError) Error() string {
	return fmt.Sprintf("lease: lock %q not granted within the wait; held by token %d: retry later or wait longer", e.Name, e.HolderToken)
}

// Is makes errors.Is(err, ErrNotGranted) true.
func (e *NotGrantedError) Is(target error) bool { return target == ErrNotGranted }

// FieldError is bad input: Field names the request field, Reason says what
// is wrong with it. Nothing is written to etcd when it is returned.
type FieldError = keyspace.FieldError

func fieldErr(field, format string, args ...any) error {
	return keyspace.FieldErr(field, format, args...)
}

// LimitMismatchError: the queue of Name admits InForce holders (its oldest
// entry's limit, 1 for a mutex or a read-write lock) and the acquisition
// asked for Asked, or asked a semaphore's queue for a mode. The refused
// entry is withdrawn.
type LimitMismatchError struct {
	Name    string
	InForce int32
	Asked   int32
	Shared  bool // the refused acquisition was a reader's
}

func (e *LimitMismatchError) Error() string {
	if e.Shared {
		return fmt.Sprintf("lease: lock %q is a semaphore of limit %d; a shared (read-write) acquisition cannot join it: ask with limit %d and no mode", e.Name, e.InForce, e.InForce)
	}
	return fmt.Sprintf("lease: lock %q admits %d holder(s) (the limit in force); this acquisition asked for %d: every holder and waiter of a name must ask for the same limit", e.Name, e.InForce, e.Asked)
}
