package server

// Sessions on the shard-owner core (-core shard), with the queue core's
// contract (sessions.go): the same messages, codes and reasons. A session
// lives on the owner of its home shard (internal/shard/sessions.go), which
// OpenSession picks among the shards it serves, so that opening is never
// forwarded (a relay forwards it to a member). KeepAliveSession and
// CloseSession are forwarded to that owner, which renews (in memory) or
// ends the session, then fans the call out to every member that owns
// shards ("coordinatord-session-grants": renew or release), each of which
// renews or releases the locks held through the session on its own shards
// and answers them; the answer lists them all.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/locktable"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// mdSessionGrants marks a session call fanned out by the session's owner:
// "renew" or "release" the locks held through it on this member only.
const mdSessionGrants = "coordinatord-session-grants"

// openSessionOnShards is OpenSession on the shard core.
func (s *LockService) openSessionOnShards(ctx context.Context, req *coordinatorv1.OpenSessionRequest) (*coordinatorv1.OpenSessionResponse, error) {
	return forward(ctx, s.fwd, req, s.openSessionHere, coordinatorv1.LockServiceClient.OpenSession)
}

// openSessionHere opens a session homed on a shard this replica serves.
func (s *LockService) openSessionHere(ctx context.Context, req *coordinatorv1.OpenSessionRequest) (*coordinatorv1.OpenSessionResponse, error) {
	ttl, err := sessionTTL(req)
	if err != nil {
		return nil, err
	}
	if ttl, err = s.leases.SessionTTL(ttl, req.GetOwner()); err != nil {
		return nil, err
	}
	if _, err := s.epoch(ctx); err != nil {
		return nil, err
	}
	ss, err := s.shards.OpenSession(ctx, ttl, req.GetOwner(), callerOf(ctx))
	if err != nil {
		return nil, err
	}
	return &coordinatorv1.OpenSessionResponse{Handle: ss.Handle, Ttl: durationpb.New(ss.TTL),
		ExpiresAt: timestamp(ss.ExpiresAt), SafeUntil: timestamp(ss.ExpiresAt.Add(-lease.SafetyMargin(ss.TTL)))}, nil
}

// keepAliveSessionOnShards is KeepAliveSession on the shard core.
func (s *LockService) keepAliveSessionOnShards(ctx context.Context, req *coordinatorv1.KeepAliveSessionRequest) (*coordinatorv1.KeepAliveSessionResponse, error) {
	e, err := s.epoch(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkHandle("handle", req.GetHandle()); err != nil {
		return nil, err
	}
	if sessionGrantsCall(ctx) == "renew" { // the session's owner fanned it out: the locks here only
		hs := s.shards.RenewSessionGrants(req.GetHandle(), callerOf(ctx), scopeOf(ctx))
		return &coordinatorv1.KeepAliveSessionResponse{Holders: holdersOnShards(hs, e)}, nil
	}
	resp, err := forward(ctx, s.fwd, req, func(ctx context.Context, req *coordinatorv1.KeepAliveSessionRequest) (*coordinatorv1.KeepAliveSessionResponse, error) {
		rn, err := s.shards.KeepAliveSession(req.GetHandle(), callerOf(ctx))
		if err != nil {
			return nil, err
		}
		local := s.shards.RenewSessionGrants(req.GetHandle(), callerOf(ctx), scopeOf(ctx))
		hs, err := s.fanOutSession(ctx, "renew", func(peer coordinatorv1.LockServiceClient, ctx context.Context) ([]*coordinatorv1.Holder, error) {
			r, err := peer.KeepAliveSession(ctx, req)
			return r.GetHolders(), err
		})
		if err != nil {
			return nil, err
		}
		return &coordinatorv1.KeepAliveSessionResponse{Ttl: durationpb.New(rn.TTL), ExpiresAt: timestamp(rn.ExpiresAt),
			SafeUntil: timestamp(rn.ExpiresAt.Add(-lease.SafetyMargin(rn.TTL))), Holders: append(holdersOnShards(local, e), hs...)}, nil
	}, coordinatorv1.LockServiceClient.KeepAliveSession)
	if homeUnserved(err) {
		// The session's home shard is between owners (its owner crashed:
		// the next one honours the session for a full TTL from its
		// takeover). The client is alive and holds the handle: its locks
		// on the other members are renewed all the same, or they would
		// expire for a crash elsewhere; the call still fails, to be
		// retried until the home answers.
		s.shards.RenewSessionGrants(req.GetHandle(), callerOf(ctx), scopeOf(ctx))
		_, _ = s.fanOutSession(ctx, "renew", func(peer coordinatorv1.LockServiceClient, ctx context.Context) ([]*coordinatorv1.Holder, error) {
			r, err := peer.KeepAliveSession(ctx, req)
			return r.GetHolders(), err
		})
	}
	return resp, err
}

// homeUnserved says whether a session call failed because its home shard
// is served by nobody reachable now (SHARD_NOT_SERVED, here or from the
// peer it was forwarded to).
func homeUnserved(err error) bool {
	var ns *shard.NotServingError
	var fe *forwardedError
	switch {
	case errors.As(err, &ns):
		return true
	case errors.As(err, &fe):
		return notServedThere(fe.st)
	}
	return false
}

// closeSessionOnShards is CloseSession on the shard core.
func (s *LockService) closeSessionOnShards(ctx context.Context, req *coordinatorv1.CloseSessionRequest) (*coordinatorv1.CloseSessionResponse, error) {
	e, err := s.epoch(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkHandle("handle", req.GetHandle()); err != nil {
		return nil, err
	}
	if sessionGrantsCall(ctx) == "release" { // the session's owner fanned it out: the locks here only
		hs, err := s.shards.ReleaseSessionGrants(ctx, req.GetHandle(), callerOf(ctx), scopeOf(ctx))
		if err != nil {
			return nil, err
		}
		return &coordinatorv1.CloseSessionResponse{Released: holdersOnShards(hs, e)}, nil
	}
	return forward(ctx, s.fwd, req, func(ctx context.Context, req *coordinatorv1.CloseSessionRequest) (*coordinatorv1.CloseSessionResponse, error) {
		closed := true
		if err := s.shards.CloseSession(ctx, req.GetHandle(), callerOf(ctx)); errors.Is(err, lease.ErrSessionNotFound) {
			// Gone already (a retry of a close whose answer was lost, or
			// an expiry): closed=false, as the API says, and its locks
			// are released all the same, in case a close before did not
			// reach every member.
			closed = false
		} else if err != nil {
			return nil, err
		}
		local, err := s.shards.ReleaseSessionGrants(ctx, req.GetHandle(), callerOf(ctx), scopeOf(ctx))
		if err != nil {
			return nil, err
		}
		hs, err := s.fanOutSession(ctx, "release", func(peer coordinatorv1.LockServiceClient, ctx context.Context) ([]*coordinatorv1.Holder, error) {
			r, err := peer.CloseSession(ctx, req)
			return r.GetReleased(), err
		})
		if err != nil {
			return nil, err
		}
		return &coordinatorv1.CloseSessionResponse{Closed: closed, Released: append(holdersOnShards(local, e), hs...)}, nil
	}, coordinatorv1.LockServiceClient.CloseSession)
}

// sessionGrantsCall is the fan-out kind of a forwarded session call, ""
// if it is none.
func sessionGrantsCall(ctx context.Context) string {
	if !forwarded(ctx) {
		return ""
	}
	if v := metadata.ValueFromIncomingContext(ctx, mdSessionGrants); len(v) == 1 {
		return v[0]
	}
	return ""
}

// scopeOf is the lock names the caller may list or release under the
// current policy (nil: all).
func scopeOf(ctx context.Context) func(string) bool {
	may, _ := ctx.Value(lockScopeKey{}).(func(string) bool)
	return may
}

// fanOutSession calls every other member that owns shards (in parallel)
// with the fan-out kind, and gathers their holders. A session's locks on a
// member that cannot be reached are not renewed (or released) by this
// call: it fails UNAVAILABLE, to be retried (the session itself is
// renewed, or closed, already).
func (s *LockService) fanOutSession(ctx context.Context, kind string,
	call func(coordinatorv1.LockServiceClient, context.Context) ([]*coordinatorv1.Holder, error),
) ([]*coordinatorv1.Holder, error) {
	peers := map[string]bool{}
	own := s.shards.Ownership()
	for n := range uint32(own.ShardCount()) {
		if _, addr, known := own.Owner(n); known && addr != "" && addr != s.shards.Advertise() {
			peers[addr] = true
		}
	}
	if len(peers) == 0 {
		return nil, nil
	}
	if s.fwd == nil {
		return nil, fmt.Errorf("%w: the session's locks on other members cannot be reached (no forwarding)", lease.ErrUnavailable)
	}
	octx, ok := s.fwd.outgoing(ctx)
	if !ok {
		return nil, fmt.Errorf("%w: the session's locks on other members cannot be reached: the caller's identity cannot be forwarded (-member-secret-file)", lease.ErrUnavailable)
	}
	octx = metadata.AppendToOutgoingContext(octx, mdSessionGrants, kind)
	var mu sync.Mutex
	var out []*coordinatorv1.Holder
	var firstErr error
	var wg sync.WaitGroup
	for _, addr := range slices.Sorted(maps.Keys(peers)) {
		wg.Go(func() {
			peer, err := s.fwd.client(addr)
			var hs []*coordinatorv1.Holder
			if err == nil {
				hs, err = call(peer, octx)
			}
			mu.Lock()
			defer mu.Unlock()
			out = append(out, hs...)
			if err != nil && firstErr == nil {
				firstErr = fmt.Errorf("%w: member %s did not answer for the session's locks (%s); retry", lease.ErrUnavailable, addr, err.Error())
			}
		})
	}
	wg.Wait()
	return out, firstErr
}

// sessionOf resolves an Acquire's session on the shard core: the session
// must be live and the caller's; its TTL becomes the grant's.
func (s *LockService) sessionOf(ctx context.Context, a *locktable.Acquire, handle string) error {
	if err := checkHandle("session_handle", handle); err != nil {
		return err
	}
	rec, err := s.shards.CheckSession(ctx, handle, a.Caller)
	if err != nil {
		return err
	}
	id, secret, _ := locktable.ParseSessionHandle(handle)
	a.Session, a.Secret, a.TTL = id, secret, rec.TTL()
	return nil
}
