package fence

import (
	"errors"
	"fmt"
	"sync"
)

// Errors of Guard and Gate; test with errors.Is.
var (
	// ErrStale: the token is below a token the resource has already
	// admitted, or the coordinator says it is not (or no longer) the
	// holder's. The error is a *StaleError.
	ErrStale = errors.New("fence: stale fencing token")
	// ErrMissing: the request carries no lock name or no token, or a token
	// that is not a positive decimal integer.
	ErrMissing = errors.New("fence: the request carries no valid lock name and fencing token")
	// ErrWrongLock: the request names a lock other than the one the gate
	// requires, or the coordinator binds the resource's mark to another
	// lock (MARK_OWNED_BY_OTHER_LOCK).
	ErrWrongLock = errors.New("fence: the request names a lock this resource is not protected by")
	// ErrUnavailable: the coordinator could not be asked; retry.
	ErrUnavailable = errors.New("fence: the coordinator could not validate the token; retry")
)

// StaleError is a refused token.
type StaleError struct {
	Lock  string
	Token int64
	// Highest is the greatest token the local Guard had admitted (0 when
	// the refusal came from the coordinator).
	Highest int64
	// Reason is the coordinator's reason (e.g. "REASON_FENCED"), empty when
	// the refusal came from the local Guard.
	Reason string
}

func (e *StaleError) Error() string {
	what := fmt.Sprintf("token %d", e.Token)
	if e.Lock != "" {
		what += fmt.Sprintf(" for lock %q", e.Lock)
	}
	if e.Reason != "" {
		return fmt.Sprintf("fence: %s refused by the coordinator: %s; the lock was lost: stop and acquire it again", what, e.Reason)
	}
	return fmt.Sprintf("fence: %s is below token %d already accepted; the lock was lost: stop and acquire it again", what, e.Highest)
}

// Is makes errors.Is(err, ErrStale) true.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// Guard is a local high-water mark for a resource served by one process.
// The zero value admits every positive token. It is safe for concurrent
// use; Do serializes the writes it guards.
type Guard struct {
	mu      sync.Mutex
	highest int64
}

// NewGuard returns a Guard whose mark starts at highest (e.g. the token
// stored with the resource's data when the process last stopped).
func NewGuard(highest int64) *Guard { return &Guard{highest: highest} }

// Highest is the greatest token admitted so far.
func (g *Guard) Highest() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.highest
}

// Do admits token if it is at least the highest admitted so far, raises the
// mark to it, and runs write while still holding the guard: no write with a
// lower token can start before write returns, nor afterwards. A refused
// token returns a *StaleError and write does not run. The mark is raised
// even if write fails: admitting a token proves every lower one stale.
func (g *Guard) Do(token int64, write func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.admitLocked(token); err != nil {
		return err
	}
	if write == nil {
		return nil
	}
	return write()
}

// Admit is Do without a write: it checks the token and raises the mark.
func (g *Guard) Admit(token int64) error { return g.Do(token, nil) }

func (g *Guard) admitLocked(token int64) error {
	if token <= 0 {
		return fmt.Errorf("%w: token %d is not positive", ErrMissing, token)
	}
	if token < g.highest {
		return &StaleError{Token: token, Highest: g.highest}
	}
	g.highest = token
	return nil
}
