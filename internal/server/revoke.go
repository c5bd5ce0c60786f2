package server

import (
	"context"
	"strconv"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/authz"
)

// revocable is an authorized call in progress that a policy or token change
// can end: a stream, or a unary call that may wait (an Acquire in a queue).
type revocable interface {
	stillAllowed() error
	revoke(err error)
}

// openCalls are the revocable calls in progress, so that a policy or token
// change reaches those already authorized: without it, a revoked identity
// would keep its Hold and Watch streams for as long as it liked, and an
// Acquire it sent before the change could still be granted at the end of
// its wait.
type openCalls struct {
	mu sync.Mutex
	m  map[revocable]struct{}
}

func newOpenCalls() *openCalls { return &openCalls{m: map[revocable]struct{}{}} }

func (o *openCalls) add(c revocable) {
	o.mu.Lock()
	o.m[c] = struct{}{}
	o.mu.Unlock()
}

func (o *openCalls) remove(c revocable) {
	o.mu.Lock()
	delete(o.m, c)
	o.mu.Unlock()
}

// recheck checks every open call against the store's current files and
// ends those no longer allowed (it runs after each reload that changed
// them, so within one reload interval of the change).
func (o *openCalls) recheck() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for c := range o.m {
		if err := c.stillAllowed(); err != nil {
			c.revoke(err)
		}
	}
}

// revocableUnary are the unary methods registered with openCalls: those
// whose handler may wait long enough for a revocation to land meanwhile.
var revocableUnary = map[string]bool{coordinatorv1.LockService_Acquire_FullMethodName: true}

// stillAllowed answers nil if the credential of the call whose incoming
// context is ctx still names id, and the current policy still allows req to
// method (or, before a stream's first message, req nil, still knows id).
func stillAllowed(ctx context.Context, store *authz.Store, cfg authConfig, id, method string, req any) error {
	got, err := identify(ctx, store, cfg.fromCN)
	switch {
	case err != nil:
		return errIdentityRevoked(codes.Unauthenticated, "the credentials of this call were revoked: "+status.Convert(err).Message(), id)
	case got != id:
		return errIdentityRevoked(codes.Unauthenticated, "the credentials of this call now name another identity; reconnect", id)
	}
	p := store.Policy()
	if AdminOnly[method] && !p.IsAdmin(id) || req == nil && !p.Known(id) {
		return errIdentityRevoked(codes.PermissionDenied, "identity "+strconv.Quote(id)+" was removed from the authorization policy; this call has ended", id)
	}
	if req != nil {
		if err := authorize(p, id, method, req); err != nil {
			return errIdentityRevoked(codes.PermissionDenied, "the authorization policy changed: "+status.Convert(err).Message()+"; this call has ended", id)
		}
	}
	return nil
}

// ending is how a revocation ends a call: its context is cancelled, so the
// handler returns, and the interceptor answers the revocation's status
// instead of the handler's CANCELLED.
type ending struct {
	cancel context.CancelCauseFunc

	mu      sync.Mutex
	revoked error // the status that ended the call, once revoked
}

func (e *ending) revoke(err error) {
	e.mu.Lock()
	if e.revoked == nil {
		e.revoked = err
	}
	e.mu.Unlock()
	e.cancel(err)
}

// revocation is the status that ended the call, nil if none did.
func (e *ending) revocation() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.revoked
}

// authCall is a revocable unary call.
type authCall struct {
	ending
	in     context.Context // the call's own context: its credentials
	ctx    context.Context // what the handler runs under
	id     string
	method string
	req    any
	store  *authz.Store
	cfg    authConfig
}

func newAuthCall(in, scoped context.Context, id, method string, req any, store *authz.Store, cfg authConfig) *authCall {
	ctx, cancel := context.WithCancelCause(scoped)
	return &authCall{ending: ending{cancel: cancel}, in: in, ctx: ctx, id: id, method: method, req: req, store: store, cfg: cfg}
}

func (c *authCall) stillAllowed() error {
	return stillAllowed(c.in, c.store, c.cfg, c.id, c.method, c.req)
}

// stillAllowed answers nil if the stream's credential still names its
// identity and the current policy still allows what its first message
// asked for (or, before any message, still knows the identity).
func (s *authStream) stillAllowed() error {
	s.mu.Lock()
	first := s.first
	s.mu.Unlock()
	return stillAllowed(s.ServerStream.Context(), s.store, s.cfg, s.id, s.method, first)
}
