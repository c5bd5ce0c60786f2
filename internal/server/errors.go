package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/coordinatord/coordinatord/internal/fence"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// toStatus is the one place where domain errors become gRPC statuses
// (DESIGN.md, "gRPC error contract"); every handler's error leaves through
// it. A stream's own failure (streamErr) passes unchanged. Errors it does
// not know are logged once here and become Internal. TestErrorContract has
// a row for every error of the domain packages.
func toStatus(ctx context.Context, log *slog.Logger, method string, err error) error {
	if err == nil {
		return nil
	}
	var (
		se *streamError
		fe *lease.FieldError
		ng *lease.NotGrantedError
		tw *lease.TooManyWaitersError
		tl *lease.TooManyLocksError
		mo *fence.MarkOwnedError
		tm *fence.TooManyMarksError
	)
	switch {
	case errors.As(err, &se):
		return se.err // the stream's own failure: gRPC's answer already
	case errors.As(err, &fe):
		st := status.New(codes.InvalidArgument, err.Error())
		return withDetails(st, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: fe.Field, Description: fe.Reason},
		}})
	case errors.As(err, &ng):
		st := status.New(codes.Aborted, err.Error())
		return withDetails(st, &errdetails.ErrorInfo{
			Reason:   "LOCK_HELD",
			Domain:   "coordinatord",
			Metadata: map[string]string{"holder_token": strconv.FormatInt(ng.HolderToken, 10)},
		})
	case errors.As(err, &mo):
		return withReason(codes.FailedPrecondition, err.Error(), "MARK_OWNED_BY_OTHER_LOCK",
			map[string]string{"lock": mo.Owner, "resource": mo.Resource})
	case errors.As(err, &tm):
		return withReason(codes.ResourceExhausted, err.Error(), "TOO_MANY_MARKS",
			map[string]string{"limit": strconv.FormatInt(tm.Limit, 10), "count": strconv.FormatInt(tm.Count, 10)})
	case errors.Is(err, lease.ErrNotHeld), errors.Is(err, lease.ErrLostWhileWaiting), errors.Is(err, lease.ErrSessionNotFound),
		errors.Is(err, fence.ErrNoMark):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, lease.ErrMaxHold), errors.Is(err, lease.ErrSessionBusy):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, lease.ErrRequestIDReused):
		return withReason(codes.FailedPrecondition, err.Error(), "REQUEST_ID_REUSED", nil)
	case errors.Is(err, lease.ErrSessionForbidden):
		return withReason(codes.PermissionDenied, err.Error(), "SESSION_OF_ANOTHER_IDENTITY", nil)
	case errors.Is(err, lease.ErrStoreFull):
		return withReason(codes.ResourceExhausted, err.Error(), "STORE_FULL", nil)
	case errors.As(err, &tw):
		return withReason(codes.ResourceExhausted, err.Error(), "TOO_MANY_WAITERS",
			map[string]string{"limit": "max-waiters-per-lock", "maximum": strconv.FormatInt(tw.Limit, 10)})
	case errors.As(err, &tl):
		return withReason(codes.ResourceExhausted, err.Error(), "TOO_MANY_LOCKS",
			map[string]string{"limit": "max-locks-per-identity", "maximum": strconv.FormatInt(tl.Limit, 10)})
	case errors.Is(err, lease.ErrCompacted):
		return status.Error(codes.OutOfRange, err.Error())
	case errors.Is(err, lease.ErrShuttingDown), errors.Is(err, lease.ErrUnavailable):
		return status.Error(codes.Unavailable, err.Error()+"; safe to retry")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "deadline exceeded before the operation completed; for Acquire, your queue entry was removed")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "cancelled by the caller; for Acquire, your queue entry was removed")
	}
	// etcd transport failures come through the etcd client as gRPC statuses.
	if st, ok := status.FromError(err); ok && st.Code() == codes.Unavailable {
		return status.Error(codes.Unavailable, "etcd unavailable: "+st.Message()+"; safe to retry")
	}
	log.ErrorContext(ctx, "internal error", "method", method, "err", err)
	return errInternal()
}

// withReason is a status whose ErrorInfo carries a stable, machine-readable
// reason (UPPER_SNAKE) and lowerCamel metadata keys: the form every new error
// takes (the Google API error model).
func withReason(code codes.Code, msg, reason string, metadata map[string]string) error {
	return withDetails(status.New(code, msg), &errdetails.ErrorInfo{Reason: reason, Domain: "coordinatord", Metadata: metadata})
}

func withDetails(st *status.Status, detail protoadapt.MessageV1) error {
	if d, err := st.WithDetails(detail); err == nil {
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
	return status.Error(codes.Internal, "internal error; the coordinator logged the cause")
}

// errUnauthenticated: the call names no identity the coordinator knows; msg
// says which credential was missing or wrong.
func errUnauthenticated(msg string) error { return status.Error(codes.Unauthenticated, msg) }

// errDenied: the policy does not let identity id do what; what is phrased
// to follow the identity ("may not use this lock name").
func errDenied(id, what string) error {
	return status.Errorf(codes.PermissionDenied, "identity %q %s; ask an admin to extend the policy", id, what)
}

// errIdentityRevoked ends an open stream whose credential or policy changed
// (UNAUTHENTICATED or PERMISSION_DENIED, reason IDENTITY_REVOKED).
func errIdentityRevoked(code codes.Code, msg, id string) error {
	return withReason(code, msg, "IDENTITY_REVOKED", map[string]string{"identity": id})
}

// errRateLimited: the caller is beyond its rate limit (reason RATE_LIMITED).
func errRateLimited(rps float64, burst int) error {
	return withReason(codes.ResourceExhausted,
		fmt.Sprintf("rate limit of %g requests/s (burst %d) exceeded for this caller (--rate-limit; every stream message counts); slow down and retry", rps, burst),
		"RATE_LIMITED", map[string]string{"limit": strconv.FormatFloat(rps, 'g', -1, 64), "burst": strconv.Itoa(burst)})
}

// errTooManyStreams: the caller already has limit open streams of kind
// ("Watch", "Hold"), reason TOO_MANY_STREAMS.
func errTooManyStreams(kind string, limit int) error {
	return withReason(codes.ResourceExhausted,
		fmt.Sprintf("this caller already has %d open %s streams, the most allowed (--max-%s-streams-per-caller); close one, or share one stream between watchers", limit, kind, strings.ToLower(kind)),
		"TOO_MANY_STREAMS", map[string]string{"method": kind, "limit": strconv.Itoa(limit)})
}

// errMalformedMessage: the request did not decode as the protobuf message
// name (reason MALFORMED_MESSAGE).
func errMalformedMessage(name string, cause any) error {
	return withReason(codes.InvalidArgument,
		fmt.Sprintf("the request is not a valid protobuf encoding of %s (%v); send a message built by a protobuf library", name, cause),
		"MALFORMED_MESSAGE", map[string]string{"message": name})
}
