package server

import (
	"context"
	"errors"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/epoch"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// Watch on the shard-owner core. The grants of the shard core are etcd
// keys created at their token and deleted at their end (internal/shard,
// watch.go), so a Watch follows etcd's history of them on the replica it
// reached, whichever member owns the name's shard, relays too: nothing is
// forwarded. Its contract is the queue core's (watch.go): a CURRENT event
// per holder (or one for a free lock) at start_revision 0, every change
// after it in revision order (a hand-off's end before its grant),
// start_revision to resume, OUT_OF_RANGE REVISION_COMPACTED for a
// compacted one, revisions and tokens in the token epoch and OUT_OF_RANGE
// EPOCH_CHANGED when it changes. Authorization of the name and the
// per-caller stream cap are the interceptors', as for the queue core.
//
// How a grant ended is read from its lock's end marker at the revision of
// its delete (internal/shard/watch.go, locktable/ended.go): RELEASED,
// EXPIRED or FORCE_RELEASED, as on the queue core. Only if etcd compacted
// that revision away before the marker was read is the end sent as
// KIND_UNSPECIFIED (the proto's "not known"), with the holder that ended.

var shardWatchKinds = map[shard.WatchKind]coordinatorv1.WatchResponse_Kind{
	shard.WatchCurrent: coordinatorv1.WatchResponse_KIND_CURRENT,
	shard.WatchGranted: coordinatorv1.WatchResponse_KIND_ACQUIRED,
}

// shardEndKinds are the kinds of a grant's end by how it ended (any other,
// shard.GrantEndUnknown: KIND_UNSPECIFIED).
var shardEndKinds = map[shard.GrantEnd]coordinatorv1.WatchResponse_Kind{
	shard.GrantReleased: coordinatorv1.WatchResponse_KIND_RELEASED,
	shard.GrantExpired:  coordinatorv1.WatchResponse_KIND_EXPIRED,
	shard.GrantForced:   coordinatorv1.WatchResponse_KIND_FORCE_RELEASED,
}

// watchOnShards is Watch on the shard-owner core: Watch's epoch handling
// around shard.Owner.Watch.
func (s *LockService) watchOnShards(req *coordinatorv1.WatchRequest, stream coordinatorv1.LockService_WatchServer) error {
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
	err = s.shards.Watch(wctx, shard.WatchFilter{Name: req.GetName()}, start, func(ev shard.WatchEvent) error {
		now, err := s.epochs.Epoch(wctx, ev.Revision)
		switch {
		case err != nil:
			return err
		case now != e:
			return &epoch.ChangedError{From: e, To: now}
		}
		return streamErr(stream.Send(shardWatchEventPB(ev, e)))
	})
	if cause := context.Cause(wctx); errors.Is(cause, epoch.ErrChanged) && ctx.Err() == nil {
		err = cause
	}
	cancel(nil)
	<-done
	return s.fail(ctx, "Watch", err)
}

// shardWatchEventPB is an event of the shard core on the wire, its
// revision and token in epoch. The holder shows what Describe shows but
// acquired_at and expires_at (the proto leaves them unset in Watch).
func shardWatchEventPB(ev shard.WatchEvent, epoch int64) *coordinatorv1.WatchResponse {
	kind := shardWatchKinds[ev.Kind]
	if ev.Kind == shard.WatchEnded {
		kind = shardEndKinds[ev.End]
	}
	resp := &coordinatorv1.WatchResponse{Kind: kind, Revision: wireToken(epoch, ev.Revision)}
	if h := ev.Holder; h != nil {
		resp.Holder = &coordinatorv1.Holder{Name: h.Name, Token: wireToken(epoch, h.Token), Owner: h.Owner,
			Mode: modePB(h.Shared), Slot: h.Slot, Limit: max(h.Limit, 1)}
	}
	return resp
}
