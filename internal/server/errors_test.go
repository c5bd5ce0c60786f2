package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/authz"
	"github.com/coordinatord/coordinatord/internal/counter"
	"github.com/coordinatord/coordinatord/internal/epoch"
	"github.com/coordinatord/coordinatord/internal/fence"
	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// errorCase is one row of the error contract: the status a domain error
// (or a refusal of the transport layer) leaves the server as.
type errorCase struct {
	name     string       // pkg.Identifier of the error it covers, or a description
	st       func() error // what the server answers
	code     codes.Code
	reason   string            // ErrorInfo reason; "" only for OK and grpcOwn
	metadata map[string]string // ErrorInfo metadata
	field    string            // BadRequest field; "": no BadRequest
	retry    time.Duration     // RetryInfo delay; required for RESOURCE_EXHAUSTED and UNAVAILABLE
	quota    string            // QuotaFailure subject; "": no QuotaFailure
	grpcOwn  bool              // a status gRPC built (a stream's failure), passed unchanged: no details
	logged   bool              // toStatus logs the cause (unknown errors)
}

// countingHandler counts the records logged through it.
type countingHandler struct {
	slog.Handler
	n *atomic.Int64
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h countingHandler) Handle(context.Context, slog.Record) error { h.n.Add(1); return nil }

// Issue 14.4: every sentinel and typed error of the domain packages the
// server adapts maps to its code and details in toStatus, and every refusal
// of the interceptors (errors.go) carries its reason; the enumeration of
// the domain packages' exported Err* variables and *Error types below makes
// a new error without a row fail this test.
func TestErrorContract(t *testing.T) {
	var logged atomic.Int64
	log := slog.New(countingHandler{Handler: slog.DiscardHandler, n: &logged})
	mapped := func(err error) func() error {
		return func() error { return toStatus(context.Background(), log, "Test", err) }
	}
	mappedAs := func(id string, err error) func() error {
		return func() error { return toStatus(authz.NewContext(context.Background(), id), log, "Test", err) }
	}
	built := func(st error) func() error { return func() error { return st } }
	etcdDown := status.Error(codes.Unavailable, "connection refused")
	sent := status.Error(codes.Canceled, "context canceled") // a Send error of a stream

	cases := []errorCase{
		// lease: bad input, and the outcomes of an acquisition.
		{name: "lease.FieldError", st: mapped(&lease.FieldError{Field: "ttl", Reason: "must be at least 1s"}), code: codes.InvalidArgument,
			reason: "INVALID_FIELD", metadata: map[string]string{"field": "ttl"}, field: "ttl"},
		{name: "keyspace.FieldError", st: mapped(&keyspace.FieldError{Field: "token", Reason: "must be positive"}), code: codes.InvalidArgument,
			reason: "INVALID_FIELD", metadata: map[string]string{"field": "token"}, field: "token"},
		{name: "lease.NotGrantedError", st: mapped(&lease.NotGrantedError{Name: "l", HolderToken: 7}), code: codes.Aborted,
			reason: "LOCK_HELD", metadata: map[string]string{"holderToken": "7"}},
		{name: "lease.ErrNotGranted", st: mapped(fmt.Errorf("wrapped: %w", &lease.NotGrantedError{Name: "l"})), code: codes.Aborted,
			reason: "LOCK_HELD", metadata: map[string]string{"holderToken": "0"}},
		{name: "lease.ErrNotHeld", st: mapped(lease.ErrNotHeld), code: codes.NotFound, reason: "NOT_HELD"},
		{name: "lease.ErrLostWhileWaiting", st: mapped(lease.ErrLostWhileWaiting), code: codes.NotFound, reason: "LOST_WHILE_WAITING"},
		{name: "lease.ErrSessionNotFound", st: mapped(lease.ErrSessionNotFound), code: codes.NotFound, reason: "SESSION_NOT_FOUND"},
		{name: "lease.ErrMaxHold", st: mapped(lease.ErrMaxHold), code: codes.FailedPrecondition, reason: "MAX_HOLD_REACHED"},
		{name: "lease.ErrSessionBusy", st: mapped(lease.ErrSessionBusy), code: codes.FailedPrecondition, reason: "SESSION_BUSY"},
		{name: "lease.ErrRequestIDReused", st: mapped(lease.ErrRequestIDReused), code: codes.FailedPrecondition, reason: "REQUEST_ID_REUSED"},
		{name: "lease.ErrSessionForbidden", st: mapped(lease.ErrSessionForbidden), code: codes.PermissionDenied, reason: "SESSION_OF_ANOTHER_IDENTITY"},
		{name: "lease.ErrStoreFull", st: mapped(fmt.Errorf("%w: lease: join: etcdserver: mvcc: database space exceeded", lease.ErrStoreFull)),
			code: codes.ResourceExhausted, reason: "STORE_FULL", retry: retryStoreFull, quota: "etcd"},
		{name: "lease.TooManyWaitersError", st: mapped(&lease.TooManyWaitersError{Name: "l", Limit: 3}), code: codes.ResourceExhausted,
			reason: "TOO_MANY_WAITERS", metadata: map[string]string{"lock": "l", "limit": "max-waiters-per-lock", "maximum": "3"},
			retry: retryWaiters, quota: "lock:l"},
		{name: "lease.ErrTooManyWaiters", st: mapped(fmt.Errorf("join: %w", &lease.TooManyWaitersError{Name: "m", Limit: 1})), code: codes.ResourceExhausted,
			reason: "TOO_MANY_WAITERS", metadata: map[string]string{"lock": "m", "limit": "max-waiters-per-lock", "maximum": "1"},
			retry: retryWaiters, quota: "lock:m"},
		{name: "lease.TooManyLocksError", st: mappedAs("alice", &lease.TooManyLocksError{Count: 2, Limit: 2}), code: codes.ResourceExhausted,
			reason: "TOO_MANY_LOCKS", metadata: map[string]string{"limit": "max-locks-per-identity", "maximum": "2"},
			retry: retryLocks, quota: "identity:alice"},
		{name: "lease.ErrTooManyLocks", st: mapped(fmt.Errorf("join: %w", &lease.TooManyLocksError{Count: 5, Limit: 5})), code: codes.ResourceExhausted,
			reason: "TOO_MANY_LOCKS", metadata: map[string]string{"limit": "max-locks-per-identity", "maximum": "5"},
			retry: retryLocks, quota: "identity:"},
		{name: "lease.ErrCompacted", st: mapped(lease.ErrCompacted), code: codes.OutOfRange, reason: "REVISION_COMPACTED"},
		{name: "lease.ErrShuttingDown", st: mapped(lease.ErrShuttingDown), code: codes.Unavailable, reason: "SHUTTING_DOWN", retry: retryShutdown},
		{name: "lease.ErrUnavailable", st: mapped(fmt.Errorf("%w: lease: join: etcdserver: no leader", lease.ErrUnavailable)), code: codes.Unavailable,
			reason: "ETCD_UNAVAILABLE", retry: retryEtcd},
		{name: "epoch.ChangedError", st: mapped(&epoch.ChangedError{From: 0, To: 2}), code: codes.OutOfRange,
			reason: "EPOCH_CHANGED", metadata: map[string]string{"epoch": "0", "currentEpoch": "2"}},
		{name: "epoch.ErrChanged", st: mapped(epoch.ErrChanged), code: codes.OutOfRange, reason: "EPOCH_CHANGED"},
		{name: "epoch.ExhaustedError", st: mapped(fmt.Errorf("acquire: %w", &epoch.ExhaustedError{Revision: epoch.MaxRevision + 3})), code: codes.FailedPrecondition,
			reason: "TOKENS_EXHAUSTED", metadata: map[string]string{"revision": "281474976710658", "maximum": "281474976710655"}},
		{name: "epoch.ErrExhausted", st: mapped(epoch.ErrExhausted), code: codes.FailedPrecondition, reason: "TOKENS_EXHAUSTED"},
		{name: "epoch.ErrPaused", st: mapped(epoch.ErrPaused), code: codes.Unavailable, reason: "EPOCH_PAUSED", retry: retryEtcd},
		{name: "epoch.PausedError", st: mapped(fmt.Errorf("validate: %w", &epoch.PausedError{Reason: "etcd was restored"})), code: codes.Unavailable,
			reason: "EPOCH_PAUSED", retry: retryEtcd},

		// shard: the shard-owner core.
		{name: "shard.NotServingError", st: mapped(&shard.NotServingError{Shard: 7, Owner: "m2", Addr: "10.0.0.2:7070", Reason: "owned by another member"}),
			code: codes.Unavailable, reason: "SHARD_NOT_SERVED", metadata: map[string]string{"shard": "7", "owner": "m2", "address": "10.0.0.2:7070"}, retry: retryShard},
		{name: "shard.ErrNotServing", st: mapped(fmt.Errorf("acquire: %w", &shard.NotServingError{Shard: 3, Reason: "loading"})),
			code: codes.Unavailable, reason: "SHARD_NOT_SERVED", metadata: map[string]string{"shard": "3"}, retry: retryShard},
		{name: "shard.OwnershipLostError", st: mapped(&shard.OwnershipLostError{Shard: 2}), code: codes.Unavailable, reason: "SHARD_NOT_SERVED", retry: retryShard},
		{name: "shard.ErrOwnershipLost", st: mapped(shard.ErrOwnershipLost), code: codes.Unavailable, reason: "SHARD_NOT_SERVED", retry: retryShard},
		{name: "shard.UnknownOutcomeError", st: mapped(&shard.UnknownOutcomeError{Err: context.DeadlineExceeded}), code: codes.Unavailable,
			reason: "ETCD_UNAVAILABLE", retry: retryEtcd},
		{name: "shard.ErrUnknownOutcome", st: mapped(shard.ErrUnknownOutcome), code: codes.Unavailable, reason: "ETCD_UNAVAILABLE", retry: retryEtcd},
		{name: "shard.ErrClosed", st: mapped(shard.ErrClosed), code: codes.Unavailable, reason: "SHUTTING_DOWN", retry: retryShutdown},
		{name: "NotOnShardCoreError", st: mapped(errNotOnShardCore("Hold")), code: codes.Unimplemented, reason: "NOT_ON_SHARD_CORE",
			metadata: map[string]string{"method": "Hold"}},

		// lease and fence: semaphores and read-write locks.
		{name: "lease.LimitMismatchError", st: mapped(fmt.Errorf("acquire: %w", &lease.LimitMismatchError{Name: "pool", InForce: 3, Asked: 2})),
			code: codes.FailedPrecondition, reason: "LIMIT_MISMATCH", metadata: map[string]string{"lock": "pool", "limitInForce": "3", "limit": "2"}},
		{name: "fence.SharedHolderError", st: mapped(&fence.SharedHolderError{Name: "rw", Resource: "db", Token: 7}),
			code: codes.FailedPrecondition, reason: "SHARED_HOLDER_CANNOT_FENCE", metadata: map[string]string{"lock": "rw", "resource": "db"}},

		// fence: marks.
		{name: "fence.ErrNoMark", st: mapped(fence.ErrNoMark), code: codes.NotFound, reason: "NO_MARK"},
		{name: "fence.MarkOwnedError", st: mapped(&fence.MarkOwnedError{Resource: "db", Lock: "a", Owner: "b"}), code: codes.FailedPrecondition,
			reason: "MARK_OWNED_BY_OTHER_LOCK", metadata: map[string]string{"lock": "b", "resource": "db"}},
		{name: "fence.ErrMarkOwnedByOtherLock", st: mapped(fmt.Errorf("validate: %w", &fence.MarkOwnedError{Resource: "r", Lock: "x", Owner: "y"})),
			code: codes.FailedPrecondition, reason: "MARK_OWNED_BY_OTHER_LOCK", metadata: map[string]string{"lock": "y", "resource": "r"}},
		{name: "fence.TooManyMarksError", st: mappedAs("bob", &fence.TooManyMarksError{Count: 4, Limit: 4}), code: codes.ResourceExhausted,
			reason: "TOO_MANY_MARKS", metadata: map[string]string{"limit": "4", "count": "4"}, retry: retryMarks, quota: "identity:bob"},
		{name: "fence.ErrTooManyMarks", st: mapped(fmt.Errorf("validate: %w", &fence.TooManyMarksError{Count: 1, Limit: 1})), code: codes.ResourceExhausted,
			reason: "TOO_MANY_MARKS", metadata: map[string]string{"limit": "1", "count": "1"}, retry: retryMarks, quota: "identity:"},

		// counter: bad input, idempotency, algorithms, availability.
		{name: "counter.FieldError", st: mapped(&counter.FieldError{Field: "limit", Reason: "must be at least 1"}), code: codes.InvalidArgument,
			reason: "INVALID_FIELD", metadata: map[string]string{"field": "limit"}, field: "limit"},
		{name: "counter.AlgorithmMismatchError", st: mapped(&counter.AlgorithmMismatchError{Name: "c", Algorithm: counter.TokenBucket}),
			code: codes.FailedPrecondition, reason: "COUNTER_ALGORITHM_MISMATCH", metadata: map[string]string{"counter": "c", "algorithm": "token_bucket"}},
		{name: "counter.ErrRequestIDReused", st: mapped(counter.ErrRequestIDReused), code: codes.FailedPrecondition, reason: "REQUEST_ID_REUSED"},
		{name: "counter.ErrShuttingDown", st: mapped(counter.ErrShuttingDown), code: codes.Unavailable, reason: "SHUTTING_DOWN", retry: retryShutdown},
		{name: "counter.ErrUnavailable", st: mapped(fmt.Errorf("%w: counter hit: context deadline exceeded", counter.ErrUnavailable)),
			code: codes.Unavailable, reason: "ETCD_UNAVAILABLE", retry: retryEtcd},
		{name: "counter.ErrStoreFull", st: mapped(fmt.Errorf("%w: counter hit: etcdserver: mvcc: database space exceeded", counter.ErrStoreFull)),
			code: codes.ResourceExhausted, reason: "STORE_FULL", retry: retryStoreFull, quota: "etcd"},

		// The caller's context, etcd's transport, stream failures, the unknown.
		{name: "context.DeadlineExceeded", st: mapped(fmt.Errorf("lease: join: %w", context.DeadlineExceeded)), code: codes.DeadlineExceeded,
			reason: "DEADLINE_EXCEEDED"},
		{name: "context.Canceled", st: mapped(context.Canceled), code: codes.Canceled, reason: "CANCELLED"},
		{name: "etcd transport Unavailable", st: mapped(fmt.Errorf("lease: read: %w", etcdDown)), code: codes.Unavailable,
			reason: "ETCD_UNAVAILABLE", retry: retryEtcd},
		{name: "stream failure passes unchanged", st: mapped(fmt.Errorf("watch: %w", streamErr(sent))), code: codes.Canceled, grpcOwn: true},
		{name: "forwardedError: a peer's answer passes unchanged", st: mapped(fmt.Errorf("forward: %w", &forwardedError{st: toStatus(context.Background(), log, "Test",
			&lease.NotGrantedError{Name: "l", HolderToken: 9})})), code: codes.Aborted, reason: "LOCK_HELD", metadata: map[string]string{"holderToken": "9"}},
		{name: "forwardedError: a peer's transport failure passes unchanged", st: mapped(&forwardedError{st: sent}), code: codes.Canceled, grpcOwn: true},
		{name: "unknown error: Internal, logged", st: mapped(errors.New("boom")), code: codes.Internal, reason: "INTERNAL", logged: true},
		{name: "unknown gRPC status: Internal, logged", st: mapped(status.Error(codes.DataLoss, "etcd said so")), code: codes.Internal,
			reason: "INTERNAL", logged: true},
		{name: "nil stays nil", st: mapped(nil), code: codes.OK},

		// The refusals of the transport layer.
		{name: "errInternal", st: built(errInternal()), code: codes.Internal, reason: "INTERNAL"},
		{name: "errUnauthenticated", st: built(errUnauthenticated("unknown bearer token")), code: codes.Unauthenticated, reason: "CREDENTIALS_INVALID"},
		{name: "errNoCredentials", st: built(errNoCredentials("no client certificate and no bearer token")), code: codes.Unauthenticated,
			reason: "CREDENTIALS_MISSING"},
		{name: "errAdminOnly", st: built(errAdminOnly("alice", "/coordinator.v1.LockService/ForceRelease", "")), code: codes.PermissionDenied,
			reason: "ADMIN_ONLY", metadata: map[string]string{"identity": "alice", "method": "/coordinator.v1.LockService/ForceRelease"}},
		{name: "errNotInPolicy", st: built(errNotInPolicy("mallory")), code: codes.PermissionDenied,
			reason: "IDENTITY_NOT_IN_POLICY", metadata: map[string]string{"identity": "mallory"}},
		{name: "errDenied", st: built(errDenied("alice", "may not use this lock name")), code: codes.PermissionDenied,
			reason: "DENIED_BY_POLICY", metadata: map[string]string{"identity": "alice"}},
		{name: "errIdentityRevoked", st: built(errIdentityRevoked(codes.PermissionDenied, "the policy changed", "alice")), code: codes.PermissionDenied,
			reason: "IDENTITY_REVOKED", metadata: map[string]string{"identity": "alice"}},
		{name: "errRateLimited", st: built(errRateLimited(0.5, 3, 1500*time.Millisecond)), code: codes.ResourceExhausted,
			reason: "RATE_LIMITED", metadata: map[string]string{"limit": "0.5", "burst": "3"}, retry: 1500 * time.Millisecond},
		{name: "errTooManyStreams", st: built(errTooManyStreams("id:alice", "Watch", 2)), code: codes.ResourceExhausted,
			reason: "TOO_MANY_STREAMS", metadata: map[string]string{"method": "Watch", "limit": "2"}, retry: retryStreams, quota: "caller:id:alice"},
		{name: "errMalformedMessage", st: built(errMalformedMessage("coordinator.v1.AcquireRequest", "cannot parse")), code: codes.InvalidArgument,
			reason: "MALFORMED_MESSAGE", metadata: map[string]string{"message": "coordinator.v1.AcquireRequest"}},
	}

	covered := map[string]bool{}
	for _, tc := range cases {
		covered[tc.name] = true
	}
	for _, name := range domainErrors(t) {
		if !covered[name] {
			t.Errorf("%s has no row in TestErrorContract: map it in toStatus (errors.go) and add its row", name)
		}
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := logged.Load()
			st := tc.st()
			if got, want := logged.Load()-before, map[bool]int64{false: 0, true: 1}[tc.logged]; got != want {
				t.Errorf("logged %d records, want %d", got, want)
			}
			checkStatus(t, tc, st)
		})
	}
}

// lowerCamel is the form of every ErrorInfo metadata key.
var lowerCamel = regexp.MustCompile(`^[a-z][a-zA-Z0-9]*$`)

func checkStatus(t *testing.T, tc errorCase, err error) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != tc.code {
		t.Fatalf("code %v (%v), want %v", st.Code(), err, tc.code)
	}
	if tc.code == codes.OK || tc.grpcOwn {
		if len(st.Details()) != 0 {
			t.Errorf("details %v, want none", st.Details())
		}
		return
	}
	if tc.reason == "" {
		t.Fatal("the row names no reason: every error the server builds carries an ErrorInfo")
	}
	var (
		info  *errdetails.ErrorInfo
		bad   *errdetails.BadRequest
		retry *errdetails.RetryInfo
		quota *errdetails.QuotaFailure
	)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.BadRequest:
			bad = d
		case *errdetails.RetryInfo:
			retry = d
		case *errdetails.QuotaFailure:
			quota = d
		default:
			t.Errorf("unexpected detail %T %v", d, d)
		}
	}
	if info == nil {
		t.Fatalf("no ErrorInfo, want reason %s", tc.reason)
	}
	if info.GetReason() != tc.reason || info.GetDomain() != "coordinatord" {
		t.Errorf("ErrorInfo reason %q domain %q, want %q in coordinatord", info.GetReason(), info.GetDomain(), tc.reason)
	}
	if _, ok := coordinatorv1.ErrorReason_value[reasonPrefix+info.GetReason()]; !ok {
		t.Errorf("reason %q is not a value of the proto's ErrorReason (as %s%s)", info.GetReason(), reasonPrefix, info.GetReason())
	}
	if !maps.Equal(info.GetMetadata(), tc.metadata) {
		t.Errorf("ErrorInfo metadata %v, want %v", info.GetMetadata(), tc.metadata)
	}
	for k := range info.GetMetadata() {
		if !lowerCamel.MatchString(k) {
			t.Errorf("ErrorInfo metadata key %q is not lowerCamel", k)
		}
	}
	switch {
	case tc.field == "" && bad != nil:
		t.Errorf("BadRequest %v, want none", bad)
	case tc.field != "" && (bad == nil || len(bad.GetFieldViolations()) != 1 || bad.GetFieldViolations()[0].GetField() != tc.field):
		t.Errorf("BadRequest %v, want one violation of %q", bad, tc.field)
	}
	if tc.code == codes.InvalidArgument && tc.reason == "INVALID_FIELD" && tc.field == "" {
		t.Error("an INVALID_FIELD row names no BadRequest field")
	}
	needRetry := tc.code == codes.ResourceExhausted || tc.code == codes.Unavailable
	switch {
	case needRetry && tc.retry <= 0:
		t.Errorf("a %v row names no RetryInfo delay", tc.code)
	case tc.retry == 0 && retry != nil:
		t.Errorf("RetryInfo %v, want none", retry)
	case tc.retry > 0 && (retry == nil || retry.GetRetryDelay().AsDuration() != tc.retry):
		t.Errorf("RetryInfo %v, want a delay of %v", retry, tc.retry)
	}
	switch {
	case quotaReasons[tc.reason] && tc.quota == "":
		t.Errorf("reason %s is a quota: the row names no QuotaFailure subject", tc.reason)
	case tc.quota == "" && quota != nil:
		t.Errorf("QuotaFailure %v, want none", quota)
	case tc.quota != "":
		if v := quota.GetViolations(); len(v) != 1 || v[0].GetSubject() != tc.quota || v[0].GetDescription() == "" {
			t.Errorf("QuotaFailure %v, want one described violation of subject %q", quota, tc.quota)
		}
	}
	if st.Message() == "" {
		t.Error("empty message: say what happened and what to do")
	}
}

// quotaReasons are the RESOURCE_EXHAUSTED reasons of a quota (as opposed to
// a rate): they carry a QuotaFailure besides the RetryInfo.
