package server

import (
	"context"
	"errors"
	"io"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// Forwarding a Hold stream on the shard-owner core. Only the owner of the
// name's shard can serve a Hold (it watches the grant), so a replica that
// does not own it (a relay owns nothing) relays the whole stream: it opens
// a Hold on the owner, with the outgoing metadata of a forwarded call
// (Forwarder.outgoing: the mark, and the caller's identity with the member
// secret), and copies the messages both ways until one side ends.
//
// What it guarantees, and why:
//
//   - The owner's answers reach the client unchanged, its final status
//     too (code, reason, details), as the unary forward's do: the client
//     cannot tell a relayed Hold from one on the owner, but by latency.
//   - Each side ends with the other: the client's half-close half-closes
//     the owner's stream (CloseSend), so the owner ends it as it would
//     the client's own; a client gone cancels the owner's stream (the
//     owner then releases the grant if release_on_disconnect asks); the
//     owner's end ends the client's stream.
//   - The shard may move before the owner answers: while the client has
//     heard nothing, an owner that is unreachable or answers
//     SHARD_NOT_SERVED is re-read and the stream opened again, with the
//     unary forward's retries (forwardRetries, Forwarder.wait), here if
//     the shard came here meanwhile. Once the client has heard from the
//     owner, its grant's state is the owner's, and an owner that goes away
//     ends the stream UNAVAILABLE (SHARD_NOT_SERVED, with RetryInfo): the
//     client resumes with its handle on any replica, as after a crash of
//     the replica it held the stream on. The next owner honours the grant
//     for its full TTL from the takeover.
//   - A relayed stream is never relayed again (forwarded): a member that
//     does not own the shard answers it SHARD_NOT_SERVED.

// holdHereOrThere serves a Hold whose first message is first: here if this
// replica serves the name's shard, else relayed to the member that owns it.
func (s *LockService) holdHereOrThere(ctx context.Context, stream coordinatorv1.LockService_HoldServer, in holdInbox, first *coordinatorv1.HoldRequest) error {
	h, err := s.grantHoldOnShards(ctx, stream, first)
	var ns *shard.NotServingError
	if s.fwd != nil && errors.As(err, &ns) && !forwarded(ctx) {
		return s.holdThere(ctx, stream, in, first, ns, err)
	}
	if err != nil {
		return err
	}
	return h.serve(ctx, in)
}

// holdThere relays the Hold to the owner ns names, re-reading the owner
// and trying again while the client has heard nothing (see above);
// notHere is the refusal answered if no owner takes the stream.
func (s *LockService) holdThere(ctx context.Context, stream coordinatorv1.LockService_HoldServer, in holdInbox, first *coordinatorv1.HoldRequest,
	ns *shard.NotServingError, notHere error,
) error {
	f := s.fwd
	octx, ok := f.outgoing(ctx)
	if !ok {
		return notHere
	}
	for attempt := 0; ; attempt++ {
		if ns.Addr != "" && ns.Addr != f.self {
			r := &holdRelay{client: stream, in: in, shard: ns.Shard}
			again, err := r.run(ctx, octx, f, ns.Addr, first)
			if !again {
				return err
			}
			f.log.DebugContext(ctx, "forward Hold: the owner did not take the stream; re-reading the owner", "shard", ns.Shard, "owner", ns.Owner, "addr", ns.Addr, "err", err)
		}
		if !f.wait(ctx, attempt) {
			return notHere
		}
		h, err := s.grantHoldOnShards(ctx, stream, first)
		if err == nil {
			return h.serve(ctx, in)
		}
		if !errors.As(err, &ns) {
			return err
		}
		notHere = err
	}
}

// holdRelay is one Hold stream relayed to its shard's owner: the client's
// stream on this replica and the one this replica opened on the owner.
type holdRelay struct {
	client coordinatorv1.LockService_HoldServer
	in     holdInbox
	owner  coordinatorv1.LockService_HoldClient
	shard  uint32
}

// run relays the stream to the owner at addr until either side ends, and
// returns how it ended; again is true if the owner did not take it (the
// client has heard nothing, and may be relayed elsewhere).
func (r *holdRelay) run(ctx, octx context.Context, f *Forwarder, addr string, first *coordinatorv1.HoldRequest) (again bool, err error) {
	peer, err := f.client(addr)
	if err != nil {
		return true, err
	}
	octx, cancel := context.WithCancel(octx)
	defer cancel() // ends the owner's stream, whatever ended ours
	answer, err := r.open(octx, peer, first)
	switch {
	case ctx.Err() != nil:
		return false, ctx.Err()
	case err != nil && notServedThere(err):
		return true, err
	case err != nil:
		return false, r.ended(err)
	}
	if err := r.client.Send(answer); err != nil {
		return false, streamErr(err)
	}
	return false, r.relay(ctx, octx, cancel)
}

// open opens the Hold on the owner, sends it the first message and
// receives the owner's answer to it (Granted, or the stream's end).
func (r *holdRelay) open(octx context.Context, peer coordinatorv1.LockServiceClient, first *coordinatorv1.HoldRequest) (*coordinatorv1.HoldResponse, error) {
	var err error
	if r.owner, err = peer.Hold(octx); err != nil {
		return nil, err
	}
	if err := r.owner.Send(first); err != nil && !errors.Is(err, io.EOF) {
		return nil, err // io.EOF: the stream ended, and Recv says how
	}
	return r.owner.Recv()
}

// relay copies the messages both ways once the owner answered: the
// client's to the owner in a goroutine of its own (toOwner), which it
// stops and waits for; the owner's to the client here, until the owner's
// stream ends.
func (r *holdRelay) relay(ctx, octx context.Context, cancel context.CancelFunc) error {
	clientErr := make(chan error, 1)
	go func() {
		err := r.toOwner(octx)
		if err != nil {
			cancel() // the client's stream broke: so does the owner's
		}
		clientErr <- err
	}()
	err := r.toClient()
	cancel()
	if cerr := <-clientErr; cerr != nil {
		return streamErr(cerr)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// toOwner sends the client's messages on to the owner, and half-closes the
// owner's stream when the client half-closes its own. It returns the
// client's stream's failure (nil after a half-close, or once octx ends or
// the owner's stream did: toClient reports that).
func (r *holdRelay) toOwner(octx context.Context) error {
	for {
		select {
		case m := <-r.in.msgs:
			if err := r.owner.Send(m); err != nil {
				return nil
			}
		case err := <-r.in.errs:
			if errors.Is(err, io.EOF) {
				_ = r.owner.CloseSend() // never fails on a client stream
				return nil
			}
			return err
		case <-octx.Done():
			return nil
		}
	}
}

// toClient sends the owner's messages on to the client until the owner's
// stream ends, and returns how it ended (ended).
func (r *holdRelay) toClient() error {
	for {
		m, err := r.owner.Recv()
		if err != nil {
			return r.ended(err)
		}
		if err := r.client.Send(m); err != nil {
			return streamErr(err)
		}
	}
}

// ended is how the client's stream ends once the owner's ended with err
// (from Recv): cleanly after a clean end; UNAVAILABLE SHARD_NOT_SERVED,
// with a retry hint, if the transport failed (the owner went away: the
// client resumes with its handle on any replica); else with the owner's
// status, unchanged.
func (r *holdRelay) ended(err error) error {
	switch {
	case errors.Is(err, io.EOF):
		return nil
	case unreachable(err):
		return &shard.NotServingError{Shard: r.shard, Reason: "the Hold was relayed to the shard's owner, which went away (" + err.Error() +
			"); resume the grant with its handle on any replica"}
	}
	return &forwardedError{st: err}
}
