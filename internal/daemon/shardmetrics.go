package daemon

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/coordinatord/coordinatord/internal/shard"
)

// The shard-owner core (-core shard), read from the Owner at scrape time:
//
//	coordinatord_shards                          the cluster's shard count
//	coordinatord_shards_serving                  shards this replica owns and answers for
//	coordinatord_shards_loading                  shards it owns whose state is being loaded (a takeover)
//	coordinatord_shard_lease_headroom_seconds    how long it may answer without another acknowledged renewal (< 0: answering nothing)
//	coordinatord_shard_commits_total             etcd Txns of the group committer
//	coordinatord_shard_commit_units_total        units they carried (units / commits: the batching)
//	coordinatord_shard_table_drops_total         tables dropped: shards lost, commits of unknown outcome
//	coordinatord_shard_member_rejoins_total      times the replica joined again after etcd lost its lease (cut off past its TTL)
//
// Sum serving over the replicas: it equals coordinatord_shards when every
// shard is served. A headroom that keeps falling towards 0 means etcd is
// slow to acknowledge renewals: the replica is about to stop answering.
//
// The lock census, coordinatord_locks_held and coordinatord_lock_waiters,
// is the queue core's two gauges (server.Metrics.CountLocks) with the
// shard core's meaning: the locks of the shards this replica serves, read
// from its tables (shard.Owner.Census), so sum them over the replicas,
// where the queue core's are the cluster's on every replica (max). Like
// the queue core's, they leave the scrape when the replica cannot vouch
// for them: its lease deadline passed (cut off from etcd).
var (
	shardsDesc        = prometheus.NewDesc("coordinatord_shards", "The cluster's shard count (fixed at the first start).", nil, nil)
	shardsServingDesc = prometheus.NewDesc("coordinatord_shards_serving", "Shards this replica owns and answers for now.", nil, nil)
	shardsLoadingDesc = prometheus.NewDesc("coordinatord_shards_loading", "Shards this replica owns whose state is being loaded from etcd (after a takeover or a failed commit).", nil, nil)
	shardHeadroomDesc = prometheus.NewDesc("coordinatord_shard_lease_headroom_seconds",
		"How long this replica may still answer from memory without another lease renewal acknowledged by etcd; below 0 it answers nothing (SHARD_NOT_SERVED).", nil, nil)
	shardCommitsDesc = prometheus.NewDesc("coordinatord_shard_commits_total", "etcd transactions of the shard core's group committer.", nil, nil)
	shardUnitsDesc   = prometheus.NewDesc("coordinatord_shard_commit_units_total", "Units (one shard's decisions) committed; divided by coordinatord_shard_commits_total: the batching.", nil, nil)
	shardDropsDesc   = prometheus.NewDesc("coordinatord_shard_table_drops_total", "Shard tables dropped: a shard lost, or a commit whose outcome is unknown (the table reloads from etcd).", nil, nil)
	shardRejoinsDesc = prometheus.NewDesc("coordinatord_shard_member_rejoins_total", "Times this replica joined again with a new lease after etcd lost its lease (it was cut off from etcd past its TTL).", nil, nil)

	shardHeldDesc = prometheus.NewDesc("coordinatord_locks_held",
		"Locks that have a holder, in the shards this replica serves (shard core: sum() over the replicas).", nil, nil)
	shardWaitersDesc = prometheus.NewDesc("coordinatord_lock_waiters",
		"Contenders waiting in lock queues, in the shards this replica serves (shard core: sum() over the replicas).", nil, nil)
)

// shardCollector exports the Owner's Status at every scrape; it owns no
// goroutine.
type shardCollector struct{ status func() shard.Status }

func (shardCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{shardsDesc, shardsServingDesc, shardsLoadingDesc, shardHeadroomDesc, shardCommitsDesc, shardUnitsDesc, shardDropsDesc, shardRejoinsDesc} {
		ch <- d
	}
}

func (c shardCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.status()
	ch <- prometheus.MustNewConstMetric(shardsDesc, prometheus.GaugeValue, float64(st.Shards))
	ch <- prometheus.MustNewConstMetric(shardsServingDesc, prometheus.GaugeValue, float64(st.Serving))
	ch <- prometheus.MustNewConstMetric(shardsLoadingDesc, prometheus.GaugeValue, float64(st.Loading))
	ch <- prometheus.MustNewConstMetric(shardHeadroomDesc, prometheus.GaugeValue, st.LeaseHeadroom.Seconds())
	ch <- prometheus.MustNewConstMetric(shardCommitsDesc, prometheus.CounterValue, float64(st.Commits.Txns))
	ch <- prometheus.MustNewConstMetric(shardUnitsDesc, prometheus.CounterValue, float64(st.Commits.Units))
	ch <- prometheus.MustNewConstMetric(shardDropsDesc, prometheus.CounterValue, float64(st.Drops))
	ch <- prometheus.MustNewConstMetric(shardRejoinsDesc, prometheus.CounterValue, float64(st.Rejoins))
}

// shardCensus exports the Owner's Census at every scrape, or nothing while
// the census fails (the lease deadline passed); it owns no goroutine.
type shardCensus struct{ census func() (shard.Census, error) }

func (shardCensus) Describe(ch chan<- *prometheus.Desc) { ch <- shardHeldDesc; ch <- shardWaitersDesc }

func (c shardCensus) Collect(ch chan<- prometheus.Metric) {
	n, err := c.census()
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(shardHeldDesc, prometheus.GaugeValue, float64(n.Held))
	ch <- prometheus.MustNewConstMetric(shardWaitersDesc, prometheus.GaugeValue, float64(n.Waiting))
}
