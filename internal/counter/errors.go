package counter

import (
	"errors"
	"fmt"

	"github.com/coordinatord/coordinatord/internal/etcdx"
	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// FieldError is bad input (the field, and why); nothing was written.
type FieldError = keyspace.FieldError

var (
	// ErrUnavailable: etcd is unreachable or has no quorum (and the policy
	// is FailClosed); nothing was counted. Retry, with the same request id.
	ErrUnavailable = etcdx.ErrUnavailable
	// ErrStoreFull: etcd's store is full and refuses writes.
	ErrStoreFull = etcdx.ErrStoreFull
	// ErrRequestIDReused: the request id was used before, by the same
	// identity on the same counter, with other parameters.
	ErrRequestIDReused = errors.New("counter: request_id was used before with other parameters; use a new id for a new hit")
	// ErrShuttingDown: the service is closing; retry on another replica.
	ErrShuttingDown = errors.New("counter: the coordinator is shutting down")
)

// AlgorithmMismatchError: a hit of one algorithm on a live counter of the
// other.
type AlgorithmMismatchError struct {
	Name      string
	Algorithm Algorithm // the counter's
}

func (e *AlgorithmMismatchError) Error() string {
	return fmt.Sprintf("counter %q counts by %s until it resets; hit it with that algorithm, use another name, or Reset it", e.Name, e.Algorithm)
}
