package server

import (
	"context"
	"log/slog"

	"google.golang.org/protobuf/types/known/wrapperspb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/authz"
	"github.com/coordinatord/coordinatord/internal/fence"
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
// of the per-resource high-water marks, and admins' deletion and rebinding,
// on the core that serves the locks (markStore).
type FenceService struct {
	coordinatorv1.UnimplementedFenceServiceServer
	marks  markStore
	fwd    *Forwarder // the shard core's forwarding of DeleteMark and RebindMark (marksshard.go); nil: none
	log    *slog.Logger
	epochs Epochs
}

// markStore is where the marks of the core in use live, with one contract:
// the queue core's fence.Validator, or the shard core's shard.Owner (its
// marks live in its own keyspace, <prefix>shards/marks/, and a change is
// made by the owner of the mark's lock's shard, forwarded there from any
// other replica; internal/shard/markadmin.go).
type markStore interface {
	GetMark(ctx context.Context, id fence.MarkID) (*fence.Mark, error)
	ListMarks(ctx context.Context, prefix string, pageSize int, pageToken string) ([]fence.Mark, string, error)
	DeleteMark(ctx context.Context, id fence.MarkID) (*fence.Mark, error)
	RebindMark(ctx context.Context, id fence.MarkID, lock string) (*fence.Mark, error)
}

// FenceService returns the mark handlers of the core s serves the locks
// from. NewGRPCServer calls it after forwardTo, so that it forwards as s
// does.
func (s *LockService) FenceService() *FenceService {
	fs := &FenceService{marks: s.fence, fwd: s.fwd, log: s.log, epochs: s.epochs}
	if s.shards != nil {
		fs.marks = s.shards
	}
	return fs
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

// GetMark implements coordinatorv1.FenceServiceServer: read from etcd on
// any replica, on either core.
func (s *FenceService) GetMark(ctx context.Context, req *coordinatorv1.GetMarkRequest) (*coordinatorv1.GetMarkResponse, error) {
	m, err := s.marks.GetMark(ctx, markID(req.GetResource(), req.GetSlot()))
	if err != nil {
		return nil, toStatus(ctx, s.log, "GetMark", err)
	}
	return &coordinatorv1.GetMarkResponse{Mark: markPB(m)}, nil
}

// ListMarks implements coordinatorv1.FenceServiceServer: read from etcd on
// any replica, on either core.
func (s *FenceService) ListMarks(ctx context.Context, req *coordinatorv1.ListMarksRequest) (*coordinatorv1.ListMarksResponse, error) {
	ms, next, err := s.marks.ListMarks(ctx, req.GetPrefix(), int(req.GetPageSize()), req.GetPageToken())
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
// AdminOnly); on the shard core, on the owner of the mark's lock's shard.
func (s *FenceService) DeleteMark(ctx context.Context, req *coordinatorv1.DeleteMarkRequest) (*coordinatorv1.DeleteMarkResponse, error) {
	resp, err := forwardMarks(ctx, s.fwd, req, s.deleteMarkHere, coordinatorv1.FenceServiceClient.DeleteMark)
	if err != nil {
		return nil, toStatus(ctx, s.log, "DeleteMark", err)
	}
	return resp, nil
}

func (s *FenceService) deleteMarkHere(ctx context.Context, req *coordinatorv1.DeleteMarkRequest) (*coordinatorv1.DeleteMarkResponse, error) {
	m, err := s.marks.DeleteMark(ctx, markID(req.GetResource(), req.GetSlot()))
	if err != nil {
		return nil, err
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
// AdminOnly); on the shard core, on the owner of the shard of the mark's
// present lock.
func (s *FenceService) RebindMark(ctx context.Context, req *coordinatorv1.RebindMarkRequest) (*coordinatorv1.RebindMarkResponse, error) {
	resp, err := forwardMarks(ctx, s.fwd, req, s.rebindMarkHere, coordinatorv1.FenceServiceClient.RebindMark)
	if err != nil {
		return nil, toStatus(ctx, s.log, "RebindMark", err)
	}
	return resp, nil
}

func (s *FenceService) rebindMarkHere(ctx context.Context, req *coordinatorv1.RebindMarkRequest) (*coordinatorv1.RebindMarkResponse, error) {
	m, err := s.marks.RebindMark(ctx, markID(req.GetResource(), req.GetSlot()), req.GetLock())
	if err != nil {
		return nil, err
	}
	return &coordinatorv1.RebindMarkResponse{Mark: markPB(m)}, nil
}
