package server

import (
	"context"

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

// ValidateToken implements coordinatorv1.LockServiceServer.
func (s *LockService) ValidateToken(ctx context.Context, req *coordinatorv1.ValidateTokenRequest) (*coordinatorv1.ValidateTokenResponse, error) {
	var opts []fence.ValidateOption
	if id, ok := authz.FromContext(ctx); ok {
		opts = append(opts, fence.AsIdentity(id)) // the cap on marks counts per identity
	}
	v, err := s.fence.Validate(ctx, req.GetName(), req.GetToken(), req.GetResource(), opts...)
	if err != nil {
		return nil, s.fail(ctx, "ValidateToken", err)
	}
	return &coordinatorv1.ValidateTokenResponse{Valid: v.Valid, Reason: reasons[v.Reason], CurrentToken: v.CurrentToken}, nil
}
