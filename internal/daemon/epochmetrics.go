package daemon

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/coordinatord/coordinatord/internal/epoch"
)

// The token epoch (internal/epoch), read from the keeper at scrape time:
//
//	coordinatord_token_epoch               the epoch this replica makes and judges tokens with (0 until etcd's first restore)
//	coordinatord_token_epoch_paused        1 while the keeper grants and validates nothing (UNAVAILABLE, reason EPOCH_PAUSED), else 0
//	coordinatord_token_epoch_raises_total  epochs this replica raised itself, having found a restore (State.Bumps)
//	coordinatord_token_revision_headroom   revisions etcd can make before tokens run out: 2^48 - 1 minus the greatest revision seen (State.Headroom)
//
// No labels: the pause's reason is free text, and shows in /readyz, in the
// log and in coordctl epoch instead. A restore is raised by one replica
// (the others adopt the epoch): sum the raises over replicas, and take the
// max of the epoch.
var (
	tokenEpochDesc = prometheus.NewDesc("coordinatord_token_epoch",
		"The token epoch this replica grants and validates in (tokens are epoch * 2^48 + revision; 0 until etcd is first restored from a backup).", nil, nil)
	tokenEpochPausedDesc = prometheus.NewDesc("coordinatord_token_epoch_paused",
		"1 while this replica grants and validates nothing (UNAVAILABLE, reason EPOCH_PAUSED): etcd's history could not be checked, or a restore is being handled; else 0.", nil, nil)
	tokenEpochRaisesDesc = prometheus.NewDesc("coordinatord_token_epoch_raises_total",
		"Token epochs this replica raised itself, each after finding that etcd was restored from a backup (one replica raises, the others adopt: sum over replicas).", nil, nil)
	tokenRevisionHeadroomDesc = prometheus.NewDesc("coordinatord_token_revision_headroom",
		"Revisions etcd can still make before fencing tokens run out: 2^48 - 1 minus the greatest etcd revision this replica has seen. At 0 the replica grants and validates nothing (FAILED_PRECONDITION, reason TOKENS_EXHAUSTED); only a restore's --bump-revision brings it near.", nil, nil)
)

// epochCollector exports the keeper's State at every scrape; it owns no
// goroutine.
type epochCollector struct{ status func() epoch.State }

func (epochCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- tokenEpochDesc
	ch <- tokenEpochPausedDesc
	ch <- tokenEpochRaisesDesc
	ch <- tokenRevisionHeadroomDesc
}

func (c epochCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.status()
	paused := 0.0
	if st.Paused != "" {
		paused = 1
	}
	ch <- prometheus.MustNewConstMetric(tokenEpochDesc, prometheus.GaugeValue, float64(st.Epoch))
	ch <- prometheus.MustNewConstMetric(tokenEpochPausedDesc, prometheus.GaugeValue, paused)
	ch <- prometheus.MustNewConstMetric(tokenEpochRaisesDesc, prometheus.CounterValue, float64(st.Bumps))
	ch <- prometheus.MustNewConstMetric(tokenRevisionHeadroomDesc, prometheus.GaugeValue, float64(st.Headroom))
}
