package coordinator

import (
	"context"

	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// watchShardEnds is WatchEnds on the shard-owner core: the ends of the
// grants this member's tables make final (shard.Owner.WatchEnds), from now
// until ctx ends, in the lease manager's terms so that the metrics take
// either core's. Each end is reported by one member, the owner of its
// shard when its delete committed: sum the counts over the members. The
// queue core's watch, by contrast, has every replica report every end in
// the cluster. Nothing is started over when the token epoch changes: the
// feed reads no history of etcd's, only what the tables decide.
//
// An end carries no revision (Revision 0): a table does not report the
// revision of the commit that ended the grant.
func (c *Coordinator) watchShardEnds(ctx context.Context, observe func(lease.GrantEnd)) error {
	return c.own.WatchEnds(ctx, func(e shard.EndedGrant) {
		observe(lease.GrantEnd{Name: e.Name, Token: e.Token, Reason: endReason(e.End), Held: e.Held})
	})
}

// endReason is the lease manager's name of how a grant ended.
func endReason(e shard.GrantEnd) lease.EndReason {
	switch e {
	case shard.GrantReleased:
		return lease.EndReleased
	case shard.GrantForced:
		return lease.EndForced
	}
	return lease.EndExpired
}
