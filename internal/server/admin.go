package server

import (
	"context"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// ForceRelease implements coordinatorv1.LockServiceServer (admins only, see
// AdminOnly).
func (s *LockService) ForceRelease(ctx context.Context, req *coordinatorv1.ForceReleaseRequest) (*coordinatorv1.ForceReleaseResponse, error) {
	if s.shards != nil {
		resp, err := s.forceReleaseOnShards(ctx, req)
		if err != nil {
			return nil, s.fail(ctx, "ForceRelease", err)
		}
		return resp, nil
	}
	rev, current, err := s.revisionOf(ctx, req.GetToken())
	if err != nil {
		return nil, s.fail(ctx, "ForceRelease", err)
	}
	if !current {
		return &coordinatorv1.ForceReleaseResponse{Released: false}, nil
	}
	ok, err := s.leases.ForceRelease(ctx, req.GetName(), rev)
	if err == nil {
		err = s.unchanged(ctx, req.GetToken())
	}
	if err != nil {
		return nil, s.fail(ctx, "ForceRelease", err)
	}
	if ok {
		s.log.InfoContext(ctx, "lock force-released", "name", req.GetName(), "token", req.GetToken())
	}
	return &coordinatorv1.ForceReleaseResponse{Released: ok}, nil
}
