package shard

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/coordinatord/coordinatord/internal/locktable"
)

// The feed of grant ends for the hold-time metrics (WatchEnds): every end
// this member's tables make final, as they make it. An owner sees every
// end of the grants of its shards, exactly once, when the delete commits;
// each shard has one owner at a time; so over the members each end is
// reported once in the cluster, by the member that ended it (a grant taken
// over in a failover is ended, and reported, by its new owner). The other
// source, Watch of every lock from etcd's history, would have every
// replica report every end in the cluster, and read each revision's end
// markers from etcd to tell how (one read per replica per revision with
// ends); the tables know how without a read.
//
// Ends are lost only when a table is dropped with their deletes in flight
// (a commit of unknown outcome, the shard lost: the next table loads the
// grants still in etcd, and reports their ends) or the process dies
// between a commit and its flush.

// EndedGrant is one grant's end, as the table that ended it saw it.
type EndedGrant struct {
	Name  string
	Token int64
	// End is how it ended: GrantReleased, GrantExpired or GrantForced.
	End GrantEnd
	// AcquiredAt is when it was granted, by the owner that granted it
	// (this member, or the one it took the shard over from), on the wall
	// clock as every answer's instants (Owner.wall).
	AcquiredAt time.Time
	// Held is from the grant to the commit of its delete, measured on
	// this member's Clock (on the two members' clocks for a grant taken
	// over); never negative.
	Held time.Duration
}

// endFeeds are the WatchEnds in progress, by *Owner (one each at most).
var endFeeds sync.Map

// endFeed is one WatchEnds: its observer, and per shard what it learnt of
// the ends in flight.
type endFeed struct {
	observe func(EndedGrant)
	shards  []feedShard // by shard number, each under its shard's mutex
}

// feedShard is one shard's ends in flight: when each of their grants was
// acquired, read while the table still has them (EndsInFlight).
type feedShard struct {
	tab      *locktable.Table // the table read; another one starts over
	last     uint64           // the last unit of tab read
	acquired map[grantKey]time.Time
}

// errEndsWatched: a second WatchEnds on one owner.
var errEndsWatched = errors.New("shard: the owner's grant ends are already watched (WatchEnds)")

// WatchEnds calls observe with the end of every grant that this member's
// tables make final (released, expired, force-released), from now until
// ctx ends or the owner closes; then it returns nil. A grant whose end was
// decided before WatchEnds began is not reported; a grant that a dropped
// table held is not ended (see GrantDropped) and not reported. One
// WatchEnds at a time per owner.
//
// observe is called under the shard's mutex, at the commit of the end:
// it must be quick and must not call the owner (a metrics update). No
// call comes once WatchEnds has returned.
func (o *Owner) WatchEnds(ctx context.Context, observe func(EndedGrant)) error {
	f := &endFeed{observe: observe, shards: make([]feedShard, len(o.shards))}
	if _, watched := endFeeds.LoadOrStore(o, f); watched {
		return errEndsWatched
	}
	select {
	case <-ctx.Done():
	case <-o.ctx.Done():
	}
	endFeeds.Delete(o)
	for _, s := range o.shards { // a flush that found the feed has finished
		s.mu.Lock()
		s.mu.Unlock() //nolint:staticcheck // an empty critical section: waits out the holder
	}
	return nil
}

// feedEnds hands a flush's ends to the WatchEnds in progress, if any
// (grantsEnded, under s.mu, after the table's Ready): each end of a grant
// whose delete it saw in flight is observed; then the deletes the Ready
// just handed out are read, with their grants' acquisition times.
func (o *Owner) feedEnds(s *shardState, ends []locktable.Ended) {
	v, ok := endFeeds.Load(o)
	if !ok {
		return
	}
	f := v.(*endFeed)
	fs := &f.shards[s.n]
	if fs.tab != s.tab {
		*fs = feedShard{tab: s.tab} // a new table: its unit ids start over
	}
	if s.tab == nil || s.tab.Dead() {
		fs.acquired = nil // a drop ends no grant (GrantDropped)
		return
	}
	now := o.clock.Now()
	for _, e := range ends {
		k := grantKey{e.Name, e.Token}
		at, seen := fs.acquired[k]
		if !seen {
			continue // decided before the feed began
		}
		delete(fs.acquired, k)
		f.observe(EndedGrant{Name: e.Name, Token: e.Token, End: endOf(e), AcquiredAt: o.wall(at), Held: max(now.Sub(at), 0)})
	}
	fs.last = s.tab.EndsInFlight(fs.last, func(h locktable.Holder) {
		if fs.acquired == nil {
			fs.acquired = map[grantKey]time.Time{}
		}
		fs.acquired[grantKey{h.Name, h.Token}] = h.AcquiredAt
	})
}
