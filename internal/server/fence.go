package server

import (
	"context"
	"log/slog"

	"google.golang.org/protobuf/types/known/wrapperspb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/authz"
	"github.com/coordinatord/coordinatord/internal/fence"
	"github.com/coordinatord/coordinatord/internal/shard"
)

var reasons = map[fence.Reason]coordinatorv1.ValidateTokenResponse_Reason{
	fence.Current:    coordinatorv1.ValidateTokenResponse_REASON_CURRENT,
	fence.Superseded: coordinatorv1.ValidateTokenResponse_REASON_SUPERSEDED,
	fence.NotHeld:    coordinatorv1.ValidateTokenResponse_REASON_NOT_HELD,
	fence.Fenced:     coordinatorv1.ValidateTokenResponse_REASON_FENCED,
}

// ValidateToken implements coordinatorv1.LockServiceServer: the fencing
// check of a token against a resource's high-water mark.
func (s *LockService) ValidateToken(ctx context.Context, req *coordinatorv1.ValidateTokenRequest) (*coordinatorv1.ValidateTokenResponse, error) {
	if s.shards != nil {
		resp, err := s.validateOnShards(ctx, req)
		if err != nil {
			return nil, s.fail(ctx, "ValidateToken", err)
		}
		return resp, nil
	}
	var opts []fence.ValidateOption
	if id, ok := authz.FromContext(ctx); ok {
		opts = append(opts, fence.AsIdentity(id)) // the cap on marks counts per identity
	}
	if _, err := s.epoch(ctx); err != nil { // nothing is validated while the epoch is paused
		return nil, s.fail(ctx, "ValidateToken", err)
	}
	v, err := s.fence.Validate(ctx, req.GetName(), req.GetToken(), req.GetResource(), opts...)
	if err != nil {
		return nil, s.fail(ctx, "ValidateToken", err)
	}
	return &coordinatorv1.ValidateTokenResponse{Valid: v.Valid, Reason: reasons[v.Reason], CurrentToken: v.CurrentToken}, nil
}

// FenceService implements coordinatorv1.FenceServiceServer: operators' view
// of the per-resource high-water marks, and admins' deletion and rebinding.
type FenceService struct {
	coordinatorv1.UnimplementedFenceServiceServer
	fence  *fence.Validator
	log    *slog.Logger
	epochs Epochs
	shards *shard.Owner // the shard-owner core, if it serves the locks: see onShards
}

// FenceService returns the mark handlers over the same validator as s.
func (s *LockService) FenceService() *FenceService {
	return &FenceService{fence: s.fence, log: s.log, epochs: s.epochs, shards: s.shards}
}

// onShards refuses an admin call on the marks when the shard-owner core
// serves the locks: its marks live in its own keyspace
// (<prefix>shards/marks/, internal/shard/marks.go), not the queue core's
// that these handlers read, so they would show (or delete, or rebind) the
// wrong marks. GetMark, ListMarks, DeleteMark and RebindMark on the shard
// core are later work; until then they answer UNIMPLEMENTED
// (NOT_ON_SHARD_CORE). GetEpoch is served on both cores.
func (s *FenceService) onShards(ctx context.Context, method string) error {
	if s.shards == nil {
		return nil
	}
	return toStatus(ctx, s.log, method, errNotOnShardCore(method))
}

func markPB(m *fence.Mark) *coordinatorv1.Mark {
	pb := &coordinatorv1.Mark{Resource: m.Resource, Token: m.Token, Lock: m.Lock, UpdatedAt: timestamp(m.UpdatedAt)}
	if m.PerSlot {
		pb.Slot = wrapperspb.Int32(m.Slot)
	}
	return pb
}

// markID names the mark of resource, or of its semaphore slot when slot is
// set (the domain refuses a negative one).
func markID(resource string, slot *wrapperspb.Int32Value) fence.MarkID {
	return fence.MarkID{Resource: resource, PerSlot: slot != nil, Slot: slot.GetValue()}
}

// GetMark implements coordinatorv1.FenceServiceServer.
func (s *FenceService) GetMark(ctx context.Context, req *coordinatorv1.GetMarkRequest) (*coordinatorv1.GetMarkResponse, error) {
	if err := s.onShards(ctx, "GetMark"); err != nil {
		return nil, err
	}
	m, err := s.fence.GetMark(ctx, markID(req.GetResource(), req.GetSlot()))
	if err != nil {
		return nil, toStatus(ctx, s.log, "GetMark", err)
	}
	return &coordinatorv1.GetMarkResponse{Mark: markPB(m)}, nil
}

// ListMarks implements coordinatorv1.FenceServiceServer.
func (s *FenceService) ListMarks(ctx context.Context, req *coordinatorv1.ListMarksRequest) (*coordinatorv1.ListMarksResponse, error) {
	if err := s.onShards(ctx, "ListMarks"); err != nil {
		return nil, err
	}
	ms, next, err := s.fence.ListMarks(ctx, req.GetPrefix(), int(req.GetPageSize()), req.GetPageToken())
	if err != nil {
		return nil, toStatus(ctx, s.log, "ListMarks", err)
	}
	resp := &coordinatorv1.ListMarksResponse{NextPageToken: next}
	for i := range ms {
		resp.Marks = append(resp.Marks, markPB(&ms[i]))
	}
	return resp, nil
}

// DeleteMark implements coordinatorv1.FenceServiceServer (admins only, see
// AdminOnly).
func (s *FenceService) DeleteMark(ctx context.Context, req *coordinatorv1.DeleteMarkRequest) (*coordinatorv1.DeleteMarkResponse, error) {
	if err := s.onShards(ctx, "DeleteMark"); err != nil {
		return nil, err
	}
	m, err := s.fence.DeleteMark(ctx, markID(req.GetResource(), req.GetSlot()))
	if err != nil {
		return nil, toStatus(ctx, s.log, "DeleteMark", err)
	}
	return &coordinatorv1.DeleteMarkResponse{Mark: markPB(m)}, nil
}

// GetEpoch implements coordinatorv1.FenceServiceServer (it names no lock:
// with authorization, admins only).
func (s *FenceService) GetEpoch(context.Context, *coordinatorv1.GetEpochRequest) (*coordinatorv1.GetEpochResponse, error) {
	st := s.epochs.Status()
	return &coordinatorv1.GetEpochResponse{Epoch: st.Epoch, Floor: st.Floor, Paused: st.Paused}, nil
}

// RebindMark implements coordinatorv1.FenceServiceServer (admins only, see
// AdminOnly).
func (s *FenceService) RebindMark(ctx context.Context, req *coordinatorv1.RebindMarkRequest) (*coordinatorv1.RebindMarkResponse, error) {
	if err := s.onShards(ctx, "RebindMark"); err != nil {
		return nil, err
	}
	m, err := s.fence.RebindMark(ctx, markID(req.GetResource(), req.GetSlot()), req.GetLock())
	if err != nil {
		return nil, toStatus(ctx, s.log, "RebindMark", err)
	}
	return &coordinatorv1.RebindMarkResponse{Mark: markPB(m)}, nil
}
