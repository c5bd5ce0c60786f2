package coordinator

import (
	"context"

	"github.com/coordinatord/coordinatord/internal/lease"
)

// WatchEnds runs the lease manager's lock-end watch (lease.Manager.WatchEnds:
// every grant's end, for the hold-time metrics) from revision after until
// ctx ends, and starts it over from etcd's current revision whenever the
// token epoch changes: a restore of etcd from a backup replaced the history
// it followed (without --bump-revision it would wait, silently, for the
// revisions the restore took back; the chaos suite's restore scenario saw
// it report no end any more). Ends during the restore are not reported.
//
// On the shard-owner core it reports the ends this member's tables make
// instead (watchShardEnds): each end once in the cluster, not every end on
// every replica; after is not used there.
func (c *Coordinator) WatchEnds(ctx context.Context, after int64, observe func(lease.GrantEnd)) error {
	if c.own != nil {
		return c.watchShardEnds(ctx, observe)
	}
	for ctx.Err() == nil {
		changed := c.ep.Changed(c.ep.Status().Epoch)
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { // ends this watch when the epoch changes; waited for below
			defer close(done)
			select {
			case <-changed:
				cancel()
			case <-wctx.Done():
			}
		}()
		err := c.mgr.WatchEnds(wctx, after, observe)
		cancel()
		<-done
		if err != nil && ctx.Err() == nil {
			return err
		}
		after = 0 // from now on, in the new epoch
	}
	return nil
}
