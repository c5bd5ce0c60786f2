package daemon_test

import (
	"testing"
	"time"

	"github.com/coordinatord/coordinatord/internal/daemon"
)

// A daemon on the shard core (-core shard) serves every shard of its
// embedded etcd itself and exports that: shards, shards serving, a
// positive lease headroom, and the commit and drop counters.
func TestShardCoreMetrics(t *testing.T) {
	r := run(t, daemon.Config{MetricsListen: "127.0.0.1:0", Core: daemon.CoreShard, ShardLeaseTTL: 2 * time.Second})
	var m map[string]map[string]float64
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		m = scrape(t, "http://"+r.metrics)
		if m["coordinatord_shards_serving"][""] == 256 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("coordinatord_shards_serving = %v after 15s, want 256", m["coordinatord_shards_serving"])
		}
	}
	if got := m["coordinatord_shards"][""]; got != 256 {
		t.Fatalf("coordinatord_shards = %v, want 256", got)
	}
	if h := m["coordinatord_shard_lease_headroom_seconds"][""]; h <= 0 || h > 2 {
		t.Fatalf("coordinatord_shard_lease_headroom_seconds = %v, want in (0, 2]", h)
	}
	for _, name := range []string{"coordinatord_shard_commits_total", "coordinatord_shard_commit_units_total", "coordinatord_shard_table_drops_total", "coordinatord_shard_member_rejoins_total", "coordinatord_shards_loading"} {
		if _, ok := m[name][""]; !ok {
			t.Errorf("%s is not exported", name)
		}
	}
}
