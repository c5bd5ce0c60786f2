package client

import (
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// The reasons the SDK itself switches on. Every coordinatord error carries
// one reason (api/coordinator/v1/errors.proto lists them all, as
// ERROR_REASON_<reason>); compare ReasonOf(err) with these, or with
// Reason(coordinatorv1.ErrorReason_ERROR_REASON_...) for the others.
const (
	ReasonLockHeld         = "LOCK_HELD"          // ABORTED: not granted within the wait; see HeldError
	ReasonNotHeld          = "NOT_HELD"           // NOT_FOUND: the grant is gone
	ReasonLostWhileWaiting = "LOST_WHILE_WAITING" // NOT_FOUND: the waiter's lease ended in the queue
	ReasonSessionNotFound  = "SESSION_NOT_FOUND"  // NOT_FOUND: the session is gone
	ReasonMaxHoldReached   = "MAX_HOLD_REACHED"   // FAILED_PRECONDITION: renewal past max hold
	ReasonRequestIDReused  = "REQUEST_ID_REUSED"  // FAILED_PRECONDITION: a request id reused with other parameters
)

// errorDomain is the ErrorInfo domain of coordinatord's errors.
const errorDomain = "coordinatord"

// Reason is the wire reason of an ErrorReason value: its name without the
// ERROR_REASON_ prefix (ERROR_REASON_LOCK_HELD is "LOCK_HELD").
func Reason(r coordinatorv1.ErrorReason) string {
	return strings.TrimPrefix(r.String(), "ERROR_REASON_")
}

// ReasonOf is the reason of the coordinator's ErrorInfo in err (a gRPC
// status error, wrapped or not), e.g. "LOCK_HELD"; "" when err carries
// none (nil, a client-side error, a status the gRPC library built). Switch
// on it rather than on messages, which may change, or on codes, which
// several causes share.
func ReasonOf(err error) string {
	return errorInfo(err).GetReason()
}

// MetadataOf is the metadata of the coordinator's ErrorInfo in err (keys
// are lowerCamel, e.g. "holderToken" of LOCK_HELD); nil when it has none.
func MetadataOf(err error) map[string]string {
	return errorInfo(err).GetMetadata()
}

// RetryDelayOf is the delay after which the coordinator says a retry may
// succeed (its RetryInfo, sent with every RESOURCE_EXHAUSTED and
// UNAVAILABLE), and whether err carries one.
func RetryDelayOf(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if err == nil || !ok {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// errorInfo is the coordinatord ErrorInfo of err, nil if none.
func errorInfo(err error) *errdetails.ErrorInfo {
	st, ok := status.FromError(err)
	if err == nil || !ok {
		return nil
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == errorDomain {
			return info
		}
	}
	return nil
}
