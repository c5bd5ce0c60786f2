package shard

import (
	"cmp"
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/locktable"
)

// The calls of the lock service on the shard-owner core. Each runs its
// step on the name's shard table under the shard's mutex and waits for
// the reply (an Acquire until its grant commits or its wait ends; a
// Release until its delete commits; a KeepAlive not at all: it is
// memory-only). Outcomes come back as the lease package's errors, which
// the server already maps to status codes.

// Acquire queues for the lock and returns the grant (a.Call and, without
// a request id, a.Secret are filled in here).
func (o *Owner) Acquire(ctx context.Context, a locktable.Acquire) (*locktable.Grant, error) {
	s := o.shards[o.ShardOf(a.Name)]
	if a.Session == "" { // a session's grant has the session's secret
		a.Secret = randomSecret()
	}
	r, err := o.call(ctx, s, func(now time.Time, c locktable.CallID) {
		a.Call = c
		s.tab.Acquire(now, a)
	})
	if err != nil {
		if r.Outcome == locktable.Granted && a.RequestID == "" {
			o.abandon(r.Grant, a.Caller) // nothing else could ever release it
		}
		return nil, err
	}
	switch r.Outcome {
	case locktable.Granted:
		g := *r.Grant
		g.ExpiresAt, g.AcquiredAt = o.wall(g.ExpiresAt), o.wall(g.AcquiredAt)
		return &g, nil
	case locktable.NotGranted:
		return nil, &lease.NotGrantedError{Name: a.Name, HolderToken: r.HolderToken}
	}
	return nil, o.outcomeErr(s, a.Name, r)
}

// Release ends the grant if the handle, token and caller are its own.
func (o *Owner) Release(ctx context.Context, name string, token int64, handle, caller string) (bool, error) {
	s := o.shards[o.ShardOf(name)]
	r, err := o.call(ctx, s, func(now time.Time, c locktable.CallID) {
		s.tab.Release(now, c, name, token, handle, caller)
	})
	if err != nil {
		return false, err
	}
	if r.Outcome != locktable.Released {
		return false, o.outcomeErr(s, name, r)
	}
	return r.Released, nil
}

// KeepAlive renews the grant for its TTL.
func (o *Owner) KeepAlive(ctx context.Context, name string, token int64, handle, caller string) (*locktable.Renewal, error) {
	s := o.shards[o.ShardOf(name)]
	r, err := o.call(ctx, s, func(now time.Time, c locktable.CallID) {
		s.tab.KeepAlive(now, c, name, token, handle, caller)
	})
	if err != nil {
		return nil, err
	}
	if r.Outcome != locktable.Renewed {
		return nil, o.outcomeErr(s, name, r)
	}
	rn := r.Renewal
	rn.ExpiresAt = o.wall(rn.ExpiresAt)
	return &rn, nil
}

// wall converts t, an instant on the owner's Clock (the tables' and the
// lease deadline's), to the process's wall clock, which every answer's
// instants (expires_at, safe_until, acquired_at) are read on by clients:
// now on the wall clock plus how far t is from now on the owner's Clock.
// The durations stay the owner's (a clock running fast ends a grant early
// in real time, which the safety margin of safe_until covers), but a
// rate-skewed Clock's instants, whose wall reading drifts from the real
// one by the skew accumulated since the clock began (SkewedClock: "comparing
// them with times of another clock is meaningless"), never reach a client:
// a member whose clock ran 5% fast promised, after 20 s, safe_until 1 s
// past the instant its own table ended the grant (the chaos suite's
// CheckSafeUntil on the shard core). RealClock's instants are returned as
// they are.
func (o *Owner) wall(t time.Time) time.Time {
	if _, real := o.clock.(clockReal); real || t.IsZero() {
		return t
	}
	return time.Now().Add(t.Sub(o.clock.Now()))
}

// Validate judges a token from the owner's table: no etcd request. The
// table shows exactly what has committed, and the lease deadline makes
// sure no other owner can have committed anything since.
func (o *Owner) Validate(name string, token int64) (locktable.Verdict, error) {
	s := o.shards[o.ShardOf(name)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := o.serving(s); err != nil {
		return locktable.Verdict{}, err
	}
	return s.tab.Validate(name, token), nil
}

// Describe is the lock's holders and waiters, from the owner's table.
func (o *Owner) Describe(name string) ([]locktable.Holder, []locktable.Waiter, error) {
	s := o.shards[o.ShardOf(name)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := o.serving(s); err != nil {
		return nil, nil, err
	}
	hs, ws := s.tab.Describe(name)
	for i := range hs {
		hs[i].AcquiredAt, hs[i].ExpiresAt = o.wall(hs[i].AcquiredAt), o.wall(hs[i].ExpiresAt)
	}
	for i := range ws {
		ws[i].WaitingSince = o.wall(ws[i].WaitingSince)
	}
	return hs, ws, nil
}

// List is every holder whose name starts with prefix, across the shards
// this replica serves now, in ListOrder, and which shards
// those are (ascending). A shard not served here (owned by another member,
// loading, past the lease deadline) is skipped: a List across members
// gathers it from its owner (internal/server, forward.go), and tells from
// served whether every shard was answered for.
func (o *Owner) List(prefix string) (holders []locktable.Holder, served []uint32) {
	for _, s := range o.shards {
		s.mu.Lock()
		if o.serving(s) != nil {
			s.mu.Unlock()
			continue
		}
		served = append(served, s.n)
		s.tab.Holders(func(h locktable.Holder) {
			if strings.HasPrefix(h.Name, prefix) {
				h.AcquiredAt, h.ExpiresAt = o.wall(h.AcquiredAt), o.wall(h.ExpiresAt)
				holders = append(holders, h)
			}
		})
		s.mu.Unlock()
	}
	sort.Slice(holders, func(i, j int) bool {
		return ListOrder(holders[i].Name, holders[i].Token, holders[j].Name, holders[j].Token) < 0
	})
	return holders, served
}

// ListOrder is the order of List's holders: by name as etcd orders the
// names' keys (escaped, then "/": "app/b/c" before "app/b", as the queue
// core lists them), then by token.
func ListOrder(name1 string, token1 int64, name2 string, token2 int64) int {
	if name1 != name2 {
		return strings.Compare(keyspace.Escape(name1)+"/", keyspace.Escape(name2)+"/")
	}
	return cmp.Compare(token1, token2)
}

// Advertise is the address this member registered for its peers to
// forward to (shard.WithMember), "" if none: a NotServingError naming it
// names this replica itself, which must not forward to itself.
func (o *Owner) Advertise() string { return o.cfg.advertise }

// call runs one step on the shard's table and waits for its reply. If ctx
// ends first the call is cancelled in the table, and ctx's error returned
// with the reply that raced the cancellation, if any (a grant decided
// meanwhile: see Acquire).
func (o *Owner) call(ctx context.Context, s *shardState, step func(time.Time, locktable.CallID)) (locktable.Reply, error) {
	ch := make(chan locktable.Reply, 1)
	id := locktable.CallID(o.nextCall.Add(1))
	s.mu.Lock()
	if err := o.serving(s); err != nil {
		s.mu.Unlock()
		return locktable.Reply{}, err
	}
	s.answers[id] = ch
	step(o.clock.Now(), id)
	o.flush(s)
	s.mu.Unlock()
	select {
	case r := <-ch:
		return r, nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	if s.tab != nil {
		s.tab.Cancel(o.clock.Now(), id)
		o.flush(s)
	}
	delete(s.answers, id)
	s.mu.Unlock()
	select {
	case r := <-ch:
		return r, ctx.Err()
	default:
		return locktable.Reply{}, ctx.Err()
	}
}

// abandon releases a grant whose caller went away before its answer.
func (o *Owner) abandon(g *locktable.Grant, caller string) {
	s := o.shards[o.ShardOf(g.Name)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tab == nil {
		return
	}
	s.tab.Release(o.clock.Now(), locktable.CallID(o.nextCall.Add(1)), g.Name, g.Token, g.Handle, caller)
	o.flush(s)
}

// outcomeErr is the lease error of a refusal on shard s.
func (o *Owner) outcomeErr(s *shardState, name string, r locktable.Reply) error {
	if r.Outcome == locktable.Unavailable && s.storeFull.Load() {
		return fmt.Errorf("%w: the commit of %q was refused", lease.ErrStoreFull, name)
	}
	switch r.Outcome {
	case locktable.NotHeld:
		return lease.ErrNotHeld
	case locktable.MaxHoldReached:
		return lease.ErrMaxHold
	case locktable.RequestIDReused:
		return lease.ErrRequestIDReused
	case locktable.TooManyWaiters:
		return &lease.TooManyWaitersError{Name: name, Limit: int64(r.InForce)}
	case locktable.SessionBusy:
		return lease.ErrSessionBusy
	case locktable.Forbidden: // a session's grant, by another identity
		return lease.ErrSessionForbidden
	case locktable.LimitMismatch:
		return &lease.LimitMismatchError{Name: name, InForce: r.InForce, Shared: r.Shared}
	case locktable.Unavailable:
		return fmt.Errorf("%w: the shard of %q changed owner or reloaded during the call; retry with the same request id", lease.ErrUnavailable, name)
	}
	return fmt.Errorf("%w: unexpected outcome %d for %q", lease.ErrUnavailable, r.Outcome, name)
}

// ForceRelease ends the grant of name with this token whatever its handle
// (an administrator's call), as an expiry would: its lock-delay applies.
func (o *Owner) ForceRelease(ctx context.Context, name string, token int64) (bool, error) {
	s := o.shards[o.ShardOf(name)]
	r, err := o.call(ctx, s, func(now time.Time, c locktable.CallID) {
		s.tab.ForceRelease(now, c, name, token)
	})
	if err != nil {
		return false, err
	}
	if r.Outcome != locktable.Released {
		return false, o.outcomeErr(s, name, r)
	}
	return r.Released, nil
}
