package server

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// OpenSession implements coordinatorv1.LockServiceServer.
func (s *LockService) OpenSession(ctx context.Context, req *coordinatorv1.OpenSessionRequest) (*coordinatorv1.OpenSessionResponse, error) {
	if s.shards != nil {
		resp, err := s.openSessionOnShards(ctx, req)
		if err != nil {
			return nil, s.fail(ctx, "OpenSession", err)
		}
		return resp, nil
	}
	ttl, err := sessionTTL(req)
	if err != nil {
		return nil, s.fail(ctx, "OpenSession", err)
	}
	ss, err := s.leases.OpenSession(ctx, ttl, req.GetOwner(), callOptions(ctx)...)
	if err != nil {
		return nil, s.fail(ctx, "OpenSession", err)
	}
	return &coordinatorv1.OpenSessionResponse{Handle: ss.Handle, LeaseId: ss.LeaseID, Ttl: durationpb.New(ss.TTL),
		ExpiresAt: timestamp(ss.ExpiresAt), SafeUntil: timestamp(ss.SafeUntil)}, nil
}

// sessionTTL is the TTL an OpenSessionRequest asks for; 0: the default.
func sessionTTL(req *coordinatorv1.OpenSessionRequest) (time.Duration, error) {
	ttl, err := duration("ttl", req.GetTtl())
	switch {
	case err != nil:
		return 0, err
	case ttl == nil:
		return 0, nil
	case *ttl <= 0:
		return 0, &lease.FieldError{Field: "ttl", Reason: "must be at least 1s; leave it unset for the server's default"}
	}
	return *ttl, nil
}

// KeepAliveSession implements coordinatorv1.LockServiceServer.
func (s *LockService) KeepAliveSession(ctx context.Context, req *coordinatorv1.KeepAliveSessionRequest) (*coordinatorv1.KeepAliveSessionResponse, error) {
	if s.shards != nil {
		resp, err := s.keepAliveSessionOnShards(ctx, req)
		if err != nil {
			return nil, s.fail(ctx, "KeepAliveSession", err)
		}
		return resp, nil
	}
	e, err := s.epoch(ctx)
	if err != nil {
		return nil, s.fail(ctx, "KeepAliveSession", err)
	}
	r, hs, err := s.leases.KeepAliveSession(ctx, req.GetHandle(), callOptions(ctx)...)
	if err != nil {
		return nil, s.fail(ctx, "KeepAliveSession", err)
	}
	return &coordinatorv1.KeepAliveSessionResponse{Ttl: durationpb.New(r.TTL), ExpiresAt: timestamp(r.ExpiresAt), SafeUntil: timestamp(r.SafeUntil),
		Holders: holdersPB(hs, e)}, nil
}

// CloseSession implements coordinatorv1.LockServiceServer.
func (s *LockService) CloseSession(ctx context.Context, req *coordinatorv1.CloseSessionRequest) (*coordinatorv1.CloseSessionResponse, error) {
	if s.shards != nil {
		resp, err := s.closeSessionOnShards(ctx, req)
		if err != nil {
			return nil, s.fail(ctx, "CloseSession", err)
		}
		return resp, nil
	}
	e, err := s.epoch(ctx)
	if err != nil {
		return nil, s.fail(ctx, "CloseSession", err)
	}
	ok, hs, err := s.leases.CloseSession(ctx, req.GetHandle(), callOptions(ctx)...)
	if err != nil {
		return nil, s.fail(ctx, "CloseSession", err)
	}
	return &coordinatorv1.CloseSessionResponse{Closed: ok, Released: holdersPB(hs, e)}, nil
}
