package fence

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/coordinatord/coordinatord/client"
)

// The names under which clients send the lock name and the fencing token.
const (
	// HeaderLock and HeaderToken are the HTTP header names.
	HeaderLock  = "X-Coordinator-Lock"
	HeaderToken = "X-Coordinator-Token"
	// MetadataLock and MetadataToken are the gRPC metadata keys.
	MetadataLock  = "x-coordinator-lock"
	MetadataToken = "x-coordinator-token"
)

// SetHeaders puts the lock name and token on an outgoing HTTP request's
// headers.
func SetHeaders(h http.Header, lock string, token int64) {
	h.Set(HeaderLock, lock)
	h.Set(HeaderToken, strconv.FormatInt(token, 10))
}

// AppendToOutgoingContext adds the lock name and token to the gRPC metadata
// of calls made with the returned context.
func AppendToOutgoingContext(ctx context.Context, lock string, token int64) context.Context {
	return metadata.AppendToOutgoingContext(ctx, MetadataLock, lock, MetadataToken, strconv.FormatInt(token, 10))
}

// TokenValidator asks the coordinator whether a token is current for a
// lock and at or above a resource's high-water mark (advancing it).
// *client.Client implements it; a test may pass a fake.
type TokenValidator interface {
	ValidateToken(ctx context.Context, name string, token int64, resource string) (client.Verdict, error)
}

// Admitted is what a Gate admitted, available to the handler through
// FromContext.
type Admitted struct {
	Lock  string
	Token int64
}

type admittedKey struct{}

// FromContext returns the lock name and token the Gate admitted for this
// request.
func FromContext(ctx context.Context) (Admitted, bool) {
	a, ok := ctx.Value(admittedKey{}).(Admitted)
	return a, ok
}

// Gate checks the fencing token of each request before its handler runs.
type Gate struct {
	guard        *Guard
	val          TokenValidator
	resource     string
	lock         string
	exempt       map[string]bool
	checkTimeout time.Duration
}

// DefaultCheckTimeout bounds one coordinator check (retries included).
const DefaultCheckTimeout = 5 * time.Second

// GateOption configures a Gate.
type GateOption func(*Gate)

// WithGuard checks tokens against a local Guard and runs each handler while
// holding it: check and write are atomic, and requests are serialized.
func WithGuard(g *Guard) GateOption { return func(x *Gate) { x.guard = g } }

// WithCoordinator checks tokens with the coordinator: ValidateToken(lock,
// token, resource), which refuses a token that is not the current holder's
// or is below the resource's high-water mark, and raises the mark. Between
// that answer and the write, a newer holder could write first; combine with
// WithGuard (or the SQL pattern) to close that gap.
func WithCoordinator(v TokenValidator, resource string) GateOption {
	return func(x *Gate) { x.val, x.resource = v, resource }
}

// WithLock admits only requests for this lock name (others: ErrWrongLock).
// Recommended: without it, a Guard alone admits a holder of any lock with a
// token above its mark, and the coordinator binds the resource to whichever
// lock validates against it first (other locks' tokens are then refused,
// ErrWrongLock).
func WithLock(name string) GateOption { return func(x *Gate) { x.lock = name } }

// WithCheckTimeout bounds each coordinator check, retries of UNAVAILABLE
// included (default DefaultCheckTimeout); past it the request is refused
// with ErrUnavailable. With a Guard the check runs while the guard is held,
// so this also bounds how long other requests queue behind a slow check.
func WithCheckTimeout(d time.Duration) GateOption { return func(x *Gate) { x.checkTimeout = d } }

// WithExemptMethods lets these gRPC methods (full names, e.g.
// "/grpc.health.v1.Health/Check") through without a token.
func WithExemptMethods(fullMethods ...string) GateOption {
	return func(x *Gate) {
		for _, m := range fullMethods {
			x.exempt[m] = true
		}
	}
}

// NewGate returns a Gate; it needs WithGuard, WithCoordinator or both.
func NewGate(opts ...GateOption) (*Gate, error) {
	g := &Gate{exempt: map[string]bool{}, checkTimeout: DefaultCheckTimeout}
	for _, opt := range opts {
		opt(g)
	}
	if g.guard == nil && g.val == nil {
		return nil, errors.New("fence: NewGate needs WithGuard, WithCoordinator or both")
	}
	if g.val != nil && g.resource == "" {
		return nil, errors.New("fence: WithCoordinator needs a resource name")
	}
	return g, nil
}

// Do checks (lock, token) and, if admitted, runs write with the admitted
// values in its context (FromContext). With a Guard, write runs while the
// guard is held. A refusal is a *StaleError (ErrStale), ErrMissing,
// ErrWrongLock or ErrUnavailable, and write does not run; otherwise Do
// returns write's error.
func (g *Gate) Do(ctx context.Context, lock string, token int64, write func(context.Context) error) error {
	switch {
	case lock == "":
		return fmt.Errorf("%w: no lock name", ErrMissing)
	case token <= 0:
		return fmt.Errorf("%w: token %d is not positive", ErrMissing, token)
	case g.lock != "" && lock != g.lock:
		return fmt.Errorf("%w: got %q, want %q", ErrWrongLock, lock, g.lock)
	}
	ctx = context.WithValue(ctx, admittedKey{}, Admitted{Lock: lock, Token: token})
	check := func() error {
		if g.val == nil {
			return nil
		}
		cctx, cancel := context.WithTimeout(ctx, g.checkTimeout)
		defer cancel()
		v, err := g.val.ValidateToken(cctx, lock, token, g.resource)
		// The check's own failure is text only, never a wrapped cause: it is
		// a gRPC status (or a context error of checkTimeout), and wrapping it
		// would make status.Code(err) and errors.Is(err, context.*) of the
		// caller's handler see the coordinator's answer as the request's.
		if ownedByAnotherLock(err) {
			return fmt.Errorf("%w: %v", ErrWrongLock, err) //nolint:errorlint // the status stays text: see above
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrUnavailable, err) //nolint:errorlint // the status stays text: see above
		}
		if !v.Valid {
			return &StaleError{Lock: lock, Token: token, Reason: v.Reason.String()}
		}
		return nil
	}
	if g.guard == nil {
		if err := check(); err != nil {
			return err
		}
		return write(ctx)
	}
	g.guard.mu.Lock()
	defer g.guard.mu.Unlock()
	if token < g.guard.highest {
		return &StaleError{Lock: lock, Token: token, Highest: g.guard.highest}
	}
	if err := check(); err != nil {
		return err
	}
	if err := g.guard.admitLocked(token); err != nil {
		return err
	}
	return write(ctx)
}

// ownedByAnotherLock tells whether the coordinator refused the check
// because the resource's mark belongs to another lock (a refusal of the
// request, not a failure to retry).
func ownedByAnotherLock(err error) bool {
	st, ok := status.FromError(err)
	if err == nil || !ok || st.Code() != codes.FailedPrecondition {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == "MARK_OWNED_BY_OTHER_LOCK" {
			return true
		}
	}
	return false
}

// refusal reports whether err is one of the Gate's refusals.
func refusal(err error) bool {
	return errors.Is(err, ErrStale) || errors.Is(err, ErrMissing) || errors.Is(err, ErrWrongLock) || errors.Is(err, ErrUnavailable)
}

// HTTPStatus is the HTTP status of a refusal: 409, 400, 403 or 503.
func HTTPStatus(err error) int {
	switch {
	case errors.Is(err, ErrStale):
		return http.StatusConflict
	case errors.Is(err, ErrMissing):
		return http.StatusBadRequest
	case errors.Is(err, ErrWrongLock):
		return http.StatusForbidden
	case errors.Is(err, ErrUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// Code is the gRPC code of a refusal: FAILED_PRECONDITION,
// INVALID_ARGUMENT, PERMISSION_DENIED or UNAVAILABLE.
func Code(err error) codes.Code {
	switch {
	case errors.Is(err, ErrStale):
		return codes.FailedPrecondition
	case errors.Is(err, ErrMissing):
		return codes.InvalidArgument
	case errors.Is(err, ErrWrongLock):
		return codes.PermissionDenied
	case errors.Is(err, ErrUnavailable):
		return codes.Unavailable
	}
	return codes.Internal
}

// Middleware wraps an HTTP handler: requests without a valid
// X-Coordinator-Lock / X-Coordinator-Token pair, or with a stale token, are
// answered with the refusal's status (HTTPStatus) and a one-line text body;
// the others reach next, with FromContext telling what was admitted.
func (g *Gate) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lock := r.Header.Get(HeaderLock)
		token, err := parseToken(r.Header.Get(HeaderToken))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		err = g.Do(r.Context(), lock, token, func(ctx context.Context) error {
			next.ServeHTTP(w, r.WithContext(ctx))
			return nil
		})
		if err != nil {
			http.Error(w, err.Error(), HTTPStatus(err))
		}
	})
}

// UnaryServerInterceptor checks the x-coordinator-lock and
// x-coordinator-token metadata of each unary call (except exempt methods);
// a refusal answers the call with Code(err).
func (g *Gate) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if g.exempt[info.FullMethod] {
			return handler(ctx, req)
		}
		lock, token, err := fromMetadata(ctx)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		var (
			resp any
			ran  bool
		)
		err = g.Do(ctx, lock, token, func(ctx context.Context) error {
			ran = true
			var herr error
			resp, herr = handler(ctx, req)
			return herr
		})
		if !ran && refusal(err) {
			return nil, status.Error(Code(err), err.Error())
		}
		return resp, err
	}
}

// StreamServerInterceptor checks the metadata once, when a stream opens,
// and holds the Guard (if any) for the whole stream.
func (g *Gate) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if g.exempt[info.FullMethod] {
			return handler(srv, ss)
		}
		lock, token, err := fromMetadata(ss.Context())
		if err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
		ran := false
		err = g.Do(ss.Context(), lock, token, func(ctx context.Context) error {
			ran = true
			return handler(srv, &stream{ServerStream: ss, ctx: ctx})
		})
		if !ran && refusal(err) {
			return status.Error(Code(err), err.Error())
		}
		return err
	}
}

type stream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *stream) Context() context.Context { return s.ctx }

func fromMetadata(ctx context.Context) (string, int64, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	first := func(k string) string {
		if v := md.Get(k); len(v) > 0 {
			return v[0]
		}
		return ""
	}
	lock := first(MetadataLock)
	if lock == "" {
		return "", 0, fmt.Errorf("%w: metadata %q is missing", ErrMissing, MetadataLock)
	}
	token, err := parseToken(first(MetadataToken))
	return lock, token, err
}

func parseToken(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("%w: no token (header %s / metadata %s)", ErrMissing, HeaderToken, MetadataToken)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%w: token %q is not a positive decimal integer", ErrMissing, s)
	}
	return n, nil
}
