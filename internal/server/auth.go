package server

import (
	"context"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/authz"
)

// AdminOnly are the methods only admins may call, whatever their request
// names.
var AdminOnly = map[string]bool{
	coordinatorv1.LockService_ForceRelease_FullMethodName: true,
	coordinatorv1.FenceService_DeleteMark_FullMethodName:  true,
	coordinatorv1.FenceService_RebindMark_FullMethodName:  true,
}

// AnyKnownIdentity are the methods every identity named in the policy may
// call: sessions belong to no lock name (each Acquire through a session is
// checked by its name). A session belongs to the identity that opened it:
// its handle answers no other (PERMISSION_DENIED, checked by the lease
// package), and what it lists or releases is limited to the caller's lock
// prefixes (withLockScope).
var AnyKnownIdentity = map[string]bool{
	coordinatorv1.LockService_OpenSession_FullMethodName:      true,
	coordinatorv1.LockService_KeepAliveSession_FullMethodName: true,
	coordinatorv1.LockService_CloseSession_FullMethodName:     true,
}

// exempt methods need no identity: probes (health) and tools (reflection)
// must reach them.
func exempt(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/grpc.health.v1.Health/") ||
		strings.HasPrefix(fullMethod, "/grpc.reflection.")
}

type (
	named    interface{ GetName() string }
	prefixed interface{ GetPrefix() string }
	resource interface{ GetResource() string }
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
// Revocation: every open stream is checked again whenever the store loads
// changed files; one whose credential no longer names its identity ends with
// UNAUTHENTICATED, one its identity may no longer use with
// PERMISSION_DENIED (reason IDENTITY_REVOKED), so a revoked identity keeps
// no Hold or Watch stream past the next reload.
func AuthInterceptors(store *authz.Store, opts ...AuthOption) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	var cfg authConfig
	for _, o := range opts {
		o(&cfg)
	}
	open := newOpenStreams()
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
		return h(withLockScope(authz.NewContext(ctx, id), store, id), req)
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
			return errDenied(id, "may not call "+info.FullMethod+" (admins only)")
		}
		as := newAuthStream(ss, id, info.FullMethod, store, cfg)
		open.add(as)
		defer open.remove(as)
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
	ctx    context.Context
	cancel context.CancelCauseFunc
	id     string
	method string
	store  *authz.Store
	cfg    authConfig

	mu      sync.Mutex
	first   any   // the first message received, once authorized
	revoked error // the status that ended the stream, once revoked
}

func newAuthStream(ss grpc.ServerStream, id, method string, store *authz.Store, cfg authConfig) *authStream {
	ctx, cancel := context.WithCancelCause(withLockScope(authz.NewContext(ss.Context(), id), store, id))
	return &authStream{ServerStream: ss, ctx: ctx, cancel: cancel, id: id, method: method, store: store, cfg: cfg}
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

func identify(ctx context.Context, store *authz.Store, fromCN bool) (string, error) {
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 && len(ti.State.VerifiedChains[0]) > 0 {
			if id := authz.IdentityFromCert(ti.State.VerifiedChains[0][0], fromCN); id != "" {
				return id, nil
			}
			if fromCN {
				return "", errUnauthenticated("the client certificate names no identity (no URI SAN, DNS SAN or CN)")
			}
			return "", errUnauthenticated("the client certificate names no identity: it has no URI SAN (e.g. a SPIFFE ID) or DNS SAN; " +
				"issue it with one (its subject CN counts only with --tls-identity-from-cn)")
		}
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return "", errUnauthenticated("no client certificate and no bearer token: present a client certificate or the metadata \"authorization: Bearer <token>\"")
	}
	tok, ok := bearerToken(vals[0])
	if !ok || len(vals) > 1 {
		return "", errUnauthenticated("malformed authorization metadata: want exactly one \"Bearer <token>\"")
	}
	id, ok := store.Tokens().Lookup(tok)
	if !ok {
		return "", errUnauthenticated("unknown bearer token")
	}
	return id, nil
}

// bearerToken is the token of an "authorization" value "Bearer <token>";
// the scheme is case-insensitive (RFC 9110, section 11.1), so "bearer" and
// "BEARER" are the same.
func bearerToken(v string) (string, bool) {
	scheme, tok, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return "", false
	}
	return tok, true
}

func authorize(p *authz.Policy, id, method string, req any) error {
	if AdminOnly[method] {
		if p.IsAdmin(id) {
			return nil
		}
		return errDenied(id, "may not call "+method+" (admins only)")
	}
	if AnyKnownIdentity[method] {
		if p.Known(id) {
			return nil
		}
		return errDenied(id, "is not in the authorization policy")
	}
	// A Hold stream names its lock in its first message (acquire or
	// resume); the handler refuses any other first message, so heartbeats
	// and releases ride on that check.
	if h, ok := req.(*coordinatorv1.HoldRequest); ok {
		switch {
		case h.GetAcquire() != nil:
			req = h.GetAcquire().GetRequest()
		case h.GetResume() != nil:
			req = h.GetResume()
		default:
			return nil
		}
	}
	// ListMarks lists resources, not locks: its prefix is checked against
	// the resource prefixes (and every mark it lists is inside it).
	if r, ok := req.(*coordinatorv1.ListMarksRequest); ok {
		if !p.MayListResources(id, r.GetPrefix()) {
			return errDenied(id, "may not list the marks of this prefix: list a prefix inside your own resource prefixes")
		}
		return nil
	}
	checked := false
	if r, ok := req.(named); ok {
		checked = true
		if !p.MayLock(id, r.GetName()) {
			return errDenied(id, "may not use this lock name")
		}
	}
	if r, ok := req.(prefixed); ok {
		checked = true
		if !p.MayList(id, r.GetPrefix()) {
			return errDenied(id, "may not list this prefix: list a prefix inside your own")
		}
	}
	if r, ok := req.(resource); ok && r.GetResource() != "" {
		checked = true
		if !p.MayResource(id, r.GetResource()) {
			return errDenied(id, "may not use this resource")
		}
	}
	if !checked && !p.IsAdmin(id) {
		return errDenied(id, "may not call "+method+" (names no lock: admins only)")
	}
	return nil
}
