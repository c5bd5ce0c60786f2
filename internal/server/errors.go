package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/coordinatord/coordinatord/internal/authz"
	"github.com/coordinatord/coordinatord/internal/counter"
	"github.com/coordinatord/coordinatord/internal/epoch"
	"github.com/coordinatord/coordinatord/internal/fence"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// toStatus is the one place where domain errors become gRPC statuses
// (DESIGN.md, "gRPC error contract"); every handler's error leaves through
// it. A stream's own failure (streamErr) passes unchanged. Errors it does
// not know are logged once here and become Internal. Every status it builds
// carries an ErrorInfo whose reason is a value of the proto's ErrorReason
// (without its prefix). TestErrorContract has a row for every error of the
// domain packages.
func toStatus(ctx context.Context, log *slog.Logger, method string, err error) error {
	if err == nil {
		return nil
	}
	var (
		se *streamError
		fw *forwardedError
		fe *lease.FieldError
		ng *lease.NotGrantedError
		tw *lease.TooManyWaitersError
		tl *lease.TooManyLocksError
		mo *fence.MarkOwnedError
		tm *fence.TooManyMarksError
		lm *lease.LimitMismatchError
		sh *fence.SharedHolderError
		am *counter.AlgorithmMismatchError
		ec *epoch.ChangedError
		ex *epoch.ExhaustedError
		ns *shard.NotServingError
		nc *NotOnShardCoreError
	)
	switch {
	case errors.As(err, &se):
		return se.err // the stream's own failure: gRPC's answer already
	case errors.As(err, &fw):
		return fw.st // a peer's answer to a forwarded call: its status already
	case errors.As(err, &fe):
		return withReason(codes.InvalidArgument, err.Error(), "INVALID_FIELD", map[string]string{"field": fe.Field},
			&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: fe.Field, Description: fe.Reason}}})
	case errors.As(err, &ng):
		return withReason(codes.Aborted, err.Error(), "LOCK_HELD",
			map[string]string{"holderToken": strconv.FormatInt(ng.HolderToken, 10)})
	case errors.As(err, &mo):
		return withReason(codes.FailedPrecondition, err.Error(), "MARK_OWNED_BY_OTHER_LOCK",
			map[string]string{"lock": mo.Owner, "resource": mo.Resource})
	case errors.As(err, &tm):
		return withReason(codes.ResourceExhausted, err.Error(), "TOO_MANY_MARKS",
			map[string]string{"limit": strconv.FormatInt(tm.Limit, 10), "count": strconv.FormatInt(tm.Count, 10)},
			retryAfter(retryMarks), quota(identitySubject(ctx), "resource marks created by this identity (--max-marks-per-identity)"))
	case errors.As(err, &lm):
		return withReason(codes.FailedPrecondition, err.Error(), "LIMIT_MISMATCH",
			map[string]string{"lock": lm.Name, "limitInForce": strconv.Itoa(int(lm.InForce)), "limit": strconv.Itoa(int(max(lm.Asked, 1)))})
	case errors.As(err, &sh):
		return withReason(codes.FailedPrecondition, err.Error(), "SHARED_HOLDER_CANNOT_FENCE",
			map[string]string{"lock": sh.Name, "resource": sh.Resource})
	case errors.As(err, &am):
		return withReason(codes.FailedPrecondition, err.Error(), "COUNTER_ALGORITHM_MISMATCH",
			map[string]string{"counter": am.Name, "algorithm": am.Algorithm.String()})
	case errors.Is(err, lease.ErrNotHeld):
		return withReason(codes.NotFound, err.Error(), "NOT_HELD", nil)
	case errors.Is(err, lease.ErrLostWhileWaiting):
		return withReason(codes.NotFound, err.Error(), "LOST_WHILE_WAITING", nil)
	case errors.Is(err, lease.ErrSessionNotFound):
		return withReason(codes.NotFound, err.Error(), "SESSION_NOT_FOUND", nil)
	case errors.Is(err, fence.ErrNoMark):
		return withReason(codes.NotFound, err.Error(), "NO_MARK", nil)
	case errors.Is(err, lease.ErrMaxHold):
		return withReason(codes.FailedPrecondition, err.Error(), "MAX_HOLD_REACHED", nil)
	case errors.Is(err, lease.ErrSessionBusy):
		return withReason(codes.FailedPrecondition, err.Error(), "SESSION_BUSY", nil)
	case errors.Is(err, lease.ErrRequestIDReused), errors.Is(err, counter.ErrRequestIDReused):
		return withReason(codes.FailedPrecondition, err.Error(), "REQUEST_ID_REUSED", nil)
	case errors.Is(err, lease.ErrSessionForbidden):
		return withReason(codes.PermissionDenied, err.Error(), "SESSION_OF_ANOTHER_IDENTITY", nil)
	case errors.Is(err, lease.ErrStoreFull):
		return withReason(codes.ResourceExhausted, err.Error(), "STORE_FULL", nil,
			retryAfter(retryStoreFull), quota("etcd", "etcd's storage quota (--quota-backend-bytes); reads still work"))
	case errors.As(err, &tw):
		return withReason(codes.ResourceExhausted, err.Error(), "TOO_MANY_WAITERS",
			map[string]string{"lock": tw.Name, "limit": "max-waiters-per-lock", "maximum": strconv.FormatInt(tw.Limit, 10)},
			retryAfter(retryWaiters), quota("lock:"+tw.Name, "waiters queued for this lock (--max-waiters-per-lock)"))
	case errors.As(err, &tl):
		return withReason(codes.ResourceExhausted, err.Error(), "TOO_MANY_LOCKS",
			map[string]string{"limit": "max-locks-per-identity", "maximum": strconv.FormatInt(tl.Limit, 10)},
			retryAfter(retryLocks), quota(identitySubject(ctx), "locks held or waited for by this identity (--max-locks-per-identity)"))
	case errors.Is(err, lease.ErrCompacted):
		return withReason(codes.OutOfRange, err.Error(), "REVISION_COMPACTED", nil)
	case errors.As(err, &ec):
		return withReason(codes.OutOfRange, err.Error(), "EPOCH_CHANGED",
			map[string]string{"epoch": strconv.FormatInt(ec.From, 10), "currentEpoch": strconv.FormatInt(ec.To, 10)})
	case errors.Is(err, epoch.ErrChanged):
		return withReason(codes.OutOfRange, err.Error(), "EPOCH_CHANGED", nil)
	case errors.As(err, &ex):
		return withReason(codes.FailedPrecondition, err.Error(), "TOKENS_EXHAUSTED",
			map[string]string{"revision": strconv.FormatInt(ex.Revision, 10), "maximum": strconv.FormatInt(epoch.MaxRevision, 10)})
	case errors.Is(err, epoch.ErrExhausted):
		return withReason(codes.FailedPrecondition, err.Error(), "TOKENS_EXHAUSTED", nil)
	case errors.Is(err, epoch.ErrPaused):
		return withReason(codes.Unavailable, err.Error(), "EPOCH_PAUSED", nil, retryAfter(retryEtcd))
	case errors.As(err, &ns):
		md := map[string]string{"shard": strconv.FormatUint(uint64(ns.Shard), 10)}
		if ns.Owner != "" {
			md["owner"], md["address"] = ns.Owner, ns.Addr
		}
		return withReason(codes.Unavailable, err.Error(), "SHARD_NOT_SERVED", md, retryAfter(retryShard))
	case errors.Is(err, shard.ErrOwnershipLost):
		return withReason(codes.Unavailable, err.Error(), "SHARD_NOT_SERVED", nil, retryAfter(retryShard))
	case errors.Is(err, shard.ErrUnknownOutcome):
		return withReason(codes.Unavailable, err.Error()+"; safe to retry with the same request id", "ETCD_UNAVAILABLE", nil, retryAfter(retryEtcd))
	case errors.Is(err, shard.ErrClosed):
		return withReason(codes.Unavailable, err.Error()+"; safe to retry", "SHUTTING_DOWN", nil, retryAfter(retryShutdown))
	case errors.As(err, &nc):
		return withReason(codes.Unimplemented, err.Error(), "NOT_ON_SHARD_CORE", map[string]string{"method": nc.Method})
	case errors.Is(err, lease.ErrShuttingDown), errors.Is(err, counter.ErrShuttingDown):
		return withReason(codes.Unavailable, err.Error()+"; safe to retry", "SHUTTING_DOWN", nil, retryAfter(retryShutdown))
	case errors.Is(err, lease.ErrUnavailable):
		return withReason(codes.Unavailable, err.Error()+"; safe to retry", "ETCD_UNAVAILABLE", nil, retryAfter(retryEtcd))
	case errors.Is(err, context.DeadlineExceeded):
		return withReason(codes.DeadlineExceeded, "deadline exceeded before the operation completed; for Acquire, your queue entry was removed",
			"DEADLINE_EXCEEDED", nil)
	case errors.Is(err, context.Canceled):
		return withReason(codes.Canceled, "cancelled by the caller; for Acquire, your queue entry was removed", "CANCELLED", nil)
	}
	// etcd transport failures come through the etcd client as gRPC statuses.
	if st, ok := status.FromError(err); ok && st.Code() == codes.Unavailable {
		return withReason(codes.Unavailable, "etcd unavailable: "+st.Message()+"; safe to retry", "ETCD_UNAVAILABLE", nil, retryAfter(retryEtcd))
	}
	log.ErrorContext(ctx, "internal error", "method", method, "err", err)
	return errInternal()
}

// The RetryInfo delays: how long a caller waits before a retry may succeed.
// They are hints, long enough not to hammer the coordinator, short enough
// not to leave a freed capacity unused for long. (RATE_LIMITED computes its
// delay from the caller's token bucket instead.)
const (
	retryEtcd      = time.Second            // etcd elects a leader or reconnects within seconds
	retryShutdown  = 100 * time.Millisecond // another replica answers at once
	retryStoreFull = 30 * time.Second       // the embedded etcd compacts and defragments by itself
	retryWaiters   = time.Second            // waiters leave as grants end
	retryLocks     = 5 * time.Second        // the identity must release (or stop waiting for) a lock
	retryMarks     = time.Minute            // only an admin deletes marks (DeleteMark)
	retryStreams   = time.Second            // the caller must close one of its streams
	retryShard     = 200 * time.Millisecond // a shard loads in one etcd read; a takeover after a crash takes the owner's lease TTL
)

// withReason is a status whose ErrorInfo carries a stable, machine-readable
// reason (UPPER_SNAKE, a value of the proto's ErrorReason without its
// prefix) and lowerCamel metadata keys, followed by the other details: the
// form every error of the server takes (the Google API error model).
func withReason(code codes.Code, msg, reason string, metadata map[string]string, details ...protoadapt.MessageV1) error {
	info := &errdetails.ErrorInfo{Reason: reason, Domain: errorDomain, Metadata: metadata}
	return withDetails(status.New(code, msg), append([]protoadapt.MessageV1{info}, details...)...)
}

// errorDomain is the ErrorInfo domain of every error of the server.
const errorDomain = "coordinatord"

// retryAfter is the RetryInfo of a RESOURCE_EXHAUSTED or UNAVAILABLE answer.
func retryAfter(d time.Duration) *errdetails.RetryInfo {
	return &errdetails.RetryInfo{RetryDelay: durationpb.New(d)}
}

// quota is the QuotaFailure of a quota-like RESOURCE_EXHAUSTED answer: the
// subject whose quota is spent ("lock:<name>", "identity:<id>", "caller:<key>") and
// which quota it is.
func quota(subject, description string) *errdetails.QuotaFailure {
	return &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: subject, Description: description}}}
}

// identitySubject is the QuotaFailure subject of a per-identity quota
// (locks, marks): "identity:<id>", or "identity:" for the unauthenticated
// callers, who share one quota.
func identitySubject(ctx context.Context) string {
	id, _ := authz.FromContext(ctx)
	return "identity:" + id
}

// callerSubject is the QuotaFailure subject of a per-caller quota, from the
// caller key (rate limit and stream caps use the same key).
func callerSubject(key string) string { return "caller:" + key }

func withDetails(st *status.Status, details ...protoadapt.MessageV1) error {
	if d, err := st.WithDetails(details...); err == nil {
		st = d
	}
	return st.Err()
}

// streamError is the failure of a stream itself (a Send or Recv error of
// gRPC, or a refusal of an interceptor's RecvMsg): already the status the
// call ends with, passed through toStatus unchanged.
type streamError struct{ err error }

func (e *streamError) Error() string { return e.err.Error() }

// streamErr marks err, if any, as the stream's own failure.
func streamErr(err error) error {
	if err == nil {
		return nil
	}
	return &streamError{err: err}
}

// The refusals below are the statuses of the transport layer's own checks
// (authentication, authorization, rate and stream limits, undecodable
// messages, panics): no domain error stands behind them. They are built
// here, and only here, so that errors.go is the whole error contract of
// the server (hygiene_test.go checks that no other file builds a status).

// errInternal hides the cause of a failure the coordinator logged.
func errInternal() error {
	return withReason(codes.Internal, "internal error; the coordinator logged the cause", "INTERNAL", nil)
}

// errUnauthenticated: the credential presented names no identity the
// coordinator knows (reason CREDENTIALS_INVALID); msg says which and why.
func errUnauthenticated(msg string) error {
	return withReason(codes.Unauthenticated, msg, "CREDENTIALS_INVALID", nil)
}

// errNoCredentials: the call presents neither a client certificate nor a
// bearer token (reason CREDENTIALS_MISSING).
func errNoCredentials(msg string) error {
	return withReason(codes.Unauthenticated, msg, "CREDENTIALS_MISSING", nil)
}

// errAdminOnly: identity id is no admin and method is for admins only
// (reason ADMIN_ONLY); why, if any, says why it is ("names no lock").
func errAdminOnly(id, method, why string) error {
	if why != "" {
		why += ": "
	}
	return withReason(codes.PermissionDenied, fmt.Sprintf("identity %q may not call %s (%sadmins only); ask an admin to extend the policy", id, method, why),
		"ADMIN_ONLY", map[string]string{"identity": id, "method": method})
}

// errNotInPolicy: identity id is authenticated but the authorization
// policy does not name it (reason IDENTITY_NOT_IN_POLICY).
func errNotInPolicy(id string) error {
	return withReason(codes.PermissionDenied, fmt.Sprintf("identity %q is not in the authorization policy; ask an admin to extend the policy", id),
		"IDENTITY_NOT_IN_POLICY", map[string]string{"identity": id})
}

// errDenied: the policy does not let identity id use a name, prefix or
// resource; what is phrased to follow the identity ("may not use this lock
// name"). Reason DENIED_BY_POLICY.
func errDenied(id, what string) error {
	return withReason(codes.PermissionDenied, fmt.Sprintf("identity %q %s; ask an admin to extend the policy", id, what),
		"DENIED_BY_POLICY", map[string]string{"identity": id})
}

// errIdentityRevoked ends an open stream whose credential or policy changed
// (UNAUTHENTICATED or PERMISSION_DENIED, reason IDENTITY_REVOKED).
func errIdentityRevoked(code codes.Code, msg, id string) error {
	return withReason(code, msg, "IDENTITY_REVOKED", map[string]string{"identity": id})
}

// errRateLimited: the caller is beyond its rate limit (reason RATE_LIMITED);
// wait is how long until its bucket holds a token again (the RetryInfo).
func errRateLimited(rps float64, burst int, wait time.Duration) error {
	return withReason(codes.ResourceExhausted,
		fmt.Sprintf("rate limit of %g requests/s (burst %d) exceeded for this caller (--rate-limit; every stream message counts); slow down and retry", rps, burst),
		"RATE_LIMITED", map[string]string{"limit": strconv.FormatFloat(rps, 'g', -1, 64), "burst": strconv.Itoa(burst)},
		retryAfter(wait))
}

// errTooManyStreams: the caller (its key, see caller) already has limit
// open streams of kind ("Watch", "Hold"), reason TOO_MANY_STREAMS.
func errTooManyStreams(key, kind string, limit int) error {
	return withReason(codes.ResourceExhausted,
		fmt.Sprintf("this caller already has %d open %s streams, the most allowed (--max-%s-streams-per-caller); close one, or share one stream between watchers", limit, kind, strings.ToLower(kind)),
		"TOO_MANY_STREAMS", map[string]string{"method": kind, "limit": strconv.Itoa(limit)},
		retryAfter(retryStreams), quota(callerSubject(key), fmt.Sprintf("open %s streams of this caller (--max-%s-streams-per-caller)", kind, strings.ToLower(kind))))
}

// errMalformedMessage: the request did not decode as the protobuf message
// name (reason MALFORMED_MESSAGE).
func errMalformedMessage(name string, cause any) error {
	return withReason(codes.InvalidArgument,
		fmt.Sprintf("the request is not a valid protobuf encoding of %s (%v); send a message built by a protobuf library", name, cause),
		"MALFORMED_MESSAGE", map[string]string{"message": name})
}

// peerUnreachable is a member that could not be reached, as gRPC's
// transport reports it (UNAVAILABLE with no ErrorInfo of ours), so that a
// forwarded call tries again (notServedThere).
func peerUnreachable(err error) error {
	return status.Error(codes.Unavailable, err.Error())
}
