package server

import (
	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/lease"
)

var watchKinds = map[lease.EventKind]coordinatorv1.WatchResponse_Kind{
	lease.EventCurrent:       coordinatorv1.WatchResponse_KIND_CURRENT,
	lease.EventAcquired:      coordinatorv1.WatchResponse_KIND_ACQUIRED,
	lease.EventReleased:      coordinatorv1.WatchResponse_KIND_RELEASED,
	lease.EventExpired:       coordinatorv1.WatchResponse_KIND_EXPIRED,
	lease.EventForceReleased: coordinatorv1.WatchResponse_KIND_FORCE_RELEASED,
}

// Watch implements coordinatorv1.LockServiceServer.
func (s *LockService) Watch(req *coordinatorv1.WatchRequest, stream coordinatorv1.LockService_WatchServer) error {
	ctx := stream.Context()
	err := s.leases.Watch(ctx, req.GetName(), req.GetStartRevision(), func(ev lease.Event) error {
		e, err := s.epoch(ctx)
		if err != nil {
			return err
		}
		return streamErr(stream.Send(watchEventPB(ev, e)))
	})
	return s.fail(ctx, "Watch", err)
}

func watchEventPB(ev lease.Event, epoch int64) *coordinatorv1.WatchResponse {
	resp := &coordinatorv1.WatchResponse{Kind: watchKinds[ev.Kind], Revision: ev.Revision}
	if ev.Holder != nil {
		resp.Holder = &coordinatorv1.Holder{Name: ev.Holder.Name, Token: wireToken(epoch, ev.Holder.Token), Owner: ev.Holder.Owner}
	}
	return resp
}
