package chaos_test

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/coordinatord/coordinatord/internal/chaos"
)

// fault is one randomized fault: do injects it and returns the undo.
type fault struct {
	name string
	do   func(e *chaos.Env, rng *mrand.Rand) (string, func() error)
}

var faults = []fault{
	{"kill-leader", func(e *chaos.Env, _ *mrand.Rand) (string, func() error) {
		l, err := e.Cluster.KillLeader()
		if err != nil {
			return err.Error(), func() error { return nil }
		}
		return fmt.Sprintf("killed leader m%d", l), func() error { return e.Cluster.RestartMember(l) }
	}},
	{"kill-follower", func(e *chaos.Env, _ *mrand.Rand) (string, func() error) {
		l, _ := e.Cluster.WaitLeader(10 * time.Second)
		f := (l + 1) % e.Cluster.Size()
		e.Cluster.KillMember(f)
		return fmt.Sprintf("killed follower m%d", f), func() error { return e.Cluster.RestartMember(f) }
	}},
	{"lose-quorum", func(e *chaos.Env, _ *mrand.Rand) (string, func() error) {
		k := e.Cluster.LoseQuorum()
		return fmt.Sprintf("lost quorum (killed %v)", k), e.Cluster.Recover
	}},
	{"restart-cluster", func(e *chaos.Env, _ *mrand.Rand) (string, func() error) {
		err := e.Cluster.RestartAll()
		return "restarted every member", func() error { return err }
	}},
	{"partition-replica", func(e *chaos.Env, rng *mrand.Rand) (string, func() error) {
		r := e.Replicas[rng.IntN(len(e.Replicas))]
		r.PartitionFromEtcd()
		return fmt.Sprintf("partitioned replica %d from etcd", r.ID), func() error { r.Heal(); return nil }
	}},
	{"delay-replica", func(e *chaos.Env, rng *mrand.Rand) (string, func() error) {
		r := e.Replicas[rng.IntN(len(e.Replicas))]
		d := time.Duration(50+rng.IntN(400)) * time.Millisecond
		r.DelayEtcd(d)
		return fmt.Sprintf("delayed replica %d's etcd traffic by %v", r.ID, d), func() error { r.Heal(); return nil }
	}},
	{"reset-replica", func(e *chaos.Env, rng *mrand.Rand) (string, func() error) {
		r := e.Replicas[rng.IntN(len(e.Replicas))]
		r.ResetEtcd()
		return fmt.Sprintf("reset replica %d's etcd connections", r.ID), func() error { return nil }
	}},
	{"crash-replica", func(e *chaos.Env, rng *mrand.Rand) (string, func() error) {
		r := e.Replicas[rng.IntN(len(e.Replicas))]
		r.Crash()
		return fmt.Sprintf("crashed replica %d", r.ID), r.Restart
	}},
}

// TestChaosRandomized runs CHAOS_RUNS randomized fault schedules (make
// chaos: 20), each seeded and printed; CHAOS_SEED=n replays one schedule.
// Each run's history must be linearizable (no unknown verdict), the
// register must see no violation, and at least one stale write must have
// been refused; counter hits run alongside, and their history must be
// linearizable against the counter model (counter_test.go). Skipped unless CHAOS_RUNS or CHAOS_SEED is set.
func TestChaosRandomized(t *testing.T) {
	runs, _ := strconv.Atoi(os.Getenv("CHAOS_RUNS"))
	base := uint64(time.Now().UnixNano() % 1_000_000)
	if s := os.Getenv("CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: %v", s, err)
		}
		base, runs = v, 1
	}
	if runs == 0 {
		t.Skip("set CHAOS_RUNS (make chaos) or CHAOS_SEED to run randomized fault schedules")
	}
	d := 15 * time.Second
	if s := os.Getenv("CHAOS_DURATION"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			t.Fatal(err)
		}
	}
	var ops, amb, grants, writes, stale, faultsRun, counterOps, ran int
	var failed []uint64 // the seeds of the runs that failed (the first stops the series)
	for i := range runs {
		seed := base + uint64(i)
		ran++
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Logf("replay with: CHAOS_SEED=%d make chaos", seed)
			rng := mrand.New(mrand.NewPCG(seed, 0x5eed))
			e := newEnv(t, 2)
			counters := startCounterLoad(t, e)
			res := run{d: d, names: []string{"a", "b", "c"}, perName: 3, pauseOneIn: 4, wantStale: true, seed: seed}.exec(t, e, func(ctx context.Context, _ *chaos.Workload) {
				for pause(ctx, time.Duration(500+rng.IntN(1500))*time.Millisecond) {
					f := faults[rng.IntN(len(faults))]
					what, undo := f.do(e, rng)
					faultsRun++
					t.Logf("%s", what)
					pause(ctx, time.Duration(1000+rng.IntN(3000))*time.Millisecond)
					if err := undo(); err != nil {
						t.Fatalf("undo %s: %v", f.name, err)
					}
				}
			})
			hits := counters.stopAndCheck(t)
			ops += res.verdict.Ops
			counterOps += hits.Ops
			amb += res.verdict.Ambiguous
			grants += res.verdict.Grants
			writes += res.reg.Writes
			stale += res.reg.StaleRejected
		})
		if !ok {
			failed = append(failed, seed)
			break
		}
	}
	// The counts are of the runs that passed; a failed run's own log says
	// what it violated (issue 26, item 12: this line printed "violations:
	// 0" after a failure).
	t.Logf("chaos: %d runs (seeds %d..%d), %d faults, %d ops checked (%d ambiguous, %d grants), %d register writes, %d stale writes refused, %d counter hits checked, failed runs: %d %v",
		ran, base, base+uint64(ran)-1, faultsRun, ops, amb, grants, writes, stale, counterOps, len(failed), failed)
}
