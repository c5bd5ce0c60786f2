package server

import (
	"context"
	"errors"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/epoch"
	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
)

var watchKinds = map[lease.EventKind]coordinatorv1.WatchResponse_Kind{
	lease.EventCurrent:       coordinatorv1.WatchResponse_KIND_CURRENT,
	lease.EventAcquired:      coordinatorv1.WatchResponse_KIND_ACQUIRED,
	lease.EventReleased:      coordinatorv1.WatchResponse_KIND_RELEASED,
	lease.EventExpired:       coordinatorv1.WatchResponse_KIND_EXPIRED,
	lease.EventForceReleased: coordinatorv1.WatchResponse_KIND_FORCE_RELEASED,
}

// Watch implements coordinatorv1.LockServiceServer. Its revisions carry
// the token epoch as tokens do (keyspace.TokenOf): a restore of etcd from a
// backup takes etcd's revisions back, and a stream must never show them
// going back or resume into a history that was replaced. So a
// start_revision of an earlier epoch, and a stream open when the epoch
// changes, end with *epoch.ChangedError (OUT_OF_RANGE: start over).
func (s *LockService) Watch(req *coordinatorv1.WatchRequest, stream coordinatorv1.LockService_WatchServer) error {
	if s.shards != nil {
		return s.watchOnShards(req, stream) // watchshard.go
	}
	ctx := stream.Context()
	e, err := s.epoch(ctx)
	if err != nil {
		return s.fail(ctx, "Watch", err)
	}
	start, err := s.watchStart(e, req.GetStartRevision())
	if err != nil {
		return s.fail(ctx, "Watch", err)
	}
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	changed := s.epochs.Changed(e)
	done := make(chan struct{})
	go func() { // ends the stream when the epoch changes; the handler waits for it
		defer close(done)
		select {
		case <-changed:
			cancel(&epoch.ChangedError{From: e, To: s.epochs.Status().Epoch})
		case <-wctx.Done():
		}
	}()
	err = s.leases.Watch(wctx, req.GetName(), start, func(ev lease.Event) error {
		now, err := s.epochs.Epoch(wctx, ev.Revision)
		switch {
		case err != nil:
			return err
		case now != e:
			return &epoch.ChangedError{From: e, To: now}
		}
		return streamErr(stream.Send(watchEventPB(ev, e)))
	})
	if cause := context.Cause(wctx); errors.Is(cause, epoch.ErrChanged) && ctx.Err() == nil {
		err = cause
	}
	cancel(nil)
	<-done
	return s.fail(ctx, "Watch", err)
}

// watchStart is the etcd revision a start_revision of the wire names in
// epoch e: one of an earlier epoch names a history a restore replaced
// (*epoch.ChangedError), one of a later epoch is from a replica that
// already adopted it (*epoch.PausedError: retry). Zero and negative values
// pass unchanged, for the domain to judge.
func (s *LockService) watchStart(e, start int64) (int64, error) {
	if start <= 0 {
		return start, nil
	}
	se, rev := keyspace.SplitToken(start)
	switch {
	case se < e:
		return 0, &epoch.ChangedError{From: se, To: e}
	case se > e:
		return 0, &epoch.PausedError{Reason: "the start_revision is of a token epoch this replica has not adopted yet"}
	}
	return rev, nil
}

func watchEventPB(ev lease.Event, epoch int64) *coordinatorv1.WatchResponse {
	resp := &coordinatorv1.WatchResponse{Kind: watchKinds[ev.Kind], Revision: wireToken(epoch, ev.Revision)}
	if ev.Holder != nil {
		resp.Holder = &coordinatorv1.Holder{Name: ev.Holder.Name, Token: wireToken(epoch, ev.Holder.Token), Owner: ev.Holder.Owner}
	}
	return resp
}
