package server

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/epoch"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// Acquire implements coordinatorv1.LockServiceServer.
func (s *LockService) Acquire(ctx context.Context, req *coordinatorv1.AcquireRequest) (*coordinatorv1.AcquireResponse, error) {
	if s.shards != nil {
		resp, err := s.acquireOnShards(ctx, req)
		if err != nil {
			return nil, s.fail(ctx, "Acquire", err)
		}
		return resp, nil
	}
	g, token, err := s.acquire(ctx, req)
	if err != nil {
		return nil, s.fail(ctx, "Acquire", err)
	}
	return grantPB(g, token), nil
}

// acquire is the domain call of an AcquireRequest, as Acquire and the first
// message of a Hold make it: the request's fields and the authenticated
// caller (never a request field). It answers the grant and its wire token;
// nothing is granted while the token epoch is paused, and a grant across a
// change of epoch is refused (raising the epoch ended it).
func (s *LockService) acquire(ctx context.Context, req *coordinatorv1.AcquireRequest) (*lease.Grant, int64, error) {
	opts, err := acquireOptions(req)
	if err != nil {
		return nil, 0, err
	}
	opts = append(opts, ownedOptions(ctx)...)
	opts = append(opts, callerOptions(ctx)...)
	before, err := s.epoch(ctx)
	if err != nil {
		return nil, 0, err
	}
	g, err := s.leases.Acquire(ctx, req.GetName(), opts...)
	if err != nil {
		return nil, 0, wireErr(before, err)
	}
	after, err := s.epoch(ctx)
	if err == nil && after != before {
		err = &epoch.PausedError{Reason: fmt.Sprintf("the token epoch changed from %d to %d during the call", before, after)}
	}
	if err != nil {
		// Paused during the call: the grant may stand on a history etcd
		// lost. It is given up (conditionally on its token and handle),
		// not left to hold the lock until its TTL while the caller retries.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, rerr := s.leases.Release(rctx, req.GetName(), g.Token, g.Handle, callOptions(ctx)...); rerr != nil {
			s.log.WarnContext(ctx, "a grant made while the token epoch paused was not released; it ends with its TTL", "name", req.GetName(), "err", rerr)
		}
		return nil, 0, err
	}
	return g, wireToken(after, g.Token), nil
}

// acquireOptions converts an AcquireRequest's optional fields.
func acquireOptions(req *coordinatorv1.AcquireRequest) ([]lease.AcquireOption, error) {
	opts := []lease.AcquireOption{lease.WithOwner(req.GetOwner()), lease.WithRequestID(req.GetRequestId()),
		lease.WithLimit(req.GetLimit()), lease.WithMode(lease.Mode(req.GetMode()))}
	for _, d := range []struct {
		field string
		v     *durationpb.Duration
		opt   func(time.Duration) lease.AcquireOption
	}{
		{"ttl", req.GetTtl(), lease.WithTTL},
		{"wait", req.GetWait(), lease.WithWait},
		{"max_hold", req.GetMaxHold(), lease.WithMaxHold},
		{"lock_delay", req.GetLockDelay(), lease.WithLockDelay},
	} {
		v, err := duration(d.field, d.v)
		if err != nil {
			return nil, err
		}
		if v != nil {
			opts = append(opts, d.opt(*v))
		}
	}
	if h := req.GetSessionHandle(); h != "" {
		if req.GetTtl() != nil {
			return nil, &lease.FieldError{Field: "ttl", Reason: "must be unset with session_handle: the session's TTL applies"}
		}
		opts = append(opts, lease.WithSession(h))
	}
	return opts, nil
}

// grantPB is a grant on the wire, with its wire token.
func grantPB(g *lease.Grant, token int64) *coordinatorv1.AcquireResponse {
	return &coordinatorv1.AcquireResponse{
		Token:      token,
		Handle:     g.Handle,
		LeaseId:    g.LeaseID,
		Ttl:        durationpb.New(g.TTL),
		ExpiresAt:  timestamp(g.ExpiresAt),
		SafeUntil:  timestamp(g.SafeUntil),
		AcquiredAt: timestamp(g.AcquiredAt),
		Resumed:    g.Resumed,
		Slot:       g.Slot,
		Mode:       modePB(g.Shared),
	}
}

// modePB is the wire mode of a holder: shared or exclusive.
func modePB(shared bool) coordinatorv1.LockMode {
	if shared {
		return coordinatorv1.LockMode_LOCK_MODE_SHARED
	}
	return coordinatorv1.LockMode_LOCK_MODE_EXCLUSIVE
}

// Release implements coordinatorv1.LockServiceServer.
func (s *LockService) Release(ctx context.Context, req *coordinatorv1.ReleaseRequest) (*coordinatorv1.ReleaseResponse, error) {
	if s.shards != nil {
		resp, err := s.releaseOnShards(ctx, req)
		if err != nil {
			return nil, s.fail(ctx, "Release", err)
		}
		return resp, nil
	}
	rev, current, err := s.revisionOf(ctx, req.GetToken())
	if err != nil {
		return nil, s.fail(ctx, "Release", err)
	}
	if !current {
		return &coordinatorv1.ReleaseResponse{Released: false}, nil
	}
	ok, err := s.leases.Release(ctx, req.GetName(), rev, req.GetHandle(), callOptions(ctx)...)
	if err == nil {
		err = s.unchanged(ctx, req.GetToken())
	}
	if err != nil {
		return nil, s.fail(ctx, "Release", err)
	}
	return &coordinatorv1.ReleaseResponse{Released: ok}, nil
}

// KeepAlive implements coordinatorv1.LockServiceServer.
func (s *LockService) KeepAlive(ctx context.Context, req *coordinatorv1.KeepAliveRequest) (*coordinatorv1.KeepAliveResponse, error) {
	if s.shards != nil {
		resp, err := s.keepAliveOnShards(ctx, req)
		if err != nil {
			return nil, s.fail(ctx, "KeepAlive", err)
		}
		return resp, nil
	}
	rev, current, err := s.revisionOf(ctx, req.GetToken())
	if err == nil && !current {
		err = lease.ErrNotHeld
	}
	if err != nil {
		return nil, s.fail(ctx, "KeepAlive", err)
	}
	r, err := s.leases.KeepAlive(ctx, req.GetName(), rev, req.GetHandle(), callOptions(ctx)...)
	if err == nil {
		err = s.unchanged(ctx, req.GetToken())
	}
	if err != nil {
		return nil, s.fail(ctx, "KeepAlive", err)
	}
	return renewalPB(r), nil
}

func renewalPB(r *lease.Renewal) *coordinatorv1.KeepAliveResponse {
	return &coordinatorv1.KeepAliveResponse{Ttl: durationpb.New(r.TTL), ExpiresAt: timestamp(r.ExpiresAt), SafeUntil: timestamp(r.SafeUntil)}
}

// Describe implements coordinatorv1.LockServiceServer.
func (s *LockService) Describe(ctx context.Context, req *coordinatorv1.DescribeRequest) (*coordinatorv1.DescribeResponse, error) {
	if s.shards != nil {
		resp, err := s.describeOnShards(ctx, req)
		if err != nil {
			return nil, s.fail(ctx, "Describe", err)
		}
		return resp, nil
	}
	e, err := s.epoch(ctx)
	if err != nil {
		return nil, s.fail(ctx, "Describe", err)
	}
	d, err := s.leases.Describe(ctx, req.GetName())
	if err != nil {
		return nil, s.fail(ctx, "Describe", err)
	}
	resp := &coordinatorv1.DescribeResponse{}
	if d.Holder != nil {
		resp.Holder = holderPB(d.Holder, e)
	}
	resp.Holders = holdersPB(d.Holders, e)
	for _, w := range d.Waiters {
		resp.Waiters = append(resp.Waiters, &coordinatorv1.Waiter{Owner: w.Owner, WaitingSince: timestamp(w.WaitingSince), Mode: modePB(w.Shared)})
	}
	return resp, nil
}

// List implements coordinatorv1.LockServiceServer.
func (s *LockService) List(ctx context.Context, req *coordinatorv1.ListRequest) (*coordinatorv1.ListResponse, error) {
	if s.shards != nil {
		resp, err := s.listOnShards(ctx, req)
		if err != nil {
			return nil, s.fail(ctx, "List", err)
		}
		return resp, nil
	}
	e, err := s.epoch(ctx)
	if err != nil {
		return nil, s.fail(ctx, "List", err)
	}
	hs, next, err := s.leases.List(ctx, req.GetPrefix(), int(req.GetPageSize()), req.GetPageToken())
	if err != nil {
		return nil, s.fail(ctx, "List", err)
	}
	return &coordinatorv1.ListResponse{Holders: holdersPB(hs, e), NextPageToken: next}, nil
}
