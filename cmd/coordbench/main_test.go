package main

import (
	"encoding/xml"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The smoke test re-executes this test binary as the etcd and
	// coordinatord children, as coordbench does with itself.
	if len(os.Args) > 1 && strings.HasPrefix(os.Args[1], "child-") {
		os.Exit(runChild(os.Args[1], os.Args[2:]))
	}
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/logutil.(*MergeLogger).outputLoop"),
	)
}

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 100; i++ {
		s = append(s, time.Duration(i))
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, 50}, {99, 99}, {100, 100}, {1, 1}, {0.1, 1}} {
		if got := percentile(s, tc.p); got != tc.want {
			t.Errorf("percentile(1..100, %v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("percentile(nil) = %v", got)
	}
	if got := percentile([]time.Duration{7}, 99); got != 7 {
		t.Errorf("percentile([7], 99) = %v", got)
	}
}

func TestSpread(t *testing.T) {
	if got := spreadOf([]float64{3, 1, 2}); got != (spread{med: 2, lo: 1, hi: 3}) {
		t.Errorf("odd: %+v", got)
	}
	if got := spreadOf([]float64{4, 1, 2, 3}); got != (spread{med: 2.5, lo: 1, hi: 4}) {
		t.Errorf("even: %+v", got)
	}
	if got := thousands(1234567); got != "1,234,567" {
		t.Errorf("thousands = %q", got)
	}
}

func TestParse(t *testing.T) {
	c, err := parse([]string{"-quick", "-reps", "3"})
	if err != nil {
		t.Fatal(err)
	}
	if c.reps != 3 || c.duration != time.Second || len(c.held) != 2 || len(c.scenarios) != 8 || c.failoverReps != 1 {
		t.Fatalf("quick with explicit reps: %+v", c)
	}
	for _, bad := range [][]string{{"-reps", "0"}, {"-clients", "1,x"}, {"-scenarios", "nope"}, {"-duration", "1ms"}, {"extra"}, {"-counters", "0"}, {"-counter-clients", "0"}} {
		if _, err := parse(bad); err == nil {
			t.Errorf("parse(%q) accepted", bad)
		}
	}
}

// TestSmoke runs every scenario of the real benchmark, tiny, against real
// etcd and coordinatord child processes, and checks the report and chart.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and coordinatord processes")
	}
	dir := t.TempDir()
	cfg, err := parse([]string{"-reps", "1", "-duration", "500ms", "-warmup", "200ms", "-clients", "1,3", "-contended", "3",
		"-held", "5,40", "-counters", "1,10", "-counter-clients", "3", "-conns", "2", "-out", filepath.Join(dir, "r.md"), "-svg", filepath.Join(dir, "c.svg"),
		"-data-dir", filepath.Join(dir, "etcd"), "-profile-dir", filepath.Join(dir, "prof")})
	if err != nil {
		t.Fatal(err)
	}
	cfg.clients = append(cfg.clients, 64) // the profiled cells
	stdout := os.Stdout
	null, _ := os.Open(os.DevNull)
	os.Stdout = null
	rep, err := bench1(cfg)
	os.Stdout = stdout
	null.Close()
	if err != nil {
		t.Fatal(err)
	}
	cells := map[cell]bool{}
	ops := map[[2]string]int{} // scenario, system -> operations over all cells
	for _, r := range rep.results {
		cells[r.cell] = true
		// Under the race detector, with every process on one CPU, the
		// etcd-bound cells may time out (coordinatord pauses granting when
		// its epoch check of etcd misses its deadline): a liveness matter.
		starved := raceEnabled && r.scenario == scEtcdBound
		if (r.errs > 0 && !starved) || r.violations > 0 {
			t.Errorf("%+v: %d errors, %d exclusion violations", r.cell, r.errs, r.violations)
		}
		ops[[2]string{r.scenario, r.system}] += r.ops
		if usesEtcd(r.system) && !r.work.known && !starved {
			t.Errorf("%+v: etcd's work unknown", r.cell)
		}
		if (r.scenario == scUncontended || r.scenario == scContended) && r.ops > 0 && (r.work.proposals < 1 || r.work.fsyncs < 1) {
			t.Errorf("%+v: %d operations took %v raft proposals and %v WAL fsyncs", r.cell, r.ops, r.work.proposals, r.work.fsyncs)
		}
		// A liveness bound: only without the race detector, whose
		// slowdown (on a busy machine) can leave a short window empty.
		if r.ops == 0 && !raceEnabled {
			t.Errorf("%+v: no operation completed in the window", r.cell)
		}
	}
	for _, k := range [][2]string{{scUncontended, sysCoord}, {scUncontended, sysMutex}, {scUncontended, sysV3lock},
		{scContended, sysCoord}, {scContended, sysMutex}, {scContended, sysV3lock}, {scUncontended, sysSem4}, {scContended, sysSem4},
		{scValidate, sysCoord}, {scValidate, sysGet}, {scValidate, sysFloor}, {scHeld, sysCoord}, {scHeld, sysMutex},
		{scCounter, sysCoord}, {scCounter, sysNaiveTxn},
		{scEtcdBound, sysCoord}, {scEtcdBound, sysCoord2}, {scEtcdBound, sysMutex}, {scEtcdBound, sysV3lock}} {
		if ops[k] == 0 && (!raceEnabled || k[0] != scEtcdBound) {
			t.Errorf("%s, %s: no operation completed in any cell", k[0], k[1])
		}
	}
	// 3 client counts x (4 lock systems + 3 validate systems), 1 contended
	// count x 4, 2 held levels x 2, 2 counter levels x (coordinatord, the
	// naive Txn and, when redis-server is installed, Redis twice).
	counterSystems := 2
	if _, err := exec.LookPath("redis-server"); err == nil {
		counterSystems = 4
		if ops[[2]string{scCounter, sysRedisAlways}] == 0 || ops[[2]string{scCounter, sysRedisNo}] == 0 {
			t.Error("counter, Redis: no operation completed in any cell")
		}
	}
	// And the etcd-bound scenario's 4 systems, with the most clients.
	if want := 3*7 + 4 + 2*2 + 2*counterSystems + 4; len(cells) != want {
		t.Errorf("%d cells measured, want %d", len(cells), want)
	}
	md, err := os.ReadFile(cfg.out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"### Targets", "single-client acquire p50", "40 held locks", "| contended, 3 clients, one name | hand-offs/s |", "etcd linearizable Get",
		"### Counters", "| 10 | etcd naive Txn per hit |", "### etcd work per operation", "### Operations per etcd CPU-second, coordinatord / peer",
		"| contended | 3 | 0 | etcd Mutex |", "etcd-bound, 64 clients: coordinatord >= 1.5x the Mutex's locks/s", "2 coordinatord replicas vs 1: locks/s"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	svg, err := os.ReadFile(cfg.svg)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(svg), "<rect"); n < 10 {
		t.Errorf("chart has %d rects", n)
	}
	dec := xml.NewDecoder(strings.NewReader(string(svg)))
	for {
		if _, err := dec.Token(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("chart is not well-formed XML: %v", err)
			}
			break
		}
	}
	for _, f := range []string{"coordinatord-uncontended-64.pprof", "etcd-validate-64.pprof"} {
		if st, err := os.Stat(filepath.Join(cfg.profileDir, f)); err != nil || st.Size() == 0 {
			t.Errorf("profile %s: %v", f, err)
		}
	}
}

// TestSmokeShard runs the shard core's replicas and failover scenarios,
// tiny: 1 and 2 replicas forwarding to each other, then a rolling restart
// of 3 members and a kill -9 of one, and checks the report.
func TestSmokeShard(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and coordinatord processes")
	}
	dir := t.TempDir()
	cfg, err := parse([]string{"-core", "shard", "-scenarios", "replicas,failover", "-reps", "1", "-duration", "500ms", "-warmup", "200ms",
		"-clients", "8", "-replicas", "1,2", "-failover-reps", "1", "-shard-lease-ttl", "2s", "-conns", "2",
		"-out", filepath.Join(dir, "r.md"), "-svg", "", "-data-dir", filepath.Join(dir, "etcd")})
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	null, _ := os.Open(os.DevNull)
	os.Stdout = null
	rep, err := bench1(cfg)
	os.Stdout = stdout
	null.Close()
	if err != nil {
		t.Fatal(err)
	}
	systems := map[string]bool{}
	for _, r := range rep.results {
		systems[r.system] = true
		if r.scenario != scReplicas || r.errs > 0 || !r.work.known {
			t.Errorf("%+v: %d errors, etcd work known %v", r.cell, r.errs, r.work.known)
		}
		if r.ops == 0 && !raceEnabled {
			t.Errorf("%+v: no operation completed in the window", r.cell)
		}
	}
	if !systems[sysReplicas(1)] || !systems[sysReplicas(2)] || len(systems) != 2 {
		t.Errorf("replicas cells measured: %v", systems)
	}
	if len(rep.failovers) != 1 {
		t.Fatalf("%d failover repetitions, want 1", len(rep.failovers))
	}
	f := rep.failovers[0]
	if f.shards == 0 || len(f.served) != f.shards {
		t.Errorf("the killed member owned %d shards, %d probed", f.shards, len(f.served))
	}
	// A liveness bound (the probe's limit is the TTL + 30 s), without the
	// race detector only.
	if _, ok := f.servedAll(); !ok && !raceEnabled {
		t.Errorf("the killed member's shards did not all serve again: %v", f.served)
	}
	md, err := os.ReadFile(cfg.out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"### Failover (shard core, 3 members)", "after kill -9 of an owner, its shards serve again within its lease TTL + 2 s (4s)",
		"rolling restart of 3 replicas under load: no failed call", "rolling restart of 3 replicas under load: longest pause <= 300 ms",
		"etcd CPU per operation with 1 and 2 replicas within 1.2x of each other", "| replicas | 8 | 0 | coordinatord, 2 replicas |",
		"2 replicas vs 1: acquire+release cycles/s"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}
