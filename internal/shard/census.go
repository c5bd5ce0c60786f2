package shard

import "fmt"

// Census is what the shards this member serves hold now (the daemon
// exports it as coordinatord_locks_held and coordinatord_lock_waiters).
//
// It is this member's part of the cluster's: each lock lives in one
// shard, and each shard is served by one member at a time, so the sum over
// the members is the cluster's census (a relay serves no shard: zeros).
// The queue core counts the cluster's on every replica instead; the
// rules and the dashboard of deploy/monitoring take both apart.
type Census struct {
	Held    int64 // locks with a visible holder (committed, not yet ended)
	Waiting int64 // calls queued for them
	Shards  int   // the shards counted: those this member serves now
}

// Census counts the locks of every shard this member serves, reading each
// shard's table under its mutex (one shard at a time: the counts of two
// shards may be a moment apart). A shard being loaded (a takeover) is not
// counted until it serves, so the cluster's sum dips while a shard moves.
//
// It fails, wrapping ErrNotServing, once the member's lease deadline has
// passed: the member answers nothing then, and its shards are about to
// serve elsewhere, so its counts are no part of the cluster's any more.
// (That is also how a member cut off from etcd shows in the metrics: the
// census leaves the scrape, as the queue core's does when etcd does not
// answer.)
func (o *Owner) Census() (Census, error) {
	if !o.current().lease.Valid() {
		return Census{}, fmt.Errorf("%w: this member's lease deadline passed before etcd confirmed a renewal", ErrNotServing)
	}
	var c Census
	for _, s := range o.shards {
		s.mu.Lock()
		if s.term != 0 && s.tab != nil && !s.tab.Dead() {
			held, waiting := s.tab.Census()
			c.Held += int64(held)
			c.Waiting += int64(waiting)
			c.Shards++
		}
		s.mu.Unlock()
	}
	return c, nil
}
