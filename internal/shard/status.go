package shard

import "time"

// Status is what an operator sees of a member of the shard core (the
// daemon exports it as metrics at every scrape).
type Status struct {
	Shards  int // the cluster's shard count
	Serving int // shards this replica owns and answers for now
	Loading int // shards it owns whose state is being loaded from etcd
	// LeaseHeadroom is how long the member may still answer without
	// another renewal acknowledged by etcd (negative: past its deadline,
	// answering nothing).
	LeaseHeadroom time.Duration
	Commits       CommitStats // Txns, units and ops committed so far
	Drops         int64       // tables dropped: lost shards and commits of unknown outcome
	Rejoins       int64       // times the member joined again after etcd lost its lease
}

// Status reads the member's state; it takes each shard's mutex briefly.
func (o *Owner) Status() Status {
	st := Status{Shards: len(o.shards), LeaseHeadroom: o.current().lease.Deadline().Sub(o.clock.Now()),
		Commits: o.com.Stats(), Drops: o.drops.Load(), Rejoins: o.rejoins.Load()}
	for _, s := range o.shards {
		s.mu.Lock()
		switch {
		case s.term != 0 && s.tab != nil && !s.tab.Dead():
			st.Serving++
		case s.term != 0:
			st.Loading++
		}
		s.mu.Unlock()
	}
	return st
}
