package server

import (
	"context"
	"errors"
	"io"
	"time"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// Hold and ForceRelease on the shard-owner core (-core shard), with the
// queue core's contract (hold.go, admin.go): the same messages, events,
// codes and epoch rules. The grant is made, renewed and released by the
// shard core's unary handlers (shardcore.go), and its end while the stream
// is open comes from the owner's grant watch (shard.Owner.WatchGrant).
//
// A Hold is served by the owner of the name's shard: it acquires, resumes
// and renews there only (acquireHere, keepAliveHere), since only there can
// it watch the grant. Another replica (a relay too) relays the whole
// stream to the owner (forwardhold.go). Its releases go through
// releaseOnShards, which reaches the owner wherever the shard is by then.

// forceReleaseOnShards is ForceRelease on the shard-owner core: here if
// this replica serves the name's shard, else on its owner (forward.go),
// where the caller's identity is authorized again (admins only).
func (s *LockService) forceReleaseOnShards(ctx context.Context, req *coordinatorv1.ForceReleaseRequest) (*coordinatorv1.ForceReleaseResponse, error) {
	return forward(ctx, s.fwd, req, s.forceReleaseHere, coordinatorv1.LockServiceClient.ForceRelease)
}

// forceReleaseHere is ForceRelease on a shard this replica serves, as the
// queue core's: a token of another epoch holds nothing (released=false).
func (s *LockService) forceReleaseHere(ctx context.Context, req *coordinatorv1.ForceReleaseRequest) (*coordinatorv1.ForceReleaseResponse, error) {
	rev, current, err := s.revisionOf(ctx, req.GetToken())
	if err != nil {
		return nil, err
	}
	if !current { // a token of another epoch holds nothing now
		return &coordinatorv1.ForceReleaseResponse{Released: false}, nil
	}
	if err := lease.ValidateName("name", req.GetName(), false); err != nil {
		return nil, err
	}
	if err := lease.ValidateToken(rev); err != nil {
		return nil, err
	}
	ok, err := s.shards.ForceRelease(ctx, req.GetName(), rev)
	if err == nil {
		err = s.unchanged(ctx, req.GetToken())
	}
	if err != nil {
		return nil, err
	}
	if ok {
		s.log.InfoContext(ctx, "lock force-released", "name", req.GetName(), "token", req.GetToken())
	}
	return &coordinatorv1.ForceReleaseResponse{Released: ok}, nil
}

// holdOnShards is Hold on the shard-owner core: its first message names
// the lock, whose shard's owner serves the stream (holdHereOrThere).
func (s *LockService) holdOnShards(stream coordinatorv1.LockService_HoldServer) error {
	ctx := stream.Context()
	in := receive(ctx, stream)
	first, err := firstHold(ctx, in)
	if err == nil {
		err = s.holdHereOrThere(ctx, stream, in, first)
	}
	return s.fail(ctx, "Hold", err)
}

// firstHold is the stream's first message, which acquires or resumes.
func firstHold(ctx context.Context, in holdInbox) (*coordinatorv1.HoldRequest, error) {
	select {
	case first := <-in.msgs:
		return first, nil
	case err := <-in.errs:
		return nil, streamErr(err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// shardHold is a Hold stream's grant on the shard-owner core.
type shardHold struct {
	s       *LockService
	stream  coordinatorv1.LockService_HoldServer
	ctx     context.Context // the stream's: its caller's identity for every call
	name    string
	token   int64 // the wire token
	epoch   int64 // the token epoch it was granted in
	rev     int64 // the create revision: the shard core's token
	handle  string
	ttl     time.Duration
	release bool // release_on_disconnect

	// watch is told when the grant ends; nil while the shard's table is
	// away (dropped: the grant may live on in the next table), from
	// awaySince, and then watched again every retry (see rewatch).
	watch     *shard.GrantWatch
	awaySince time.Time
	retry     time.Duration
	timer     *time.Timer
}

// rewatchFirst and rewatchMax pace the attempts to watch the grant again
// once its shard's table was dropped.
const (
	rewatchFirst = 50 * time.Millisecond
	rewatchMax   = time.Second
)

// grantHoldOnShards obtains the grant the first message asks for (acquire
// or resume) on a shard this replica serves, watches its end and sends it
// to the client as Granted. Elsewhere it fails with the
// *shard.NotServingError that names the owner, and the client has heard
// nothing.
func (s *LockService) grantHoldOnShards(ctx context.Context, stream coordinatorv1.LockService_HoldServer, first *coordinatorv1.HoldRequest) (*shardHold, error) {
	h := &shardHold{s: s, stream: stream, ctx: ctx}
	g, err := h.obtain(ctx, first)
	if err != nil {
		return nil, err
	}
	// Watched before the client hears of it: an end from now on is
	// reported (and one just before, if the owner still remembers it).
	h.watchAgain()
	if err := stream.Send(&coordinatorv1.HoldResponse{Event: &coordinatorv1.HoldResponse_Granted{Granted: g}}); err != nil {
		h.disconnected()
		h.stop()
		return nil, streamErr(err)
	}
	return h, nil
}

// obtain acquires or resumes the grant the first message names.
func (h *shardHold) obtain(ctx context.Context, first *coordinatorv1.HoldRequest) (*coordinatorv1.AcquireResponse, error) {
	var g *coordinatorv1.AcquireResponse
	switch k := first.GetKind().(type) {
	case *coordinatorv1.HoldRequest_Acquire:
		req := k.Acquire.GetRequest()
		if req == nil {
			return nil, &lease.FieldError{Field: "acquire.request", Reason: "must be set"}
		}
		var err error
		if g, err = h.s.acquireHere(ctx, req); err != nil {
			return nil, err
		}
		h.name, h.release = req.GetName(), k.Acquire.GetReleaseOnDisconnect()
	case *coordinatorv1.HoldRequest_Resume:
		r := k.Resume
		var err error
		if g, err = h.s.resumeOnShards(ctx, r); err != nil {
			return nil, err
		}
		h.name, h.release = r.GetName(), r.GetReleaseOnDisconnect()
	default:
		return nil, &lease.FieldError{Field: "kind", Reason: "the first message must be acquire or resume"}
	}
	h.token, h.handle, h.ttl = g.GetToken(), g.GetHandle(), g.GetTtl().AsDuration()
	h.epoch, h.rev = keyspace.SplitToken(h.token)
	return g, nil
}

// resumeOnShards takes over a grant with its handle: a renewal (which
// checks the name, token, handle and caller), then the grant's holder
// record for what Granted shows.
func (s *LockService) resumeOnShards(ctx context.Context, r *coordinatorv1.HoldResume) (*coordinatorv1.AcquireResponse, error) {
	if err := lease.ValidateName("name", r.GetName(), false); err != nil {
		return nil, err
	}
	if err := lease.ValidateToken(r.GetToken()); err != nil {
		return nil, err
	}
	ka, err := s.keepAliveHere(ctx, &coordinatorv1.KeepAliveRequest{Name: r.GetName(), Token: r.GetToken(), Handle: r.GetHandle()})
	if err == nil {
		err = s.unchanged(ctx, r.GetToken())
	}
	if err != nil {
		return nil, err
	}
	_, rev := keyspace.SplitToken(r.GetToken())
	hs, _, err := s.shards.Describe(r.GetName())
	if err != nil {
		return nil, err
	}
	for _, hd := range hs {
		if hd.Token == rev {
			return &coordinatorv1.AcquireResponse{Token: r.GetToken(), Handle: r.GetHandle(), Ttl: ka.GetTtl(),
				ExpiresAt: ka.GetExpiresAt(), SafeUntil: ka.GetSafeUntil(), AcquiredAt: timestamp(hd.AcquiredAt),
				Resumed: true, Slot: hd.Slot, Mode: modePB(hd.Shared)}, nil
		}
	}
	return nil, lease.ErrNotHeld // ended since the renewal
}

// serve keeps the grant: it answers the client's heartbeats and release,
// and reports the grant's end (expiry, force-release, a release elsewhere)
// as Lost. It returns when the stream is over; nil after a clean close or
// a final event sent.
func (h *shardHold) serve(ctx context.Context, in holdInbox) error {
	defer h.stop()
	for {
		select {
		case err := <-in.errs:
			h.disconnected()
			if errors.Is(err, io.EOF) {
				return nil
			}
			return streamErr(err)
		case <-ctx.Done():
			h.disconnected()
			return ctx.Err()
		case <-h.watchDone():
			if r := h.watch.Reason(); r != shard.GrantDropped {
				return h.lost(lostReasonOnShards(r))
			}
			h.away()
		case <-h.retryC():
			if err := h.rewatch(); err != nil {
				return err
			}
		case m := <-in.msgs:
			switch m.GetKind().(type) {
			case *coordinatorv1.HoldRequest_Heartbeat:
				if done, err := h.heartbeat(ctx); done {
					return err
				}
			case *coordinatorv1.HoldRequest_Release:
				h.stop() // our own release is not a loss
				return h.releaseNow(ctx)
			default:
				return &lease.FieldError{Field: "kind", Reason: "acquire and resume are only allowed as the first message"}
			}
		}
	}
}

// heartbeat renews the grant and answers Renewed. A grant past its max
// hold or gone ends the stream with Lost (done); gone, it first gives the
// watch a second to say how it ended.
func (h *shardHold) heartbeat(ctx context.Context) (done bool, err error) {
	if e, err := h.s.epoch(ctx); err != nil {
		return true, err
	} else if e != h.epoch {
		return true, h.lost(coordinatorv1.HoldLost_REASON_EXPIRED, "etcd was restored from a backup and the token epoch raised: the grant ended; acquire again")
	}
	r, err := h.s.keepAliveHere(ctx, &coordinatorv1.KeepAliveRequest{Name: h.name, Token: h.token, Handle: h.handle})
	switch {
	case errors.Is(err, lease.ErrMaxHold):
		return true, h.lost(coordinatorv1.HoldLost_REASON_MAX_HOLD, err.Error())
	case errors.Is(err, lease.ErrNotHeld):
		if w := h.watch; w != nil { // say how it ended if the watch learns it
			select {
			case <-w.Done():
				if r := w.Reason(); r != shard.GrantDropped {
					return true, h.lost(lostReasonOnShards(r))
				}
			case <-time.After(time.Second):
			case <-ctx.Done():
				return true, ctx.Err()
			}
		}
		return true, h.lost(coordinatorv1.HoldLost_REASON_EXPIRED, err.Error())
	case err != nil:
		return true, err
	}
	if err := h.s.unchanged(ctx, h.token); err != nil { // renewed across a restore: not the grant held
		return true, err
	}
	if h.watch == nil { // renewed: the shard serves again, so it can be watched
		if err := h.rewatch(); err != nil {
			return true, err
		}
	}
	if err := h.stream.Send(&coordinatorv1.HoldResponse{Event: &coordinatorv1.HoldResponse_Renewed{Renewed: r}}); err != nil {
		return true, streamErr(err)
	}
	return false, nil
}

// releaseNow releases the grant as the client asked and answers Released.
func (h *shardHold) releaseNow(ctx context.Context) error {
	e, err := h.s.epoch(ctx)
	if err != nil {
		return err
	}
	ok := false
	if e == h.epoch {
		r, err := h.s.releaseOnShards(ctx, &coordinatorv1.ReleaseRequest{Name: h.name, Token: h.token, Handle: h.handle})
		if err != nil {
			return err
		}
		if err := h.s.unchanged(ctx, h.token); err != nil {
			return err
		}
		ok = r.GetReleased()
	}
	return streamErr(h.stream.Send(&coordinatorv1.HoldResponse{Event: &coordinatorv1.HoldResponse_Released{Released: &coordinatorv1.ReleaseResponse{Released: ok}}}))
}

// disconnected releases the grant of a broken stream if the client asked,
// as the stream's caller (its identity stays in the context; its
// cancellation does not).
func (h *shardHold) disconnected() {
	if !h.release {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(h.ctx), releaseTimeout)
	defer cancel()
	if _, err := h.s.releaseOnShards(ctx, &coordinatorv1.ReleaseRequest{Name: h.name, Token: h.token, Handle: h.handle}); err != nil {
		h.s.log.Warn("release_on_disconnect failed; the lease ends with its TTL", "name", h.name, "token", h.token, "err", err)
	}
}

// lost tells the client that the grant ended (the stream's last event).
func (h *shardHold) lost(reason coordinatorv1.HoldLost_Reason, msg string) error {
	return streamErr(h.stream.Send(&coordinatorv1.HoldResponse{Event: &coordinatorv1.HoldResponse_Lost{Lost: &coordinatorv1.HoldLost{Reason: reason, Token: h.token, Message: msg}}}))
}

// lostReasonOnShards is how a Hold reports an end its watch saw, as the
// queue core does (lostReason).
func lostReasonOnShards(r shard.GrantEnd) (coordinatorv1.HoldLost_Reason, string) {
	switch r {
	case shard.GrantForced:
		return lostReason(lease.EndForced)
	case shard.GrantReleased:
		return lostReason(lease.EndReleased)
	case shard.GrantGone:
		return coordinatorv1.HoldLost_REASON_EXPIRED, "the grant is no longer held (it ended before the stream watched it, or while its shard's state was reloaded); stop working under the lock"
	}
	return lostReason(lease.EndExpired)
}

// The grant's watch, and its renewal after a drop of the shard's table.

// watchAgain watches the grant, or starts the retries if its shard has
// no table here now.
func (h *shardHold) watchAgain() {
	w, err := h.s.shards.WatchGrant(h.name, h.rev)
	if err != nil {
		h.away()
		return
	}
	h.watch = w
}

// away notes that the shard's table is gone and schedules a new watch.
func (h *shardHold) away() {
	if h.watch != nil {
		h.watch.Stop()
		h.watch = nil
	}
	if h.awaySince.IsZero() {
		h.awaySince, h.retry = time.Now(), rewatchFirst
	}
	h.schedule()
}

// rewatch tries to watch the grant again. The next table honours a grant
// it loads for a full TTL from its load, so a shard that does not serve
// here again within a TTL has moved (or the replica is stopping): the
// stream ends UNAVAILABLE, and the client resumes on any replica.
func (h *shardHold) rewatch() error {
	w, err := h.s.shards.WatchGrant(h.name, h.rev)
	if err == nil {
		h.watch, h.awaySince = w, time.Time{}
		return nil
	}
	if time.Since(h.awaySince) > h.ttl {
		return err
	}
	h.retry = min(2*h.retry, rewatchMax)
	h.schedule()
	return nil
}

func (h *shardHold) schedule() {
	if h.timer == nil {
		h.timer = time.NewTimer(h.retry)
		return
	}
	h.timer.Reset(h.retry)
}

// watchDone is the watch's Done, nil (never ready) without a watch.
func (h *shardHold) watchDone() <-chan struct{} {
	if h.watch == nil {
		return nil
	}
	return h.watch.Done()
}

// retryC fires when a new watch is due, nil (never) while watching.
func (h *shardHold) retryC() <-chan time.Time {
	if h.watch != nil || h.timer == nil {
		return nil
	}
	return h.timer.C
}

// stop ends the watch and its retries.
func (h *shardHold) stop() {
	if h.watch != nil {
		h.watch.Stop()
	}
	if h.timer != nil {
		h.timer.Stop()
	}
}
