package server

import (
	"context"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// validateWithResourceOnShards is ValidateToken with a resource on a shard
// this replica serves (the call was routed to the owner of the lock's
// shard by name, as every shard call): the table's verdict and the
// resource's mark, on the owner (shard.Owner.ValidateResource), with the
// queue core's contract: REASON_FENCED below the mark,
// MARK_OWNED_BY_OTHER_LOCK, SHARED_HOLDER_CANNOT_FENCE, TOO_MANY_MARKS
// (counted per authenticated identity, "" without authentication).
func (s *LockService) validateWithResourceOnShards(ctx context.Context, req *coordinatorv1.ValidateTokenRequest) (*coordinatorv1.ValidateTokenResponse, error) {
	if err := lease.ValidateName("name", req.GetName(), false); err != nil {
		return nil, err
	}
	if req.GetToken() <= 0 {
		return nil, &lease.FieldError{Field: "token", Reason: "must be a positive fencing token from Acquire"}
	}
	if err := lease.ValidateName("resource", req.GetResource(), false); err != nil {
		return nil, err
	}
	e, err := s.epoch(ctx) // nothing is validated while the epoch is paused
	if err != nil {
		return nil, err
	}
	v, err := s.shards.ValidateResource(ctx, shard.MarkCheck{Name: req.GetName(), Token: req.GetToken(), Epoch: e,
		Resource: req.GetResource(), Identity: callerOf(ctx)})
	if err != nil {
		return nil, err
	}
	return &coordinatorv1.ValidateTokenResponse{Valid: v.Valid, Reason: reasons[v.Reason], CurrentToken: wireToken(e, v.CurrentToken)}, nil
}
