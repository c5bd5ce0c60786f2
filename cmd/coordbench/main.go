// Command coordbench measures coordinatord side by side with etcd's own
// locks (concurrency.Mutex and the v3lock service) on the same etcd, in the
// same run, and writes a markdown table and an SVG chart.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) > 1 && strings.HasPrefix(os.Args[1], "child-") {
		os.Exit(runChild(os.Args[1], os.Args[2:]))
	}
	os.Exit(run(os.Args[1:]))
}

type config struct {
	duration, warmup time.Duration
	reps             int
	clients          []int // uncontended and validate
	contended        []int
	held             []int
	counters         []int // counter: distinct counters of each cell
	counterClients   int   // counter: workers
	conns            int
	scenarios        []string
	out, svg         string
	profileDir       string
	dataDir          string
	quick            bool
	peerOnly         bool
	whatif           bool
	core             string        // the coordinatord child's -core
	replicas         []int         // replicas: replica counts of the cell (the first is the baseline)
	failoverReps     int           // failover: repetitions (each kills an owner and restarts every member)
	shardTTL         time.Duration // shard core: the members' lease TTL
	args             []string
}

func (c config) has(sc string) bool { return slices.Contains(c.scenarios, sc) }

// withDataDir gives c a new temporary etcd data directory if -data-dir was
// not set; cleanup removes it (and leaves one given by -data-dir alone).
func (c *config) withDataDir() (cleanup func(), err error) {
	if c.dataDir != "" {
		return func() {}, nil
	}
	d, err := os.MkdirTemp("", "coordbench-etcd")
	if err != nil {
		return nil, err
	}
	c.dataDir = d
	return func() { os.RemoveAll(d) }, nil
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func parse(args []string) (config, error) {
	fs := flag.NewFlagSet("coordbench", flag.ContinueOnError)
	var (
		c                                      config
		clients, contended, held, scenarioList string
		counters, replicas                     string
	)
	fs.BoolVar(&c.quick, "quick", false, "a quick run (about 2 minutes): -reps 2 -duration 1s -warmup 300ms -held 100,10000, unless given explicitly")
	fs.BoolVar(&c.peerOnly, "peer-only", false, "measure only etcd's Mutex (uncontended -clients, contended -contended): a minimal program on a plain etcd of its own beside coordbench's Mutex peer on the etcd child every scenario runs on, and on coordinatord's embedded etcd configuration (docs/BENCHMARKS.md, Peer fairness)")
	fs.DurationVar(&c.duration, "duration", 4*time.Second, "measured window of each repetition of each cell")
	fs.DurationVar(&c.warmup, "warmup", time.Second, "warm-up before each measured window (same workers, not counted)")
	fs.IntVar(&c.reps, "reps", 5, "repetitions of each cell, interleaved across the systems")
	fs.StringVar(&clients, "clients", "1,16,64", "client counts of the uncontended and validate scenarios")
	fs.StringVar(&contended, "contended", "16,64", "client counts of the one-name scenario")
	fs.StringVar(&held, "held", "100,10000,100000", "numbers of held locks of the held-lock scenario (the first is the baseline)")
	fs.StringVar(&counters, "counters", "1,1000", "numbers of distinct counters of the counter scenario (1: one hot counter)")
	fs.IntVar(&c.counterClients, "counter-clients", 64, "workers of the counter scenario")
	fs.IntVar(&c.conns, "conns", 4, "gRPC connections to coordinatord and etcd clients, shared round-robin by the workers")
	fs.StringVar(&scenarioList, "scenarios", "uncontended,contended,validate,etcdbound,held,counter,replicas,failover", "scenarios to run (etcdbound: etcd pinned to one CPU, the rest to another; the most -clients; replicas and failover: -core shard only)")
	fs.StringVar(&replicas, "replicas", "1,3,8", "replicas scenario (-core shard): numbers of member replicas on the one etcd, the most -clients spread over them (the first is the baseline)")
	fs.IntVar(&c.failoverReps, "failover-reps", 3, "failover scenario (-core shard): repetitions, each a rolling restart of 3 members and a kill -9 of one")
	fs.DurationVar(&c.shardTTL, "shard-lease-ttl", 5*time.Second, "-core shard: the members' lease TTL (the daemon's default); a killed owner's shards should serve again within it + 2s")
	fs.StringVar(&c.out, "out", "docs/benchmarks/results.md", "markdown report (also printed to stdout); empty: stdout only")
	fs.StringVar(&c.svg, "svg", "docs/benchmarks/chart.svg", "SVG chart; empty: none")
	fs.StringVar(&c.profileDir, "profile-dir", "", "if set, CPU profiles of coordinatord and etcd during the first repetition of each uncontended cell (coordinatord and Mutex), contended and validate cell (coordinatord) are written here")
	fs.BoolVar(&c.whatif, "whatif", false, "also run three what-if systems in the uncontended scenario: coordinatord's etcd recipe done directly by the client (today's; with a reused lease and delete-on-release; and that with group commit)")
	fs.StringVar(&c.dataDir, "data-dir", "", "etcd data directory (default: a new temporary directory, removed at the end)")
	fs.StringVar(&c.core, "core", "queue", "coordinatord's lock core: queue or shard (the shard-owner core; in etcdbound its two replicas split the shards and forward to each other)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.core != "queue" && c.core != "shard" {
		return c, fmt.Errorf("-core %q: must be queue or shard", c.core)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if c.quick {
		if !set["reps"] {
			c.reps = 2
		}
		if !set["duration"] {
			c.duration = time.Second
		}
		if !set["warmup"] {
			c.warmup = 300 * time.Millisecond
		}
		if !set["held"] {
			held = "100,10000"
		}
		if !set["failover-reps"] {
			c.failoverReps = 1
		}
	}
	var err error
	if c.clients, err = ints(clients); err != nil {
		return c, fmt.Errorf("-clients: %w", err)
	}
	if c.contended, err = ints(contended); err != nil {
		return c, fmt.Errorf("-contended: %w", err)
	}
	if c.held, err = ints(held); err != nil {
		return c, fmt.Errorf("-held: %w", err)
	}
	if c.counters, err = ints(counters); err != nil {
		return c, fmt.Errorf("-counters: %w", err)
	}
	if c.replicas, err = ints(replicas); err != nil {
		return c, fmt.Errorf("-replicas: %w", err)
	}
	for _, s := range strings.Split(scenarioList, ",") {
		switch s = strings.TrimSpace(s); s {
		case scUncontended, scContended, scValidate, scEtcdBound, scHeld, scCounter, scReplicas, scFailover:
			c.scenarios = append(c.scenarios, s)
		case "":
		default:
			return c, fmt.Errorf("-scenarios: unknown scenario %q", s)
		}
	}
	switch {
	case c.reps < 1:
		return c, fmt.Errorf("-reps %d: must be at least 1", c.reps)
	case c.duration < 100*time.Millisecond:
		return c, fmt.Errorf("-duration %v: must be at least 100ms", c.duration)
	case c.warmup < 0:
		return c, fmt.Errorf("-warmup %v: must not be negative", c.warmup)
	case c.conns < 1:
		return c, fmt.Errorf("-conns %d: must be at least 1", c.conns)
	case c.counterClients < 1:
		return c, fmt.Errorf("-counter-clients %d: must be at least 1", c.counterClients)
	case c.failoverReps < 1:
		return c, fmt.Errorf("-failover-reps %d: must be at least 1", c.failoverReps)
	case c.shardTTL < time.Second || c.shardTTL%time.Second != 0:
		return c, fmt.Errorf("-shard-lease-ttl %v: must be whole seconds, at least 1s (etcd leases are whole seconds)", c.shardTTL)
	case len(c.replicas) == 0 && slices.Contains(c.scenarios, scReplicas):
		return c, errors.New("-replicas: give at least one replica count")
	}
	c.args = args
	return c, nil
}

func run(args []string) int {
	cfg, err := parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordbench:", err)
		return 2
	}
	do := bench1
	if cfg.peerOnly {
		do = peerOnly
	}
	if _, err := do(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "coordbench:", err)
		return 1
	}
	return 0
}

// newBench starts an etcd child of role with its data in dir, a
// coordinatord child on it and the load generator's clients; close stops
// them all.
func newBench(cfg config, role, dir string) (b *bench, stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, f := range slices.Backward(stops) {
			f()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	etcd, err := startChild(role, "-data-dir", dir)
	if err != nil {
		return nil, nil, err
	}
	stops = append(stops, func() { stopLogged(role, etcd) })
	var secret string
	if cfg.core == "shard" {
		// Beside the etcd data directory: the replicas' shared secret, as
		// every member of a daemon cluster is given one.
		secret = dir + ".member-secret"
		if err := writeMemberSecret(secret); err != nil {
			return nil, nil, err
		}
	}
	coord, err := startChild(roleCoordinator, coordArgs(cfg, etcd.addr, secret, "")...)
	if err != nil {
		return nil, nil, err
	}
	stops = append(stops, func() {
		c := coord
		if b != nil {
			c = b.coord // the failover scenario restarts it
		}
		stopLogged(roleCoordinator, c)
	})
	workers := slices.Max(slices.Concat(cfg.clients, cfg.contended, []int{1, cfg.counterClients}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	cl, err := dialClients(ctx, coord.addr, etcd.addr, cfg.conns, workers)
	cancel()
	if err != nil {
		return nil, nil, err
	}
	stops = append(stops, cl.close)
	return &bench{cfg: cfg, etcd: etcd, coord: coord, cl: cl, secret: secret, systems: map[string]locker{
		sysCoord: coordLocker{cl}, sysMutex: mutexLocker{cl}, sysV3lock: v3lockLocker{cl}, sysSem4: semLocker{cl},
		sysRecipeNow: recipeNowLocker{cl}, sysRecipeNext: recipeNextLocker{cl},
	}}, stop, nil
}

// bench1 runs the benchmark, writes the report and the chart, and returns
// the report.
func bench1(cfg config) (rep *report, err error) {
	start := time.Now()
	cleanup, err := cfg.withDataDir()
	if err != nil {
		return nil, err
	}
	defer cleanup()
	if cfg.profileDir != "" {
		if err := os.MkdirAll(cfg.profileDir, 0o755); err != nil {
			return nil, err
		}
	}
	b, closeBench, err := newBench(cfg, roleEtcd, filepath.Join(cfg.dataDir, "etcd"))
	if err != nil {
		return nil, err
	}
	defer closeBench()
	etcd, coord, cl := b.etcd, b.coord, b.cl
	if cfg.whatif {
		bt := newBatcher(cl.etcd[0], 2, 128)
		defer close(bt.stop)
		b.systems[sysRecipeBatch] = recipeBatchLocker{cl, bt}
	}
	if cfg.has(scCounter) {
		if b.redis, err = startRedis(redisDir(cfg.dataDir), cfg.counterClients); err != nil {
			return nil, fmt.Errorf("redis peer: %w", err)
		}
		if b.redis != nil {
			defer b.redis.stop()
		}
	}
	rep = &report{cfg: cfg, rss: map[int][2]int64{}, load: [2]string{loadAvg()}}
	rep.baseRSS[0], _ = rss(coord.pid())
	rep.baseRSS[1], _ = rss(etcd.pid())

	progress := func(r result) {
		p := r.work.per(r.ops)
		fmt.Fprintf(os.Stderr, "%-11s n=%-3d held=%-6d %-22s rep %d: %9.0f ops/s  p50 %8s  p99 %8s  cpu client %.2f coord %.2f etcd %.2f other %.2f  per op: %.2f proposals %.2f fsyncs %s etcd cpu  errs %d\n",
			r.scenario, r.clients, r.held, r.system, r.rep, r.rate, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond),
			r.clientCPU, r.coordCPU, r.etcdCPU, r.otherCPU, p.proposals, p.fsyncs, p.cpu.Round(time.Microsecond), r.errs)
		rep.results = append(rep.results, r)
		b.compact()
	}
	rotate := func(systems []string, rep int) []string {
		i := rep % len(systems)
		return slices.Concat(systems[i:], systems[:i])
	}
	lockSystems := []string{sysCoord, sysMutex, sysV3lock, sysSem4}

	uncontendedSystems := lockSystems
	if cfg.whatif {
		uncontendedSystems = append(slices.Clone(lockSystems), sysRecipeNow, sysRecipeNext, sysRecipeBatch)
	}
	if cfg.has(scUncontended) {
		for _, n := range cfg.clients {
			for r := range cfg.reps {
				for _, s := range rotate(uncontendedSystems, r) {
					prof := ""
					if cfg.profileDir != "" && r == 0 {
						switch s {
						case sysCoord:
							prof = fmt.Sprintf("uncontended-%d", n)
						case sysMutex:
							prof = fmt.Sprintf("uncontended-%d-mutex", n) // etcd's profile under the peer's load
						}
					}
					progress(b.uncontended(cell{scenario: scUncontended, clients: n, system: s}, r, prof))
				}
			}
		}
	}
	if cfg.has(scContended) {
		for _, n := range cfg.contended {
			for r := range cfg.reps {
				for _, s := range rotate(lockSystems, r) {
					prof := ""
					if cfg.profileDir != "" && s == sysCoord && r == 0 {
						prof = fmt.Sprintf("contended-%d", n)
					}
					progress(b.contended(cell{scenario: scContended, clients: n, system: s}, r, prof))
				}
			}
		}
	}
	if cfg.has(scValidate) {
		for _, n := range cfg.clients {
			for r := range cfg.reps {
				for _, s := range rotate([]string{sysCoord, sysGet, sysFloor}, r) {
					prof := ""
					if cfg.profileDir != "" && s == sysCoord && r == 0 {
						prof = fmt.Sprintf("validate-%d", n)
					}
					res, err := b.validate(cell{scenario: scValidate, clients: n, system: s}, r, prof)
					if err != nil {
						return nil, err
					}
					progress(res)
				}
			}
		}
	}
	if cfg.has(scEtcdBound) {
		if err := b.runEtcdBound(progress, rotate); err != nil {
			return nil, err
		}
	}
	if cfg.has(scHeld) {
		var hs []heldLock
		defer b.drain()
		for _, h := range cfg.held {
			t := time.Now()
			if hs, err = b.fill(hs, h); err != nil {
				return nil, err
			}
			fmt.Fprintf(os.Stderr, "held: %d locks held (filled in %v)\n", h, time.Since(t).Round(time.Millisecond))
			b.compact()
			time.Sleep(time.Second)
			cr, _ := rss(coord.pid())
			er, _ := rss(etcd.pid())
			rep.rss[h] = [2]int64{cr, er}
			for r := range cfg.reps {
				for _, s := range rotate([]string{sysCoord, sysMutex}, r) {
					progress(b.uncontended(cell{scenario: scHeld, clients: 1, held: h, system: s}, r, ""))
				}
			}
		}
	}
	if cfg.has(scCounter) {
		if err := b.runCounters(progress, rotate); err != nil {
			return nil, err
		}
	}
	if cfg.has(scReplicas) || cfg.has(scFailover) {
		if err := b.runShardScenarios(progress, rotate, rep); err != nil {
			return nil, err
		}
	}
	rep.notes, rep.skipped = b.notes, b.skipped
	rep.elapsed = time.Since(start)
	rep.load[1] = loadAvg()

	md := rep.markdown()
	fmt.Print(md)
	if cfg.out != "" {
		if err := os.MkdirAll(filepath.Dir(cfg.out), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(cfg.out, []byte(md), 0o644); err != nil {
			return nil, err
		}
	}
	if cfg.svg != "" {
		if err := os.MkdirAll(filepath.Dir(cfg.svg), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(cfg.svg, []byte(rep.chart()), 0o644); err != nil {
			return nil, err
		}
	}
	return rep, nil
}
