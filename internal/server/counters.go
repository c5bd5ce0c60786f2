package server

import (
	"context"
	"log/slog"

	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/authz"
	"github.com/coordinatord/coordinatord/internal/counter"
)

// CounterService implements coordinatorv1.CounterServiceServer over the
// counter package: Hit, Get and Reset. Names are authorized as lock names
// (authorize.go: the requests are named).
type CounterService struct {
	coordinatorv1.UnimplementedCounterServiceServer
	counters *counter.Service
	log      *slog.Logger
}

// CounterService returns the counter handlers (nil without counters).
func (s *LockService) CounterService() *CounterService {
	if s.counters == nil {
		return nil
	}
	return &CounterService{counters: s.counters, log: s.log}
}

// Hit implements coordinatorv1.CounterServiceServer.
func (s *CounterService) Hit(ctx context.Context, req *coordinatorv1.HitRequest) (*coordinatorv1.HitResponse, error) {
	h, err := hitOf(ctx, req)
	if err != nil {
		return nil, toStatus(ctx, s.log, "Hit", err)
	}
	r, err := s.counters.Hit(ctx, h)
	if err != nil {
		return nil, toStatus(ctx, s.log, "Hit", err)
	}
	return &coordinatorv1.HitResponse{Allowed: r.Allowed, Count: r.Count, Remaining: r.Remaining, ResetAt: timestamp(r.ResetAt),
		RetryAfter: durationpb.New(r.RetryAfter), Uncounted: r.Uncounted, Replayed: r.Replayed}, nil
}

// hitOf is the domain hit of req, by the authenticated caller (never a
// request field). The proto's enum numbers are the domain's.
func hitOf(ctx context.Context, req *coordinatorv1.HitRequest) (counter.Hit, error) {
	w, err := duration("window", req.GetWindow())
	if err != nil {
		return counter.Hit{}, err
	}
	h := counter.Hit{Name: req.GetName(), Hits: 1, Limit: req.GetLimit(), RequestID: req.GetRequestId(),
		Algorithm: counter.Algorithm(req.GetAlgorithm()), Policy: counter.Policy(req.GetOnUnavailable())}
	if req.GetHits() != nil {
		h.Hits = req.GetHits().GetValue()
	}
	if w != nil {
		h.Window = *w
	}
	h.Identity, _ = authz.FromContext(ctx)
	return h, nil
}

// Get implements coordinatorv1.CounterServiceServer.
func (s *CounterService) Get(ctx context.Context, req *coordinatorv1.GetRequest) (*coordinatorv1.GetResponse, error) {
	c, err := s.counters.Get(ctx, req.GetName())
	if err != nil {
		return nil, toStatus(ctx, s.log, "Get", err)
	}
	if !c.Exists {
		return &coordinatorv1.GetResponse{}, nil
	}
	return &coordinatorv1.GetResponse{Exists: true, Algorithm: coordinatorv1.Algorithm(c.Algorithm), Count: c.Count, Limit: c.Limit,
		Remaining: c.Remaining, ResetAt: timestamp(c.ResetAt), Window: durationpb.New(c.Window)}, nil
}

// Reset implements coordinatorv1.CounterServiceServer.
func (s *CounterService) Reset(ctx context.Context, req *coordinatorv1.ResetRequest) (*coordinatorv1.ResetResponse, error) {
	existed, err := s.counters.Reset(ctx, req.GetName())
	if err != nil {
		return nil, toStatus(ctx, s.log, "Reset", err)
	}
	return &coordinatorv1.ResetResponse{Existed: existed}, nil
}
