package server

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// releaseTimeout bounds a release_on_disconnect after the stream is gone.
const releaseTimeout = 5 * time.Second

// Hold implements coordinatorv1.LockServiceServer.
func (s *LockService) Hold(stream coordinatorv1.LockService_HoldServer) error {
	const method = "Hold"
	ctx := stream.Context()
	as := callOptions(ctx)
	// The receive loop runs in its own goroutine (gRPC offers no other way
	// to wait for a message and an event at once); it ends when the stream
	// does, which returning from this handler guarantees. Every wait below
	// also ends with ctx: an interceptor may end the stream (a revoked
	// identity) while the client sends nothing.
	msgs := make(chan *coordinatorv1.HoldRequest)
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	var first *coordinatorv1.HoldRequest
	select {
	case first = <-msgs:
	case err := <-recvErr:
		return err
	case <-ctx.Done():
		return s.fail(ctx, method, ctx.Err())
	}
	var (
		g                   *lease.Grant
		releaseOnDisconnect bool
		err                 error
	)
	switch k := first.GetKind().(type) {
	case *coordinatorv1.HoldRequest_Acquire:
		req := k.Acquire.GetRequest()
		if req == nil {
			return s.fail(ctx, method, &lease.FieldError{Field: "acquire.request", Reason: "must be set"})
		}
		opts, err := acquireOptions(req)
		if err != nil {
			return s.fail(ctx, method, err)
		}
		opts = append(opts, ownedOptions(ctx)...)
		opts = append(opts, callerOptions(ctx)...)
		if g, err = s.leases.Acquire(ctx, req.GetName(), opts...); err != nil {
			return s.fail(ctx, method, err)
		}
		releaseOnDisconnect = k.Acquire.GetReleaseOnDisconnect()
	case *coordinatorv1.HoldRequest_Resume:
		r := k.Resume
		if g, err = s.leases.Resume(ctx, r.GetName(), r.GetToken(), r.GetHandle(), as...); err != nil {
			return s.fail(ctx, method, err)
		}
		releaseOnDisconnect = r.GetReleaseOnDisconnect()
	default:
		return s.fail(ctx, method, &lease.FieldError{Field: "kind", Reason: "the first message must be acquire or resume"})
	}
	if err := stream.Send(&coordinatorv1.HoldResponse{Event: &coordinatorv1.HoldResponse_Granted{Granted: grantPB(g)}}); err != nil {
		s.disconnected(g, releaseOnDisconnect, as)
		return err
	}

	// The end watcher is owned here: cancelled and waited for on return.
	wctx, cancel := context.WithCancel(ctx)
	ended := make(chan lease.EndReason, 1)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		if r, err := s.leases.AwaitEnd(wctx, g.Name, g.Token, g.Handle); err == nil {
			ended <- r
		}
	}()
	defer func() { cancel(); <-watchDone }()

	lost := func(reason coordinatorv1.HoldLost_Reason, msg string) error {
		return stream.Send(&coordinatorv1.HoldResponse{Event: &coordinatorv1.HoldResponse_Lost{Lost: &coordinatorv1.HoldLost{Reason: reason, Token: g.Token, Message: msg}}})
	}
	for {
		select {
		case err := <-recvErr:
			s.disconnected(g, releaseOnDisconnect, as)
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-ctx.Done():
			s.disconnected(g, releaseOnDisconnect, as)
			return s.fail(ctx, method, ctx.Err())
		case r := <-ended:
			reason, msg := coordinatorv1.HoldLost_REASON_EXPIRED, "the lease expired: no heartbeat in time; stop working under the lock"
			switch r {
			case lease.EndForced:
				reason, msg = coordinatorv1.HoldLost_REASON_FORCE_RELEASED, "an operator force-released the lock; stop working under it"
			case lease.EndReleased:
				reason, msg = coordinatorv1.HoldLost_REASON_RELEASED_ELSEWHERE, "released with the handle through another connection"
			}
			return lost(reason, msg)
		case m := <-msgs:
			switch m.GetKind().(type) {
			case *coordinatorv1.HoldRequest_Heartbeat:
				r, err := s.leases.KeepAlive(ctx, g.Name, g.Token, g.Handle, as...)
				switch {
				case errors.Is(err, lease.ErrMaxHold):
					return lost(coordinatorv1.HoldLost_REASON_MAX_HOLD, err.Error())
				case errors.Is(err, lease.ErrNotHeld):
					select { // say how it ended if the watcher knows already
					case r := <-ended:
						ended <- r
						continue
					case <-time.After(time.Second):
					}
					return lost(coordinatorv1.HoldLost_REASON_EXPIRED, err.Error())
				case err != nil:
					return s.fail(ctx, method, err)
				}
				if err := stream.Send(&coordinatorv1.HoldResponse{Event: &coordinatorv1.HoldResponse_Renewed{Renewed: renewalPB(r)}}); err != nil {
					return err
				}
			case *coordinatorv1.HoldRequest_Release:
				cancel() // our own release is not a loss
				ok, err := s.leases.Release(ctx, g.Name, g.Token, g.Handle, as...)
				if err != nil {
					return s.fail(ctx, method, err)
				}
				return stream.Send(&coordinatorv1.HoldResponse{Event: &coordinatorv1.HoldResponse_Released{Released: &coordinatorv1.ReleaseResponse{Released: ok}}})
			default:
				return s.fail(ctx, method, &lease.FieldError{Field: "kind", Reason: "acquire and resume are only allowed as the first message"})
			}
		}
	}
}

// disconnected releases the grant of a broken stream if the client asked;
// as names the stream's caller.
func (s *LockService) disconnected(g *lease.Grant, release bool, as []lease.CallOption) {
	if !release {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if _, err := s.leases.Release(ctx, g.Name, g.Token, g.Handle, as...); err != nil {
		s.log.Warn("release_on_disconnect failed; the lease ends with its TTL", "name", g.Name, "token", g.Token, "err", err)
	}
}

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
		resp := &coordinatorv1.WatchResponse{Kind: watchKinds[ev.Kind], Revision: ev.Revision}
		if ev.Holder != nil {
			resp.Holder = &coordinatorv1.Holder{Name: ev.Holder.Name, Token: ev.Holder.Token, Owner: ev.Holder.Owner}
		}
		return stream.Send(resp)
	})
	if st, ok := status.FromError(err); ok && err != nil && st.Code() != codes.Unknown {
		return err // a Send error is already a status
	}
	return s.fail(ctx, "Watch", err)
}

// ForceRelease implements coordinatorv1.LockServiceServer.
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

// OpenSession implements coordinatorv1.LockServiceServer.
func (s *LockService) OpenSession(ctx context.Context, req *coordinatorv1.OpenSessionRequest) (*coordinatorv1.OpenSessionResponse, error) {
	ttl, err := duration("ttl", req.GetTtl())
	if err != nil {
		return nil, s.fail(ctx, "OpenSession", err)
	}
	var d time.Duration // 0: the default
	if ttl != nil {
		if *ttl <= 0 {
			return nil, s.fail(ctx, "OpenSession", &lease.FieldError{Field: "ttl", Reason: "must be at least 1s; leave it unset for the server's default"})
		}
		d = *ttl
	}
	ss, err := s.leases.OpenSession(ctx, d, req.GetOwner(), callOptions(ctx)...)
	if err != nil {
		return nil, s.fail(ctx, "OpenSession", err)
	}
	return &coordinatorv1.OpenSessionResponse{Handle: ss.Handle, LeaseId: ss.LeaseID, Ttl: durationpb.New(ss.TTL),
		ExpiresAt: timestamp(ss.ExpiresAt), SafeUntil: timestamp(ss.SafeUntil)}, nil
}

// KeepAliveSession implements coordinatorv1.LockServiceServer.
func (s *LockService) KeepAliveSession(ctx context.Context, req *coordinatorv1.KeepAliveSessionRequest) (*coordinatorv1.KeepAliveSessionResponse, error) {
	r, hs, err := s.leases.KeepAliveSession(ctx, req.GetHandle(), callOptions(ctx)...)
	if err != nil {
		return nil, s.fail(ctx, "KeepAliveSession", err)
	}
	resp := &coordinatorv1.KeepAliveSessionResponse{Ttl: durationpb.New(r.TTL), ExpiresAt: timestamp(r.ExpiresAt), SafeUntil: timestamp(r.SafeUntil)}
	for i := range hs {
		resp.Holders = append(resp.Holders, holderPB(&hs[i]))
	}
	return resp, nil
}

// CloseSession implements coordinatorv1.LockServiceServer.
func (s *LockService) CloseSession(ctx context.Context, req *coordinatorv1.CloseSessionRequest) (*coordinatorv1.CloseSessionResponse, error) {
	ok, hs, err := s.leases.CloseSession(ctx, req.GetHandle(), callOptions(ctx)...)
	if err != nil {
		return nil, s.fail(ctx, "CloseSession", err)
	}
	resp := &coordinatorv1.CloseSessionResponse{Closed: ok}
	for i := range hs {
		resp.Released = append(resp.Released, holderPB(&hs[i]))
	}
	return resp, nil
}
