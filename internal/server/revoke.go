package server

import (
	"strconv"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// openStreams are the authenticated streams in progress, so that a policy
// or token change reaches those already authorized: without it, a revoked
// identity would keep its Hold and Watch streams for as long as it liked.
type openStreams struct {
	mu sync.Mutex
	m  map[*authStream]struct{}
}

func newOpenStreams() *openStreams { return &openStreams{m: map[*authStream]struct{}{}} }

func (o *openStreams) add(s *authStream) {
	o.mu.Lock()
	o.m[s] = struct{}{}
	o.mu.Unlock()
}

func (o *openStreams) remove(s *authStream) {
	o.mu.Lock()
	delete(o.m, s)
	o.mu.Unlock()
	s.cancel(nil)
}

// recheck checks every open stream against the store's current files and
// ends those no longer allowed (it runs after each reload that changed
// them, so within one reload interval of the change).
func (o *openStreams) recheck() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for s := range o.m {
		if err := s.stillAllowed(); err != nil {
			s.revoke(err)
		}
	}
}

// stillAllowed answers nil if the stream's credential still names its
// identity and the current policy still allows what its first message
// asked for (or, before any message, still knows the identity).
func (s *authStream) stillAllowed() error {
	id, err := identify(s.ServerStream.Context(), s.store, s.cfg.fromCN)
	switch {
	case err != nil:
		return errIdentityRevoked(codes.Unauthenticated, "the credentials of this stream were revoked: "+status.Convert(err).Message(), s.id)
	case id != s.id:
		return errIdentityRevoked(codes.Unauthenticated, "the credentials of this stream now name another identity; reconnect", s.id)
	}
	p := s.store.Policy()
	s.mu.Lock()
	first := s.first
	s.mu.Unlock()
	if AdminOnly[s.method] && !p.IsAdmin(id) || first == nil && !p.Known(id) {
		return errIdentityRevoked(codes.PermissionDenied, "identity "+strconv.Quote(id)+" was removed from the authorization policy; this stream has ended", id)
	}
	if first != nil {
		if err := authorize(p, id, s.method, first); err != nil {
			return errIdentityRevoked(codes.PermissionDenied, "the authorization policy changed: "+status.Convert(err).Message()+"; this stream has ended", id)
		}
	}
	return nil
}

// revoke ends the stream: its context is cancelled, so the handler returns,
// and the interceptor answers err instead of the handler's CANCELLED.
func (s *authStream) revoke(err error) {
	s.mu.Lock()
	if s.revoked == nil {
		s.revoked = err
	}
	s.mu.Unlock()
	s.cancel(err)
}

// revocation is the status that ended the stream, nil if none did.
func (s *authStream) revocation() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.revoked
}
