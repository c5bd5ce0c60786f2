package client

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// GrantRef names one grant and carries its secret handle: all that Release
// and KeepAlive need, so any process that was given the three values (a
// script, an operator, a successor of the process that acquired) can renew
// or give the grant up. Never log Handle.
type GrantRef struct {
	Name   string
	Token  int64
	Handle string
}

// Grant is a grant as the coordinator reported it. Times are the
// coordinator's clock; zero when it did not say.
type Grant struct {
	GrantRef
	// LeaseID is the etcd lease behind the grant (informational).
	LeaseID int64
	// TTL is the lease TTL granted.
	TTL time.Duration
	// ExpiresAt is the coordinator's estimate of the lease's end unless
	// renewed; SafeUntil is ExpiresAt minus its safety margin: stop
	// working by then unless a renewal succeeded.
	ExpiresAt, SafeUntil time.Time
	// AcquiredAt is when the lock was granted.
	AcquiredAt time.Time
	// Resumed: this answers a retry of an acquisition already granted.
	Resumed bool
	// Slot is a semaphore permit's slot (see Lock.Slot); Shared marks a
	// read-write lock's reader.
	Slot   int32
	Shared bool
}

// String shows the grant without its handle, so that a GrantRef printed
// or logged by mistake does not give the secret away.
func (r GrantRef) String() string {
	return fmt.Sprintf("grant of %q, token %d (handle hidden)", r.Name, r.Token)
}

// String shows the grant without its handle (see GrantRef.String).
func (g Grant) String() string {
	return fmt.Sprintf("%v, TTL %v, expires at %s", g.GrantRef, g.TTL, g.ExpiresAt.Format(time.RFC3339Nano))
}

// Renewal is the answer of a renewal, in the coordinator's clock.
type Renewal struct {
	TTL                  time.Duration
	ExpiresAt, SafeUntil time.Time
}

// AcquireGrant acquires the lock name as Acquire does (same options, same
// retries with one request id, *HeldError when not granted within the
// wait) but starts nothing: no heartbeat renews the grant and Close does not
// release it. The grant lives for its TTL unless someone holding its
// GrantRef renews it (KeepAlive) or releases it (Release). It is the
// primitive of tools that hand a grant on (coordctl acquire); in a program
// that works under the lock, use Acquire.
func (c *Client) AcquireGrant(ctx context.Context, name string, opts ...AcquireOption) (Grant, error) {
	g, _, err := c.acquire(ctx, name, resolveAcquire(opts))
	return g, err
}

// KeepAlive renews the grant ref for another full TTL, once. UNAVAILABLE is
// retried until ctx ends. A grant that is gone (expired, released, or a
// token or handle that does not match) answers the gRPC status NOT_FOUND
// with reason NOT_HELD (ReasonOf); a renewal refused at max_hold answers
// FAILED_PRECONDITION with reason MAX_HOLD_REACHED: stop working under the
// lock either way.
func (c *Client) KeepAlive(ctx context.Context, ref GrantRef) (Renewal, error) {
	var resp *coordinatorv1.KeepAliveResponse
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.keepAlive(ctx, ref)
		return err
	})
	if err != nil {
		return Renewal{}, err
	}
	return Renewal{TTL: resp.GetTtl().AsDuration(), ExpiresAt: asTime(resp.GetExpiresAt()), SafeUntil: asTime(resp.GetSafeUntil())}, nil
}

func (c *Client) keepAlive(ctx context.Context, ref GrantRef) (*coordinatorv1.KeepAliveResponse, error) {
	return c.lc.KeepAlive(ctx, &coordinatorv1.KeepAliveRequest{Name: ref.Name, Token: ref.Token, Handle: ref.Handle})
}

// Release gives the grant ref up, so that the next waiter is granted at
// once. It reports whether this call ended the grant: false (and no error)
// when the grant had already ended or the token or handle does not match
// it, and nothing changed. UNAVAILABLE is retried until ctx ends.
func (c *Client) Release(ctx context.Context, ref GrantRef) (bool, error) {
	var released bool
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		released, err = c.releaseOnce(ctx, ref)
		return err
	})
	return released, err
}

func (c *Client) releaseOnce(ctx context.Context, ref GrantRef) (bool, error) {
	resp, err := c.lc.Release(ctx, &coordinatorv1.ReleaseRequest{Name: ref.Name, Token: ref.Token, Handle: ref.Handle})
	return resp.GetReleased(), err
}

func grantOf(name string, r *coordinatorv1.AcquireResponse) Grant {
	return Grant{
		GrantRef: GrantRef{Name: name, Token: r.GetToken(), Handle: r.GetHandle()},
		LeaseID:  r.GetLeaseId(), TTL: r.GetTtl().AsDuration(),
		ExpiresAt: asTime(r.GetExpiresAt()), SafeUntil: asTime(r.GetSafeUntil()), AcquiredAt: asTime(r.GetAcquiredAt()),
		Resumed: r.GetResumed(), Slot: r.GetSlot(), Shared: r.GetMode() == coordinatorv1.LockMode_LOCK_MODE_SHARED,
	}
}

// asTime is t, or the zero time when it is unset.
func asTime(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime()
}
