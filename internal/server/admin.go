package server

import (
	"context"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// ForceRelease implements coordinatorv1.LockServiceServer (admins only, see
// AdminOnly).
func (s *LockService) ForceRelease(ctx context.Context, req *coordinatorv1.ForceReleaseRequest) (*coordinatorv1.ForceReleaseResponse, error) {
	ok, err := s.leases.ForceRelease(ctx, req.GetName(), req.GetToken())
	if err != nil {
		return nil, s.fail(ctx, "ForceRelease", err)
	}
	if ok {
		s.log.InfoContext(ctx, "lock force-released", "name", req.GetName(), "token", req.GetToken())
	}
	return &coordinatorv1.ForceReleaseResponse{Released: ok}, nil
}
