package server

import (
	"context"
	"errors"

	"google.golang.org/grpc"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// Resource marks on the shard-owner core: ValidateToken with a resource
// (below), and the FenceService's calls (fence.go): GetMark and ListMarks
// read etcd on any replica, DeleteMark and RebindMark are made by the
// owner of the shard of the mark's lock (internal/shard/markadmin.go),
// forwarded there from any other replica (forwardMarks).

// validateWithResourceOnShards is ValidateToken with a resource on a shard
// this replica serves (the call was routed to the owner of the lock's
// shard by name, as every shard call): the table's verdict and the
// resource's mark, on the owner (shard.Owner.ValidateResource), with the
// queue core's contract: REASON_FENCED below the mark,
// MARK_OWNED_BY_OTHER_LOCK, SHARED_HOLDER_CANNOT_FENCE, TOO_MANY_MARKS
// (counted per authenticated identity, "" without authentication).
func (s *LockService) validateWithResourceOnShards(ctx context.Context, req *coordinatorv1.ValidateTokenRequest) (*coordinatorv1.ValidateTokenResponse, error) {
	if err := lease.ValidateName("name", req.GetName(), false); err != nil {
		return nil, err
	}
	if req.GetToken() <= 0 {
		return nil, &lease.FieldError{Field: "token", Reason: "must be a positive fencing token from Acquire"}
	}
	if err := lease.ValidateName("resource", req.GetResource(), false); err != nil {
		return nil, err
	}
	e, err := s.epoch(ctx) // nothing is validated while the epoch is paused
	if err != nil {
		return nil, err
	}
	v, err := s.shards.ValidateResource(ctx, shard.MarkCheck{Name: req.GetName(), Token: req.GetToken(), Epoch: e,
		Resource: req.GetResource(), Identity: callerOf(ctx)})
	if err != nil {
		return nil, err
	}
	return &coordinatorv1.ValidateTokenResponse{Valid: v.Valid, Reason: reasons[v.Reason], CurrentToken: wireToken(e, v.CurrentToken)}, nil
}

// forwardMarks is forward (forward.go) for the FenceService calls that
// change a mark: here is the call on this replica, whose
// *shard.NotServingError names the owner of the mark's lock's shard when
// it is another member; there is the same call on that member, with the
// same guarantees as the lock calls' (the caller's deadline and identity,
// never forwarded twice, retried while the shard moves). forward speaks to
// the peer as a LockServiceClient; this call reaches its FenceService on
// the same pooled connection, to the address of the refusal forward acts
// on (forward calls there right after the here that named it). f nil: no
// forwarding (the queue core).
func forwardMarks[Req, Resp any](ctx context.Context, f *Forwarder, req Req,
	here func(context.Context, Req) (Resp, error),
	there func(coordinatorv1.FenceServiceClient, context.Context, Req, ...grpc.CallOption) (Resp, error),
) (Resp, error) {
	var addr string // the owner the last refusal named
	hereNaming := func(ctx context.Context, req Req) (Resp, error) {
		resp, err := here(ctx, req)
		if ns := (*shard.NotServingError)(nil); errors.As(err, &ns) {
			addr = ns.Addr
		}
		return resp, err
	}
	thereOnFence := func(_ coordinatorv1.LockServiceClient, ctx context.Context, req Req, opts ...grpc.CallOption) (Resp, error) {
		c, err := f.fenceClient(addr)
		if err != nil {
			var none Resp
			return none, peerUnreachable(err) // as the transport's: tried again
		}
		return there(c, ctx, req, opts...)
	}
	return forward(ctx, f, req, hereNaming, thereOnFence)
}

// fenceClient is a FenceService client of the peer at addr, on the
// connection client pools for it.
func (f *Forwarder) fenceClient(addr string) (coordinatorv1.FenceServiceClient, error) {
	if _, err := f.client(addr); err != nil { // opens the pooled connection if need be
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.conns[addr]
	if !ok {
		return nil, errors.New("the forwarder is closed")
	}
	return coordinatorv1.NewFenceServiceClient(c), nil
}
