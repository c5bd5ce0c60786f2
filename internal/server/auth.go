package server

import (
	"context"
	"sync"

	"google.golang.org/grpc"

	"github.com/coordinatord/coordinatord/internal/authz"
)

// AuthOption configures AuthInterceptors.
type AuthOption func(*authConfig)

type authConfig struct{ fromCN bool }

// WithIdentityFromCN identifies a client certificate that has neither a URI
// nor a DNS SAN by its subject common name (-tls-identity-from-cn). Off by
// default: a CN is free text in the namespace of the SANs (see
// authz.IdentityFromCert).
func WithIdentityFromCN() AuthOption { return func(c *authConfig) { c.fromCN = true } }

// AuthInterceptors authenticate every call (except health and reflection)
// and authorize every request message against the store's current policy.
//
// Identity: the verified client certificate (authz.IdentityFromCert: URI
// SAN, then DNS SAN, then the CN only WithIdentityFromCN) if the connection
// has one; otherwise the bearer token of the "authorization: Bearer <token>"
// metadata (the scheme in any case), looked up in the token file. Never a
// request field. No identity: UNAUTHENTICATED.
//
// Authorization, per request message (each message of a stream): a GetName()
// must be a lock name the identity may use, a GetPrefix() a prefix it may
// List (refused, not filtered; ListMarks' prefix: a resource prefix it may
// list), a non-empty GetResource() a resource it may use; the AnyKnownIdentity methods (sessions) need an identity the policy
// names; a message with none of these, and the AdminOnly methods, need an
// admin. Hold streams are checked by the name of their first message.
// Otherwise PERMISSION_DENIED, before the handler runs: nothing about the
// lock is read or revealed.
//
// Revocation: every open stream, and every Acquire in progress (it may be
// waiting in a queue), is checked again whenever the store loads changed
// files; one whose credential no longer names its identity ends with
// UNAUTHENTICATED, one its identity may no longer use with
// PERMISSION_DENIED (reason IDENTITY_REVOKED), so a revoked identity keeps
// no Hold or Watch stream, and no place in a queue, past the next reload.
// An Acquire granted before the revocation reached it answers its grant,
// as one granted just before the change would; the grant's KeepAlive and
// Release are refused from then on like any call of the identity.
func AuthInterceptors(store *authz.Store, opts ...AuthOption) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	var cfg authConfig
	for _, o := range opts {
		o(&cfg)
	}
	open := newOpenCalls()
	store.OnChange(open.recheck)
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if exempt(info.FullMethod) {
			return h(ctx, req)
		}
		id, err := identify(ctx, store, cfg.fromCN)
		if err != nil {
			return nil, err
		}
		if err := authorize(store.Policy(), id, info.FullMethod, req); err != nil {
			return nil, err
		}
		scoped := withLockScope(authz.NewContext(ctx, id), store, id)
		if !revocableUnary[info.FullMethod] {
			return h(scoped, req)
		}
		c := newAuthCall(ctx, scoped, id, info.FullMethod, req, store, cfg)
		open.add(c)
		defer func() { open.remove(c); c.cancel(nil) }()
		resp, err := h(c.ctx, req)
		if r := c.revocation(); r != nil && err != nil {
			return nil, r
		}
		return resp, err
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if exempt(info.FullMethod) {
			return h(srv, ss)
		}
		id, err := identify(ss.Context(), store, cfg.fromCN)
		if err != nil {
			return err
		}
		if AdminOnly[info.FullMethod] && !store.Policy().IsAdmin(id) {
			return errAdminOnly(id, info.FullMethod, "")
		}
		as := newAuthStream(ss, id, info.FullMethod, store, cfg)
		open.add(as)
		defer func() { open.remove(as); as.cancel(nil) }()
		err = h(srv, as)
		if r := as.revocation(); r != nil {
			return r
		}
		return err
	}
	return unary, stream
}

// authStream checks every message the client sends, and remembers the
// first, the one that names what the stream is for, to check it again on a
// policy change.
type authStream struct {
	grpc.ServerStream
	ending
	ctx    context.Context
	id     string
	method string
	store  *authz.Store
	cfg    authConfig

	mu    sync.Mutex
	first any // the first message received, once authorized
}

func newAuthStream(ss grpc.ServerStream, id, method string, store *authz.Store, cfg authConfig) *authStream {
	ctx, cancel := context.WithCancelCause(withLockScope(authz.NewContext(ss.Context(), id), store, id))
	return &authStream{ServerStream: ss, ending: ending{cancel: cancel}, ctx: ctx, id: id, method: method, store: store, cfg: cfg}
}

func (s *authStream) Context() context.Context { return s.ctx }

func (s *authStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if err := authorize(s.store.Policy(), s.id, s.method, m); err != nil {
		return err
	}
	s.mu.Lock()
	if s.first == nil {
		s.first = m
	}
	s.mu.Unlock()
	return nil
}
