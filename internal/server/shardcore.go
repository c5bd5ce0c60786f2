package server

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/authz"
	"github.com/coordinatord/coordinatord/internal/epoch"
	"github.com/coordinatord/coordinatord/internal/fence"
	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/locktable"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// The handlers of the shard-owner core (-core shard), while it is built
// beside the queue core: Acquire, Release, KeepAlive, ValidateToken (marks
// in marksshard.go), Describe, List, ForceRelease and Hold (holdshard.go)
// are decided by the owner of the name's shard in memory (internal/shard,
// internal/locktable), forwarded there from any other replica (forward.go;
// a Hold stream is relayed there whole, forwardhold.go). Watch
// (watchshard.go) follows etcd's history of the grant keys on any replica.
// The calls not ported yet (sessions, the marks' admin calls) answer
// UNIMPLEMENTED with the reason NOT_ON_SHARD_CORE rather than reach the
// queue core, whose locks the shard core cannot see.

// WithShardCore serves the lock calls from the shard-owner core.
func WithShardCore(o *shard.Owner) ServiceOption { return func(s *LockService) { s.shards = o } }

// errNotOnShardCore refuses a call the shard-owner core does not serve yet.
func errNotOnShardCore(method string) error {
	return &NotOnShardCoreError{Method: method}
}

// NotOnShardCoreError: the call is not served by the shard-owner core yet.
type NotOnShardCoreError struct{ Method string }

func (e *NotOnShardCoreError) Error() string {
	return e.Method + " is not served by the shard-owner core yet (-core shard); run the daemon with -core queue (the default) to use it"
}

// The calls on the shard-owner core answer here if this replica serves the
// name's shard, else on the member that owns it (forward.go).

// acquireOnShards is Acquire on the shard-owner core.
func (s *LockService) acquireOnShards(ctx context.Context, req *coordinatorv1.AcquireRequest) (*coordinatorv1.AcquireResponse, error) {
	return forward(ctx, s.fwd, req, s.acquireHere, coordinatorv1.LockServiceClient.Acquire)
}

// releaseOnShards is Release on the shard-owner core.
func (s *LockService) releaseOnShards(ctx context.Context, req *coordinatorv1.ReleaseRequest) (*coordinatorv1.ReleaseResponse, error) {
	return forward(ctx, s.fwd, req, s.releaseHere, coordinatorv1.LockServiceClient.Release)
}

// keepAliveOnShards is KeepAlive on the shard-owner core.
func (s *LockService) keepAliveOnShards(ctx context.Context, req *coordinatorv1.KeepAliveRequest) (*coordinatorv1.KeepAliveResponse, error) {
	return forward(ctx, s.fwd, req, s.keepAliveHere, coordinatorv1.LockServiceClient.KeepAlive)
}

// validateOnShards is ValidateToken on the shard-owner core.
func (s *LockService) validateOnShards(ctx context.Context, req *coordinatorv1.ValidateTokenRequest) (*coordinatorv1.ValidateTokenResponse, error) {
	return forward(ctx, s.fwd, req, s.validateHere, coordinatorv1.LockServiceClient.ValidateToken)
}

// describeOnShards is Describe on the shard-owner core.
func (s *LockService) describeOnShards(ctx context.Context, req *coordinatorv1.DescribeRequest) (*coordinatorv1.DescribeResponse, error) {
	return forward(ctx, s.fwd, req, s.describeHere, coordinatorv1.LockServiceClient.Describe)
}

// acquireHere is Acquire on a shard this replica serves.
func (s *LockService) acquireHere(ctx context.Context, req *coordinatorv1.AcquireRequest) (*coordinatorv1.AcquireResponse, error) {
	if op := identitySlotsCall(ctx); op != "" { // a member's call on a lock count (identitylimit.go)
		return s.identitySlotsHere(ctx, req, op)
	}
	opts, err := acquireOptions(req)
	if err != nil {
		return nil, err
	}
	opts = append(opts, ownedOptions(ctx)...)
	opts = append(opts, callerOptions(ctx)...)
	c, err := s.leases.Check(req.GetName(), opts...)
	if err != nil {
		return nil, err
	}
	e, err := s.epoch(ctx)
	if err != nil {
		return nil, err
	}
	a := locktable.Acquire{Name: req.GetName(), Caller: c.Caller, Owner: c.Owner, RequestID: c.RequestID,
		TTL: c.TTL, Wait: c.Wait, MaxHold: c.MaxHold, LockDelay: c.LockDelay, Limit: c.Limit, Shared: c.Shared}
	if a.Wait < 0 {
		a.Wait = forever // until the caller's deadline, which cancels the call
	}
	if c.SessionHandle != "" {
		if err := s.sessionOf(ctx, &a, c.SessionHandle); err != nil {
			return nil, err
		}
	}
	g, err := s.shards.AcquireCounted(ctx, a) // a slot of the caller's lock count first, if limited
	if err != nil {
		return nil, err
	}
	if err := s.epochHeld(ctx, e, g, c.Caller); err != nil {
		return nil, err
	}
	return &coordinatorv1.AcquireResponse{
		Token: wireToken(e, g.Token), Handle: g.Handle, Ttl: durationpb.New(g.TTL),
		ExpiresAt: timestamp(g.ExpiresAt), SafeUntil: timestamp(g.ExpiresAt.Add(-lease.SafetyMargin(g.TTL))),
		AcquiredAt: timestamp(g.AcquiredAt), Resumed: g.Resumed, Slot: g.Slot, Mode: modePB(g.Shared),
	}, nil
}

// epochHeld checks that the token epoch is still e after a grant: one made
// while the epoch paused or changed may stand on a history etcd lost, so it
// is given up (by its own handle) rather than left to hold the lock until
// its TTL while the caller retries, and the call answers EPOCH_PAUSED.
func (s *LockService) epochHeld(ctx context.Context, e int64, g *locktable.Grant, caller string) error {
	after, err := s.epoch(ctx)
	if err == nil && after != e {
		err = &epoch.PausedError{Reason: fmt.Sprintf("the token epoch changed from %d to %d during the call", e, after)}
	}
	if err == nil {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, rerr := s.shards.Release(rctx, g.Name, g.Token, g.Handle, caller); rerr != nil {
		s.log.WarnContext(ctx, "a grant made while the token epoch paused was not released; it ends with its TTL", "name", g.Name, "err", rerr)
	}
	return err
}

// forever is the wait of an Acquire without one: its deadline ends it.
const forever = 1 << 62

// releaseHere is Release on a shard this replica serves.
func (s *LockService) releaseHere(ctx context.Context, req *coordinatorv1.ReleaseRequest) (*coordinatorv1.ReleaseResponse, error) {
	if err := checkGrantCall(req.GetName(), req.GetToken(), req.GetHandle()); err != nil {
		return nil, err
	}
	rev, current, err := s.revisionOf(ctx, req.GetToken())
	if err != nil || !current {
		return &coordinatorv1.ReleaseResponse{}, err
	}
	ok, err := s.shards.Release(ctx, req.GetName(), rev, req.GetHandle(), callerOf(ctx))
	if ok {
		s.shards.AwaitIdentityRelease(ctx, req.GetName(), rev) // its slot of the caller's lock count freed
	}
	if err == nil {
		err = s.unchanged(ctx, req.GetToken())
	}
	if err != nil {
		return nil, err
	}
	return &coordinatorv1.ReleaseResponse{Released: ok}, nil
}

// keepAliveHere is KeepAlive on a shard this replica serves.
func (s *LockService) keepAliveHere(ctx context.Context, req *coordinatorv1.KeepAliveRequest) (*coordinatorv1.KeepAliveResponse, error) {
	if err := checkGrantCall(req.GetName(), req.GetToken(), req.GetHandle()); err != nil {
		return nil, err
	}
	rev, current, err := s.revisionOf(ctx, req.GetToken())
	if err == nil && !current {
		err = lease.ErrNotHeld
	}
	if err != nil {
		return nil, err
	}
	r, err := s.shards.KeepAlive(ctx, req.GetName(), rev, req.GetHandle(), callerOf(ctx))
	if err == nil {
		err = s.unchanged(ctx, req.GetToken())
	}
	if err != nil {
		return nil, err
	}
	return &coordinatorv1.KeepAliveResponse{Ttl: durationpb.New(r.TTL), ExpiresAt: timestamp(r.ExpiresAt),
		SafeUntil: timestamp(r.ExpiresAt.Add(-lease.SafetyMargin(r.TTL)))}, nil
}

// validateHere is ValidateToken on a shard this replica serves: answered
// from the owner's memory, no etcd request.
func (s *LockService) validateHere(ctx context.Context, req *coordinatorv1.ValidateTokenRequest) (*coordinatorv1.ValidateTokenResponse, error) {
	if req.GetResource() != "" {
		return s.validateWithResourceOnShards(ctx, req)
	}
	if err := lease.ValidateName("name", req.GetName(), false); err != nil {
		return nil, err
	}
	if req.GetToken() <= 0 {
		return nil, &lease.FieldError{Field: "token", Reason: "must be a positive fencing token from Acquire"}
	}
	e, err := s.epoch(ctx)
	if err != nil {
		return nil, err
	}
	rev, current, _ := s.revisionOf(ctx, req.GetToken())
	v, err := s.shards.Validate(req.GetName(), rev)
	if err != nil {
		return nil, err
	}
	if !current { // a token of another epoch holds nothing now
		v = locktable.Verdict{Reason: locktable.Superseded, CurrentToken: v.CurrentToken}
		if v.CurrentToken == 0 {
			v.Reason = locktable.NotHeldNow
		}
	}
	return &coordinatorv1.ValidateTokenResponse{Valid: v.Valid, Reason: reasons[fenceReason(v.Reason)], CurrentToken: wireToken(e, v.CurrentToken)}, nil
}

func fenceReason(r locktable.Reason) fence.Reason {
	switch r {
	case locktable.Current:
		return fence.Current
	case locktable.Superseded:
		return fence.Superseded
	}
	return fence.NotHeld
}

// describeHere is Describe on a shard this replica serves.
func (s *LockService) describeHere(ctx context.Context, req *coordinatorv1.DescribeRequest) (*coordinatorv1.DescribeResponse, error) {
	if err := lease.ValidateName("name", req.GetName(), false); err != nil {
		return nil, err
	}
	e, err := s.epoch(ctx)
	if err != nil {
		return nil, err
	}
	hs, ws, err := s.shards.Describe(req.GetName())
	if err != nil {
		return nil, err
	}
	resp := &coordinatorv1.DescribeResponse{Holders: holdersOnShards(hs, e)}
	if len(resp.Holders) > 0 {
		resp.Holder = resp.Holders[0]
	}
	for _, w := range ws {
		resp.Waiters = append(resp.Waiters, &coordinatorv1.Waiter{Owner: w.Owner, WaitingSince: timestamp(w.WaitingSince), Mode: modePB(w.Shared)})
	}
	return resp, nil
}

// listOnShards is List on the shard-owner core (one page: every holder),
// gathered from every member that owns shards (listAcross).
func (s *LockService) listOnShards(ctx context.Context, req *coordinatorv1.ListRequest) (*coordinatorv1.ListResponse, error) {
	if err := lease.ValidateName("prefix", req.GetPrefix(), true); err != nil {
		return nil, err
	}
	size, err := keyspace.PageSize(int(req.GetPageSize()))
	if err != nil {
		return nil, err
	}
	after, err := keyspace.DecodePageToken(req.GetPageToken(), keyspace.Escape(req.GetPrefix()))
	if err != nil {
		return nil, err
	}
	e, err := s.epoch(ctx)
	if err != nil {
		return nil, err
	}
	// Every member answers all its holders under the prefix; the page is
	// cut from the merged list here.
	hs, err := s.listAcross(ctx, &coordinatorv1.ListRequest{Prefix: req.GetPrefix()}, func() ([]*coordinatorv1.Holder, []uint32) {
		hs, served := s.shards.List(req.GetPrefix())
		return holdersOnShards(hs, e), served
	})
	if err != nil {
		return nil, err
	}
	if forwarded(ctx) {
		return &coordinatorv1.ListResponse{Holders: hs}, nil
	}
	page, next := listPage(hs, after, size)
	for _, h := range page {
		h.ExpiresAt = nil // the API's List carries no expiry (the queue core's looks up no leases)
	}
	return &coordinatorv1.ListResponse{Holders: page, NextPageToken: next}, nil
}

// listPage cuts one page from holders in ListOrder, as the queue core's
// List does: the names after the escaped name after, whole names only, at
// least size holders unless none are left; next is the cursor of the next
// page, "" on the last.
func listPage(hs []*coordinatorv1.Holder, after string, size int) (page []*coordinatorv1.Holder, next string) {
	for i, h := range hs {
		esc := keyspace.Escape(h.GetName())
		if after != "" && esc+"/" < after+"0" { // "0" sorts right after "/": that name and those before it
			continue
		}
		if len(page) >= size && h.GetName() != hs[i-1].GetName() {
			return page, keyspace.EncodePageToken(keyspace.Escape(hs[i-1].GetName()))
		}
		page = append(page, h)
	}
	return page, ""
}

func holdersOnShards(hs []locktable.Holder, e int64) []*coordinatorv1.Holder {
	var out []*coordinatorv1.Holder
	for _, h := range hs {
		out = append(out, holderPB(&lease.Holder{Name: h.Name, Token: h.Token, Owner: h.Owner, AcquiredAt: h.AcquiredAt,
			ExpiresAt: h.ExpiresAt, Shared: h.Shared, Slot: h.Slot, Limit: h.Limit}, e))
	}
	return out
}

// callerOf is the authenticated identity of the call, "" without
// authentication.
func callerOf(ctx context.Context) string {
	id, _ := authz.FromContext(ctx)
	return id
}

// checkGrantCall refuses a call on a grant whose name, token or handle is
// malformed (INVALID_ARGUMENT naming the field), before anything is read.
func checkGrantCall(name string, token int64, handle string) error {
	if err := lease.ValidateName("name", name, false); err != nil {
		return err
	}
	if err := lease.ValidateToken(token); err != nil {
		return err
	}
	return checkHandle("handle", handle)
}

// checkHandle refuses a handle (a grant's or a session's) that is not of
// the shard core's form.
func checkHandle(field, handle string) error {
	if _, _, ok := locktable.ParseSessionHandle(handle); !ok {
		return &lease.FieldError{Field: field, Reason: "is malformed; pass the handle exactly as Acquire (or OpenSession) returned it"}
	}
	return nil
}
