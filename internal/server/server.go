// Package server adapts gRPC requests of coordinator.v1.LockService and
// FenceService to the lease and fence domain packages.
//
// One file per RPC group: locks.go (Acquire, Release, KeepAlive, Describe,
// List), hold.go (Hold), watch.go (Watch), sessions.go (the session calls),
// admin.go (ForceRelease), fence.go (ValidateToken and the marks), counters.go
// (CounterService). Each
// handler adapts its request to the domain call and the result to its
// response; every error leaves through toStatus (errors.go). The
// interceptors live one per file: auth.go, ratelimit.go, streams.go,
// codec.go, metrics.go.
package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/counter"
	"github.com/coordinatord/coordinatord/internal/fence"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// LockService implements coordinatorv1.LockServiceServer.
type LockService struct {
	coordinatorv1.UnimplementedLockServiceServer
	leases   *lease.Manager
	fence    *fence.Validator
	counters *counter.Service
	log      *slog.Logger
	epochs   Epochs       // WithEpochs
	shards   *shard.Owner // WithShardCore: the lock calls on the shard-owner core
	fwd      *Forwarder   // the shard core's forwarding to other members (NewGRPCServer)
}

// NewLockService returns the handlers over the given domain services (c
// may be nil: no CounterService).
func NewLockService(l *lease.Manager, f *fence.Validator, c *counter.Service, log *slog.Logger, opts ...ServiceOption) *LockService {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &LockService{leases: l, fence: f, counters: c, log: log, epochs: epochZero{}}
	for _, o := range opts {
		o(s)
	}
	return s
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

// holderPB is a holder on the wire, its token in epoch.
func holderPB(h *lease.Holder, epoch int64) *coordinatorv1.Holder {
	return &coordinatorv1.Holder{
		Name:       h.Name,
		Token:      wireToken(epoch, h.Token),
		Owner:      h.Owner,
		AcquiredAt: timestamp(h.AcquiredAt),
		ExpiresAt:  timestamp(h.ExpiresAt),
		Mode:       modePB(h.Shared),
		Slot:       h.Slot,
		Limit:      max(h.Limit, 1),
	}
}

func holdersPB(hs []lease.Holder, epoch int64) []*coordinatorv1.Holder {
	var out []*coordinatorv1.Holder
	for i := range hs {
		out = append(out, holderPB(&hs[i], epoch))
	}
	return out
}
