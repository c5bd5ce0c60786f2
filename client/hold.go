package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// WithReleaseOnDisconnect (Hold only) asks the coordinator to release the
// lock when the Hold stream breaks (the process died, the connection
// dropped) instead of leaving it to expire by its TTL. A network blip then
// loses the lock: use it only where that is acceptable. Acquire ignores it.
func WithReleaseOnDisconnect() AcquireOption {
	return func(o *acquireOptions) { o.releaseOnDisconnect = true }
}

// Hold acquires the lock name as Acquire does (the same options, the same
// retries of UNAVAILABLE with one request id, a *HeldError when not granted
// within the wait) over a Hold stream, which then carries the heartbeats.
// The coordinator pushes the grant's end on the stream, so the Lock notices
// a force-release, a release through another connection or a renewal
// refused at max hold at once (Done closes, Err is ErrLost), not at its
// next heartbeat. A broken stream is resumed on a new one (any replica)
// until safe_until; the Lock's other promises are Acquire's.
func (c *Client) Hold(ctx context.Context, name string, opts ...AcquireOption) (*Lock, error) {
	if c.isClosed() {
		return nil, ErrClosed
	}
	o := resolveAcquire(opts)
	l := newLock(c)
	h := &holdConn{c: c, lose: l.lose, releaseOnDisconnect: o.releaseOnDisconnect}
	first := &coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Acquire{Acquire: &coordinatorv1.HoldAcquire{
		Request: o.request(name), ReleaseOnDisconnect: o.releaseOnDisconnect,
	}}}
	var (
		resp     *coordinatorv1.AcquireResponse
		sent     time.Time
		attempts int
	)
	err := c.retry(ctx, func(ctx context.Context) error {
		if attempts == 0 {
			sent = time.Now()
		}
		attempts++
		var err error
		resp, err = h.open(ctx, first)
		return err
	})
	if err != nil {
		if ReasonOf(err) == ReasonLockHeld {
			return nil, &HeldError{Name: name, HolderToken: holderToken(err), err: err}
		}
		return nil, err
	}
	l.hold = h
	return c.start(ctx, l, grantOf(name, resp), sent)
}

// holdConn is the Hold stream of a Lock, reopened (resume) when it breaks.
// Its sends are made by one goroutine at a time: Hold's, then the Lock's
// heartbeat, then Lock.end once the heartbeat has stopped. Each stream has
// a receiver goroutine, owned here: closeStream ends and waits for it.
type holdConn struct {
	c                   *Client
	lose                func(error) // the Lock's: a pushed loss ends it at once
	releaseOnDisconnect bool

	stream   holdStream         // nil when broken or closed
	cancel   context.CancelFunc // ends stream
	events   chan holdEvent     // what the receiver read, in order
	received chan struct{}      // closed when the receiver has returned
}

type holdStream = grpc.BidiStreamingClient[coordinatorv1.HoldRequest, coordinatorv1.HoldResponse]

// holdEvent is one message of the stream, or the error that ended it.
type holdEvent struct {
	resp *coordinatorv1.HoldResponse
	err  error
}

// open starts a stream with first (acquire or resume) and waits, within
// ctx, for the grant; then the receiver runs until the stream ends.
func (h *holdConn) open(ctx context.Context, first *coordinatorv1.HoldRequest) (*coordinatorv1.AcquireResponse, error) {
	sctx, cancel := context.WithCancel(h.c.root)
	stop := context.AfterFunc(ctx, cancel) // ctx bounds the wait for the grant only
	stream, resp, err := h.grant(sctx, first)
	if !stop() { // ctx ended: whatever was granted lives on the stream cancelled
		err = status.FromContextError(ctx.Err()).Err()
	}
	if err != nil {
		cancel()
		return nil, err
	}
	h.stream, h.cancel = stream, cancel
	h.events, h.received = make(chan holdEvent, 4), make(chan struct{})
	go h.receive(sctx, stream, h.events, h.received)
	return resp, nil
}

// grant opens a stream, sends first and reads the answer.
func (h *holdConn) grant(sctx context.Context, first *coordinatorv1.HoldRequest) (holdStream, *coordinatorv1.AcquireResponse, error) {
	stream, err := h.c.lc.Hold(sctx)
	if err != nil {
		return nil, nil, err
	}
	if err := stream.Send(first); err != nil {
		_, err = stream.Recv() // the stream's status says why
		return nil, nil, err
	}
	m, err := stream.Recv()
	if err != nil {
		return nil, nil, err
	}
	if m.GetGranted() == nil {
		return nil, nil, status.Errorf(codes.Internal, "client: Hold answered %T before granting", m.GetEvent())
	}
	return stream, m.GetGranted(), nil
}

// receive reads the stream until it ends. A loss is reported to the Lock
// the moment it arrives, then queued like every other event.
func (h *holdConn) receive(sctx context.Context, stream holdStream, events chan<- holdEvent, received chan<- struct{}) {
	defer close(received)
	for {
		m, err := stream.Recv()
		if lost := m.GetLost(); lost != nil {
			h.lose(lostError(lost))
		}
		select {
		case events <- holdEvent{resp: m, err: err}:
		case <-sctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// lostError is ErrLost with the coordinator's reason.
func lostError(l *coordinatorv1.HoldLost) error {
	return fmt.Errorf("%w: %s: %s", ErrLost, l.GetReason(), l.GetMessage())
}

// closeStream ends the current stream, if any, and waits for its receiver.
func (h *holdConn) closeStream() {
	if h.stream == nil {
		return
	}
	h.cancel()
	<-h.received
	h.stream = nil
}

// next is the stream's next event, within ctx.
func (h *holdConn) next(ctx context.Context) (*coordinatorv1.HoldResponse, error) {
	select {
	case ev := <-h.events:
		if ev.err != nil {
			h.closeStream()
			if errors.Is(ev.err, io.EOF) {
				return nil, status.Error(codes.Unavailable, "client: the Hold stream ended")
			}
		}
		return ev.resp, ev.err
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// heartbeat renews the grant on the stream, first resuming it on a new
// stream if the last one broke. ErrLost when the coordinator says the
// grant is gone.
func (h *holdConn) heartbeat(ctx context.Context, ref GrantRef) (*coordinatorv1.KeepAliveResponse, error) {
	if h.stream == nil {
		resume := &coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Resume{Resume: &coordinatorv1.HoldResume{
			Name: ref.Name, Token: ref.Token, Handle: ref.Handle, ReleaseOnDisconnect: h.releaseOnDisconnect,
		}}}
		if _, err := h.open(ctx, resume); err != nil {
			return nil, err
		}
	}
	if err := h.stream.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Heartbeat{Heartbeat: &coordinatorv1.HoldHeartbeat{}}}); err != nil {
		h.closeStream()
		return nil, status.Error(codes.Unavailable, "client: the Hold stream broke")
	}
	m, err := h.next(ctx)
	switch {
	case err != nil:
		// An answer still to come would be taken for the next heartbeat's,
		// dating its renewal too late: drop the stream, resume on a new one.
		h.closeStream()
		return nil, err
	case m.GetLost() != nil:
		return nil, lostError(m.GetLost())
	case m.GetRenewed() == nil:
		return nil, status.Errorf(codes.Internal, "client: Hold answered a heartbeat with %T", m.GetEvent())
	}
	return m.GetRenewed(), nil
}

// release gives the grant up on the stream; if the stream cannot, by the
// unary Release (the handle works on any connection). The stream is closed
// either way.
func (h *holdConn) release(ctx context.Context, ref GrantRef) error {
	defer h.closeStream()
	if h.stream != nil && h.stream.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Release{Release: &coordinatorv1.HoldRelease{}}}) == nil {
		m, err := h.next(ctx)
		if err == nil && (m.GetReleased() != nil || m.GetLost() != nil) {
			return nil
		}
	}
	h.closeStream()
	_, err := h.c.Release(ctx, ref)
	return err
}
