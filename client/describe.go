package client

import (
	"context"
	"time"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// Holder is the current grant of a lock as everyone may see it: never its
// handle. Times are the coordinator's clock; zero when it did not say (List
// and Watch do not look leases up, so ExpiresAt is zero there).
type Holder struct {
	Name       string
	Token      int64
	Owner      string // as given to WithOwner; may be empty
	AcquiredAt time.Time
	ExpiresAt  time.Time
	// Shared marks a read-write lock's reader; Slot is a semaphore
	// holder's slot; Limit is the lock's limit (1 for a mutex or a
	// read-write lock; 0 from a coordinator that does not say).
	Shared bool
	Slot   int32
	Limit  int32
}

// Waiter is one contender queued for a lock.
type Waiter struct {
	Owner        string
	WaitingSince time.Time
	Shared       bool // a reader's acquisition
}

// Description is the state of one lock.
type Description struct {
	// Holder is nil when the lock is free; it is the oldest of Holders.
	Holder *Holder
	// Holders are every holder, oldest first: more than one for a
	// semaphore or a read-write lock's readers.
	Holders []Holder
	// Waiters are in queue order, the next to be granted first.
	Waiters []Waiter
}

// Describe returns the holder and the waiters of the lock name, for
// operators. UNAVAILABLE is retried until ctx ends.
func (c *Client) Describe(ctx context.Context, name string) (Description, error) {
	var resp *coordinatorv1.DescribeResponse
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.lc.Describe(ctx, &coordinatorv1.DescribeRequest{Name: name})
		return err
	})
	if err != nil {
		return Description{}, err
	}
	d := Description{Holder: holderOf(resp.GetHolder())}
	for _, h := range resp.GetHolders() {
		d.Holders = append(d.Holders, *holderOf(h))
	}
	if len(d.Holders) == 0 && d.Holder != nil { // a coordinator from before semaphores
		d.Holders = []Holder{*d.Holder}
	}
	for _, w := range resp.GetWaiters() {
		d.Waiters = append(d.Waiters, Waiter{Owner: w.GetOwner(), WaitingSince: asTime(w.GetWaitingSince()),
			Shared: w.GetMode() == coordinatorv1.LockMode_LOCK_MODE_SHARED})
	}
	return d, nil
}

// ForceRelease ends the grant token of the lock name, whoever holds it, for
// operators (the coordinator lets only admins call it: PERMISSION_DENIED
// otherwise). The holder sees its lock lost, and its lock-delay applies. It
// reports false, changing nothing, when token is not the current holder's.
// UNAVAILABLE is retried until ctx ends: the call is conditional on the
// token, so a retry never ends a later grant.
func (c *Client) ForceRelease(ctx context.Context, name string, token int64) (bool, error) {
	var resp *coordinatorv1.ForceReleaseResponse
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.lc.ForceRelease(ctx, &coordinatorv1.ForceReleaseRequest{Name: name, Token: token})
		return err
	})
	return resp.GetReleased(), err
}

// holderOf converts a Holder message; nil stays nil.
func holderOf(h *coordinatorv1.Holder) *Holder {
	if h == nil {
		return nil
	}
	return &Holder{Name: h.GetName(), Token: h.GetToken(), Owner: h.GetOwner(), AcquiredAt: asTime(h.GetAcquiredAt()), ExpiresAt: asTime(h.GetExpiresAt()),
		Shared: h.GetMode() == coordinatorv1.LockMode_LOCK_MODE_SHARED, Slot: h.GetSlot(), Limit: h.GetLimit()}
}
