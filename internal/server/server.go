// Package server adapts gRPC requests of coordinator.v1.LockService to the
// lease and fence domain packages.
package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/fence"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// LockService implements coordinatorv1.LockServiceServer.
type LockService struct {
	coordinatorv1.UnimplementedLockServiceServer
	leases *lease.Manager
	fence  *fence.Validator
	log    *slog.Logger
}

// NewLockService returns the handlers over the given domain services.
func NewLockService(l *lease.Manager, f *fence.Validator, log *slog.Logger) *LockService {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &LockService{leases: l, fence: f, log: log}
}

func (s *LockService) fail(ctx context.Context, method string, err error) error {
	return toStatus(ctx, s.log, method, err)
}

// duration converts an optional Duration field; nil stays nil.
func duration(field string, d *durationpb.Duration) (*time.Duration, error) {
	if d == nil {
		return nil, nil
	}
	if err := d.CheckValid(); err != nil {
		return nil, &lease.FieldError{Field: field, Reason: fmt.Sprintf("is not a valid duration: %v", err)}
	}
	v := d.AsDuration()
	return &v, nil
}

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// Acquire implements coordinatorv1.LockServiceServer.
func (s *LockService) Acquire(ctx context.Context, req *coordinatorv1.AcquireRequest) (*coordinatorv1.AcquireResponse, error) {
	const method = "Acquire"
	opts, err := acquireOptions(req)
	if err != nil {
		return nil, s.fail(ctx, method, err)
	}
	opts = append(opts, ownedOptions(ctx)...)
	opts = append(opts, callerOptions(ctx)...)
	g, err := s.leases.Acquire(ctx, req.GetName(), opts...)
	if err != nil {
		return nil, s.fail(ctx, method, err)
	}
	return grantPB(g), nil
}

// acquireOptions converts an AcquireRequest's optional fields.
func acquireOptions(req *coordinatorv1.AcquireRequest) ([]lease.AcquireOption, error) {
	opts := []lease.AcquireOption{lease.WithOwner(req.GetOwner()), lease.WithRequestID(req.GetRequestId())}
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

func grantPB(g *lease.Grant) *coordinatorv1.AcquireResponse {
	return &coordinatorv1.AcquireResponse{
		Token:      g.Token,
		Handle:     g.Handle,
		LeaseId:    g.LeaseID,
		Ttl:        durationpb.New(g.TTL),
		ExpiresAt:  timestamp(g.ExpiresAt),
		SafeUntil:  timestamp(g.SafeUntil),
		AcquiredAt: timestamp(g.AcquiredAt),
		Resumed:    g.Resumed,
	}
}

// Release implements coordinatorv1.LockServiceServer.
func (s *LockService) Release(ctx context.Context, req *coordinatorv1.ReleaseRequest) (*coordinatorv1.ReleaseResponse, error) {
	ok, err := s.leases.Release(ctx, req.GetName(), req.GetToken(), req.GetHandle(), callOptions(ctx)...)
	if err != nil {
		return nil, s.fail(ctx, "Release", err)
	}
	return &coordinatorv1.ReleaseResponse{Released: ok}, nil
}

// KeepAlive implements coordinatorv1.LockServiceServer.
func (s *LockService) KeepAlive(ctx context.Context, req *coordinatorv1.KeepAliveRequest) (*coordinatorv1.KeepAliveResponse, error) {
	r, err := s.leases.KeepAlive(ctx, req.GetName(), req.GetToken(), req.GetHandle(), callOptions(ctx)...)
	if err != nil {
		return nil, s.fail(ctx, "KeepAlive", err)
	}
	return renewalPB(r), nil
}

func renewalPB(r *lease.Renewal) *coordinatorv1.KeepAliveResponse {
	return &coordinatorv1.KeepAliveResponse{Ttl: durationpb.New(r.TTL), ExpiresAt: timestamp(r.ExpiresAt), SafeUntil: timestamp(r.SafeUntil)}
}

func holderPB(h *lease.Holder) *coordinatorv1.Holder {
	return &coordinatorv1.Holder{
		Name:       h.Name,
		Token:      h.Token,
		Owner:      h.Owner,
		AcquiredAt: timestamp(h.AcquiredAt),
		ExpiresAt:  timestamp(h.ExpiresAt),
	}
}

// Describe implements coordinatorv1.LockServiceServer.
func (s *LockService) Describe(ctx context.Context, req *coordinatorv1.DescribeRequest) (*coordinatorv1.DescribeResponse, error) {
	d, err := s.leases.Describe(ctx, req.GetName())
	if err != nil {
		return nil, s.fail(ctx, "Describe", err)
	}
	resp := &coordinatorv1.DescribeResponse{}
	if d.Holder != nil {
		resp.Holder = holderPB(d.Holder)
	}
	for _, w := range d.Waiters {
		resp.Waiters = append(resp.Waiters, &coordinatorv1.Waiter{Owner: w.Owner, WaitingSince: timestamp(w.WaitingSince)})
	}
	return resp, nil
}

// List implements coordinatorv1.LockServiceServer.
func (s *LockService) List(ctx context.Context, req *coordinatorv1.ListRequest) (*coordinatorv1.ListResponse, error) {
	hs, next, err := s.leases.List(ctx, req.GetPrefix(), int(req.GetPageSize()), req.GetPageToken())
	if err != nil {
		return nil, s.fail(ctx, "List", err)
	}
	resp := &coordinatorv1.ListResponse{NextPageToken: next}
	for i := range hs {
		resp.Holders = append(resp.Holders, holderPB(&hs[i]))
	}
	return resp, nil
}
