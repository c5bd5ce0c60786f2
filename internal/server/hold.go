package server

import (
	"context"
	"errors"
	"io"
	"time"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// releaseTimeout bounds a release_on_disconnect after the stream is gone.
const releaseTimeout = 5 * time.Second

// Hold implements coordinatorv1.LockServiceServer: the first message
// acquires or resumes a grant, which the stream then keeps (heartbeats
// renew it) until it is released, lost or the stream ends.
func (s *LockService) Hold(stream coordinatorv1.LockService_HoldServer) error {
	if s.shards != nil {
		return s.holdOnShards(stream)
	}
	ctx := stream.Context()
	in := receive(ctx, stream)
	h, err := s.grantHold(ctx, stream, in)
	if err == nil {
		err = h.serve(ctx, in)
	}
	return s.fail(ctx, "Hold", err)
}

// holdInbox is what the client of a Hold stream sends: its messages, then
// the error that ended its side (io.EOF for a clean close).
type holdInbox struct {
	msgs <-chan *coordinatorv1.HoldRequest
	errs <-chan error
}

// receive runs the stream's receive loop in its own goroutine (gRPC offers
// no other way to wait for a message and an event at once); it ends when the
// stream does, which returning from Hold guarantees. Every wait on the inbox
// also ends with ctx: an interceptor may end the stream (a revoked identity)
// while the client sends nothing.
func receive(ctx context.Context, stream coordinatorv1.LockService_HoldServer) holdInbox {
	msgs := make(chan *coordinatorv1.HoldRequest)
	errs := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				errs <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	return holdInbox{msgs: msgs, errs: errs}
}

// hold is a Hold stream's grant, once its first message obtained it.
type hold struct {
	s       *LockService
	stream  coordinatorv1.LockService_HoldServer
	g       *lease.Grant
	token   int64              // g's wire token
	epoch   int64              // the token epoch g was granted in
	release bool               // release_on_disconnect
	as      []lease.CallOption // the stream's caller
}

// grantHold obtains the grant the first message asks for (acquire or
// resume) and sends it to the client as Granted.
func (s *LockService) grantHold(ctx context.Context, stream coordinatorv1.LockService_HoldServer, in holdInbox) (*hold, error) {
	var first *coordinatorv1.HoldRequest
	select {
	case first = <-in.msgs:
	case err := <-in.errs:
		return nil, streamErr(err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	h := &hold{s: s, stream: stream, as: callOptions(ctx)}
	if err := h.obtain(ctx, first); err != nil {
		return nil, err
	}
	if err := stream.Send(&coordinatorv1.HoldResponse{Event: &coordinatorv1.HoldResponse_Granted{Granted: grantPB(h.g, h.token)}}); err != nil {
		h.disconnected()
		return nil, streamErr(err)
	}
	return h, nil
}

// obtain acquires or resumes the grant the first message names.
func (h *hold) obtain(ctx context.Context, first *coordinatorv1.HoldRequest) error {
	var err error
	switch k := first.GetKind().(type) {
	case *coordinatorv1.HoldRequest_Acquire:
		req := k.Acquire.GetRequest()
		if req == nil {
			return &lease.FieldError{Field: "acquire.request", Reason: "must be set"}
		}
		h.g, h.token, err = h.s.acquire(ctx, req)
		h.release = k.Acquire.GetReleaseOnDisconnect()
	case *coordinatorv1.HoldRequest_Resume:
		r := k.Resume
		rev, current, err := h.s.revisionOf(ctx, r.GetToken())
		if err == nil && !current {
			err = lease.ErrNotHeld
		}
		if err != nil {
			return err
		}
		h.g, err = h.s.leases.Resume(ctx, r.GetName(), rev, r.GetHandle(), h.as...)
		if err == nil {
			err = h.s.unchanged(ctx, r.GetToken())
		}
		h.token, h.release = r.GetToken(), r.GetReleaseOnDisconnect()
		if err != nil {
			return err
		}
	default:
		return &lease.FieldError{Field: "kind", Reason: "the first message must be acquire or resume"}
	}
	h.epoch, _ = keyspace.SplitToken(h.token)
	return err
}

// serve keeps the grant: it answers the client's heartbeats and release,
// and reports the grant's end (expiry, force-release, a release elsewhere)
// as Lost. It returns when the stream is over; nil after a clean close or
// a final event sent.
func (h *hold) serve(ctx context.Context, in holdInbox) error {
	// The end watcher is owned here: cancelled and waited for on return.
	wctx, stopWatch := context.WithCancel(ctx)
	ended := make(chan lease.EndReason, 1)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		if r, err := h.s.leases.AwaitEnd(wctx, h.g.Name, h.g.Token, h.g.Handle); err == nil {
			ended <- r
		}
	}()
	defer func() { stopWatch(); <-watchDone }()

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
		case r := <-ended:
			return h.lost(lostReason(r))
		case m := <-in.msgs:
			switch m.GetKind().(type) {
			case *coordinatorv1.HoldRequest_Heartbeat:
				if done, err := h.heartbeat(ctx, ended); done {
					return err
				}
			case *coordinatorv1.HoldRequest_Release:
				stopWatch() // our own release is not a loss
				return h.releaseNow(ctx)
			default:
				return &lease.FieldError{Field: "kind", Reason: "acquire and resume are only allowed as the first message"}
			}
		}
	}
}

// heartbeat renews the grant and answers Renewed. A grant past its max hold
// or gone ends the stream with Lost (done); gone, it first gives the end
// watcher a second to say how it ended (put back on ended for the caller's
// loop to report).
func (h *hold) heartbeat(ctx context.Context, ended chan lease.EndReason) (done bool, err error) {
	if e, err := h.s.epoch(ctx); err != nil {
		return true, err
	} else if e != h.epoch {
		return true, h.lost(coordinatorv1.HoldLost_REASON_EXPIRED, "etcd was restored from a backup and the token epoch raised: the grant ended; acquire again")
	}
	r, err := h.s.leases.KeepAlive(ctx, h.g.Name, h.g.Token, h.g.Handle, h.as...)
	switch {
	case errors.Is(err, lease.ErrMaxHold):
		return true, h.lost(coordinatorv1.HoldLost_REASON_MAX_HOLD, err.Error())
	case errors.Is(err, lease.ErrNotHeld):
		select { // say how it ended if the watcher knows already
		case r := <-ended:
			ended <- r
			return false, nil
		case <-time.After(time.Second):
		}
		return true, h.lost(coordinatorv1.HoldLost_REASON_EXPIRED, err.Error())
	case err != nil:
		return true, err
	}
	if err := h.s.unchanged(ctx, h.token); err != nil { // renewed across a restore: not the grant held
		return true, err
	}
	if err := h.stream.Send(&coordinatorv1.HoldResponse{Event: &coordinatorv1.HoldResponse_Renewed{Renewed: renewalPB(r)}}); err != nil {
		return true, streamErr(err)
	}
	return false, nil
}

// releaseNow releases the grant as the client asked and answers Released.
func (h *hold) releaseNow(ctx context.Context) error {
	e, err := h.s.epoch(ctx)
	if err != nil {
		return err
	}
	ok := false
	if e == h.epoch {
		if ok, err = h.s.leases.Release(ctx, h.g.Name, h.g.Token, h.g.Handle, h.as...); err != nil {
			return err
		}
		if err := h.s.unchanged(ctx, h.token); err != nil {
			return err
		}
	}
	return streamErr(h.stream.Send(&coordinatorv1.HoldResponse{Event: &coordinatorv1.HoldResponse_Released{Released: &coordinatorv1.ReleaseResponse{Released: ok}}}))
}

// lostReason is how a Hold reports an end the watcher saw.
func lostReason(r lease.EndReason) (coordinatorv1.HoldLost_Reason, string) {
	switch r {
	case lease.EndForced:
		return coordinatorv1.HoldLost_REASON_FORCE_RELEASED, "an operator force-released the lock; stop working under it"
	case lease.EndReleased:
		return coordinatorv1.HoldLost_REASON_RELEASED_ELSEWHERE, "released with the handle through another connection"
	}
	return coordinatorv1.HoldLost_REASON_EXPIRED, "the lease expired: no heartbeat in time; stop working under the lock"
}

// lost tells the client that the grant ended (the stream's last event).
func (h *hold) lost(reason coordinatorv1.HoldLost_Reason, msg string) error {
	return streamErr(h.stream.Send(&coordinatorv1.HoldResponse{Event: &coordinatorv1.HoldResponse_Lost{Lost: &coordinatorv1.HoldLost{Reason: reason, Token: h.token, Message: msg}}}))
}

// disconnected releases the grant of a broken stream if the client asked,
// as the stream's caller.
func (h *hold) disconnected() {
	if !h.release {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if _, err := h.s.leases.Release(ctx, h.g.Name, h.g.Token, h.g.Handle, h.as...); err != nil {
		h.s.log.Warn("release_on_disconnect failed; the lease ends with its TTL", "name", h.g.Name, "token", h.g.Token, "err", err)
	}
}
