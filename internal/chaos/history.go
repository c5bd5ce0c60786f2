package chaos

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Kind is an operation of the lock API.
type Kind int

// Operation kinds.
const (
	// Acquire: Token is the granted token when Outcome is OK.
	Acquire Kind = iota + 1
	// Validate: ValidateToken(Name, Token); OK means valid=true.
	Validate
	// KeepAlive by the grantee; Failed means NOT_FOUND.
	KeepAlive
	// Release by the grantee (right handle); OK means released=true.
	Release
	// ReleaseOther is a Release of Token with a handle that is not its
	// grantee's; it must never answer released=true.
	ReleaseOther
	// ValidateResource: ValidateToken(Name, Token, resource "res/"+Name);
	// OK means valid=true (and the resource's mark advanced to Token).
	ValidateResource
	// Watch is one Watch stream from start revision Token: OK when the
	// watcher ended it, Failed for OUT_OF_RANGE (compacted). It is not a
	// lock operation: the linearizability check leaves it out, the other
	// checkers (no INTERNAL, ...) see it.
	Watch
)

func (k Kind) String() string {
	return [...]string{"?", "acquire", "validate", "keepalive", "release", "release-other", "validate-resource", "watch"}[k]
}

// Outcome is what a call returned.
type Outcome int

// Outcomes.
const (
	// OK: granted / valid / renewed / released.
	OK Outcome = iota + 1
	// Failed: a definite negative answer (not granted, valid=false,
	// NOT_FOUND, released=false).
	Failed
	// Ambiguous: the call failed in a way that does not tell whether it took
	// effect (UNAVAILABLE, DEADLINE_EXCEEDED, transport errors).
	Ambiguous
)

func (o Outcome) String() string { return [...]string{"?", "ok", "failed", "ambiguous"}[o] }

// Op is one recorded operation. Times are nanoseconds since the recorder
// started (monotonic clock).
type Op struct {
	Client  int
	Name    string
	Kind    Kind
	Token   int64 // the argument; for Acquire, the granted token (0 unless OK)
	Outcome Outcome
	Call    int64
	Return  int64
	Err     string // the error of a failed or ambiguous call
	// Code is the gRPC code of Err (OK without an error).
	Code codes.Code
	// SafeUntil is the answer's safe_until (history time) for an Acquire
	// or KeepAlive that answered OK; 0 otherwise.
	SafeUntil int64
	// Limit is the semaphore limit the acquisition asked for (0 or 1: a
	// mutex); Shared marks a read-write lock's reader's acquisition (and the
	// operations on its grant).
	Limit  int32
	Shared bool
}

func (o Op) String() string {
	s := fmt.Sprintf("c%d %s(%q, %d) -> %s [%d..%d]", o.Client, o.Kind, o.Name, o.Token, o.Outcome, o.Call, o.Return)
	if o.SafeUntil != 0 {
		s += fmt.Sprintf(" safe_until=%d", o.SafeUntil)
	}
	if o.Err != "" {
		s += " " + o.Err
	}
	return s
}

// Recorder collects operations from concurrent clients.
type Recorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []Op
}

// NewRecorder starts a history now.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

// Now is the current history time.
func (r *Recorder) Now() int64 { return int64(time.Since(r.start)) }

// At converts a wall instant to history time.
func (r *Recorder) At(t time.Time) int64 { return int64(t.Sub(r.start)) }

// Add records a finished operation.
func (r *Recorder) Add(op Op) {
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
}

// Code is the gRPC code of a call's error: a context error of the caller's
// own is DEADLINE_EXCEEDED or CANCELLED (never UNKNOWN, which the checkers
// reserve for what the server answered).
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	if st, ok := status.FromError(err); ok {
		return st.Code()
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return status.FromContextError(err).Code()
	}
	return codes.Unknown
}

// Ops is a copy of the history so far.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Op(nil), r.ops...)
}

// Classify maps a call's error to an outcome: nil is OK, the definite
// negative codes (ABORTED: not granted within the wait; NOT_FOUND: the grant
// is gone; INVALID_ARGUMENT, FAILED_PRECONDITION) are Failed, everything
// else (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, transport errors, INTERNAL)
// is Ambiguous.
func Classify(err error) Outcome {
	if err == nil {
		return OK
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return Ambiguous
	}
	switch status.Code(err) {
	case codes.Aborted, codes.NotFound, codes.InvalidArgument, codes.FailedPrecondition:
		return Failed
	}
	return Ambiguous
}
