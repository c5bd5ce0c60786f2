package main

import (
	"bufio"
	"fmt"
	"html"
	"math"
	"os"
	"runtime"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/version"
)

// report turns the results of a run into the markdown table and the chart.
type report struct {
	cfg     config
	results []result
	baseRSS [2]int64         // coordinatord, etcd before the held-lock scenario
	rss     map[int][2]int64 // held locks -> coordinatord, etcd RSS
	elapsed time.Duration
	load    [2]string // load average at the start and the end
	notes   []string  // peers skipped, and why
	skipped []string  // scenarios skipped, and why

	failovers []failoverResult // the failover scenario's repetitions
}

// agg is the aggregate of a cell's repetitions.
type agg struct {
	n                     int
	rate, p50, p99        spread
	client, coord, etcd   spread
	other                 spread
	errs, violations, ops int
}

func (rp *report) agg(sc string, clients, held int, system string) (agg, bool) {
	var a agg
	var rate, p50, p99, cl, co, et, ot []float64
	for _, r := range rp.results {
		if r.scenario != sc || r.clients != clients || r.held != held || r.system != system {
			continue
		}
		a.n++
		rate = append(rate, r.rate)
		p50 = append(p50, float64(r.p50))
		p99 = append(p99, float64(r.p99))
		cl = append(cl, r.clientCPU)
		co = append(co, r.coordCPU)
		et = append(et, r.etcdCPU)
		ot = append(ot, r.otherCPU)
		a.errs += r.errs
		a.violations += r.violations
		a.ops += r.ops
	}
	a.rate, a.p50, a.p99 = spreadOf(rate), spreadOf(p50), spreadOf(p99)
	a.client, a.coord, a.etcd, a.other = spreadOf(cl), spreadOf(co), spreadOf(et), spreadOf(ot)
	return a, a.n > 0
}

func fmtRate(s spread) string {
	return fmt.Sprintf("%s (%s–%s)", thousands(s.med), thousands(s.lo), thousands(s.hi))
}

func thousands(x float64) string {
	s := fmt.Sprintf("%.0f", x)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func ms(ns float64) string {
	v := ns / 1e6
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func fmtLat(s spread) string {
	return fmt.Sprintf("%s ms (%s–%s)", ms(s.med), ms(s.lo), ms(s.hi))
}

// row is one line of the side-by-side table: coordinatord against a peer.
type row struct {
	scenario, metric string
	peer             string
	coord, other     string
	ratio            float64 // coordinatord / peer
	speedup          float64 // > 1: coordinatord is better
	label            string  // short label for the chart
}

func (rp *report) rows() []row {
	var rows []row
	cmp := func(sc string, clients, held int, peer, scenario, metric, label string, latency bool, pick func(agg) spread) {
		self := sysCoord
		if s, p, ok := strings.Cut(peer, " vs "); ok { // "<system> vs <peer>": a row about another system
			self, peer = s, p
		}
		a, ok1 := rp.agg(sc, clients, held, self)
		p, ok2 := rp.agg(sc, clients, held, peer)
		if !ok1 || !ok2 {
			return
		}
		x, y := pick(a), pick(p)
		r := row{scenario: scenario, metric: metric, peer: peer, label: label}
		if latency {
			r.coord, r.other = fmtLat(x), fmtLat(y)
		} else {
			r.coord, r.other = fmtRate(x), fmtRate(y)
		}
		if y.med > 0 {
			r.ratio = x.med / y.med
		}
		r.speedup = r.ratio
		if latency && x.med > 0 {
			r.speedup = y.med / x.med
		}
		rows = append(rows, r)
	}
	rate := func(a agg) spread { return a.rate }
	p50 := func(a agg) spread { return a.p50 }
	p99 := func(a agg) spread { return a.p99 }
	for _, n := range rp.cfg.clients {
		for _, peer := range []string{sysMutex, sysV3lock, sysRecipeNow, sysRecipeNext, sysRecipeBatch} {
			cmp(scUncontended, n, 0, peer, fmt.Sprintf("uncontended, %d clients, distinct names", n), "acquire+release cycles/s",
				fmt.Sprintf("uncontended %d: cycles/s vs %s", n, peer), false, rate)
		}
		for _, peer := range []string{sysMutex, sysV3lock, sysRecipeNow, sysRecipeNext, sysRecipeBatch} {
			cmp(scUncontended, n, 0, peer, fmt.Sprintf("uncontended, %d clients, distinct names", n), "acquire latency p50",
				fmt.Sprintf("uncontended %d: acquire p50 vs %s", n, peer), true, p50)
		}
	}
	for _, n := range rp.cfg.clients {
		sc := fmt.Sprintf("uncontended, %d clients, distinct names", n)
		cmp(scUncontended, n, 0, sysSem4+" vs "+sysCoord, sc, "semaphore (N=4) vs mutex: acquire+release cycles/s",
			fmt.Sprintf("uncontended %d: semaphore cycles/s vs mutex", n), false, rate)
	}
	for _, n := range rp.cfg.contended {
		sc := fmt.Sprintf("contended, %d clients, one name", n)
		cmp(scContended, n, 0, sysSem4+" vs "+sysCoord, sc, "semaphore (N=4, up to 4 hold) vs mutex: grants/s",
			fmt.Sprintf("contended %d: semaphore grants/s vs mutex", n), false, rate)
		for _, peer := range []string{sysMutex, sysV3lock} {
			sc := fmt.Sprintf("contended, %d clients, one name", n)
			cmp(scContended, n, 0, peer, sc, "hand-offs/s", fmt.Sprintf("contended %d: hand-offs/s vs %s", n, peer), false, rate)
			cmp(scContended, n, 0, peer, sc, "wait p50 (release to next grant)", fmt.Sprintf("contended %d: wait p50 vs %s", n, peer), true, p50)
			cmp(scContended, n, 0, peer, sc, "wait p99", fmt.Sprintf("contended %d: wait p99 vs %s", n, peer), true, p99)
		}
	}
	for _, n := range rp.cfg.clients {
		sc := fmt.Sprintf("ValidateToken, %d clients", n)
		cmp(scValidate, n, 0, sysGet, sc, "validations/s", fmt.Sprintf("validate %d: ops/s vs Get", n), false, rate)
		cmp(scValidate, n, 0, sysGet, sc, "latency p50", fmt.Sprintf("validate %d: p50 vs Get", n), true, p50)
		cmp(scValidate, n, 0, sysFloor+" vs "+sysGet, sc, "calls/s of a no-op coordinatord RPC (health Check): the ceiling of any RPC",
			fmt.Sprintf("no-op RPC %d: calls/s vs Get", n), false, rate)
	}
	for _, h := range rp.cfg.held {
		sc := fmt.Sprintf("%s locks held, 1 client", thousands(float64(h)))
		cmp(scHeld, 1, h, sysMutex, sc, "acquire latency p50", fmt.Sprintf("%s held: acquire p50 vs Mutex", thousands(float64(h))), true, p50)
	}
	rp.etcdBoundRows(cmp)
	rp.replicaRows(cmp)
	return rows
}

// target is one of the goals, evaluated on this run.
type target struct {
	goal     string
	measured string
	met      bool
	known    bool
	speedup  float64 // measured, as "higher is better" for the chart
	need     float64 // the speed-up the goal requires
}

func (rp *report) targets() []target {
	var ts []target
	ratio := func(sc string, clients, held int, peer string, pick func(agg) float64) (float64, float64, float64, bool) {
		a, ok1 := rp.agg(sc, clients, held, sysCoord)
		p, ok2 := rp.agg(sc, clients, held, peer)
		if !ok1 || !ok2 || pick(p) == 0 {
			return 0, 0, 0, false
		}
		return pick(a) / pick(p), pick(a), pick(p), true
	}
	rate := func(a agg) float64 { return a.rate.med }
	p50 := func(a agg) float64 { return a.p50.med }

	if r, _, _, ok := ratio(scContended, 16, 0, sysMutex, rate); ok {
		ts = append(ts, target{goal: "contended hand-off, 16 clients on one name: >= 6x the Mutex rate",
			measured: fmt.Sprintf("%.2fx", r), met: r >= 6, known: true, speedup: r, need: 6})
	}
	if a, ok := rp.agg(scContended, 16, 0, sysCoord); ok {
		ts = append(ts, target{goal: "contended, 16 clients: next-holder wait p50 <= 2 ms",
			measured: ms(a.p50.med) + " ms", met: a.p50.med <= 2e6, known: true})
	}
	if r, _, _, ok := ratio(scUncontended, 64, 0, sysMutex, rate); ok {
		ts = append(ts, target{goal: "uncontended cycles, 64 clients: >= 1.5x the Mutex rate",
			measured: fmt.Sprintf("%.2fx", r), met: r >= 1.5, known: true, speedup: r, need: 1.5})
	}
	if r, _, _, ok := ratio(scValidate, 64, 0, sysGet, rate); ok {
		m := fmt.Sprintf("%.2fx", r)
		if f, ok1 := rp.agg(scValidate, 64, 0, sysFloor); ok1 {
			if g, ok2 := rp.agg(scValidate, 64, 0, sysGet); ok2 && g.rate.med > 0 {
				m += fmt.Sprintf(" (ceiling: a no-op coordinatord RPC reaches %.2fx)", f.rate.med/g.rate.med)
			}
		}
		ts = append(ts, target{goal: "ValidateToken, 64 clients: >= 3x the linearizable Get rate",
			measured: m, met: r >= 3, known: true, speedup: r, need: 3})
	}
	if r, a, p, ok := ratio(scUncontended, 1, 0, sysMutex, p50); ok {
		ts = append(ts, target{goal: "single-client acquire p50 <= 1.2x the Mutex p50",
			measured: fmt.Sprintf("%.2fx (%s ms vs %s ms)", r, ms(a), ms(p)), met: r <= 1.2, known: true, speedup: 1 / r, need: 1 / 1.2})
	}
	if len(rp.cfg.held) > 1 {
		lo, hi := rp.cfg.held[0], rp.cfg.held[len(rp.cfg.held)-1]
		a, ok1 := rp.agg(scHeld, 1, lo, sysCoord)
		z, ok2 := rp.agg(scHeld, 1, hi, sysCoord)
		if ok1 && ok2 && a.p50.med > 0 {
			r := z.p50.med / a.p50.med
			ts = append(ts, target{goal: fmt.Sprintf("%s held locks: acquire p50 within 1.2x of the %s-lock figure", thousands(float64(hi)), thousands(float64(lo))),
				measured: fmt.Sprintf("%.2fx (%s ms vs %s ms)", r, ms(z.p50.med), ms(a.p50.med)), met: r <= 1.2, known: true, speedup: 1 / r, need: 1 / 1.2})
		}
	}
	ts = append(ts, rp.workTargets()...)
	ts = append(ts, rp.replicaTargets()...)
	return append(ts, rp.failoverTargets()...)
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func memTotal() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			var kb float64
			if _, err := fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb); err != nil {
				return "unknown"
			}
			return fmt.Sprintf("%.1f GiB", kb/1024/1024)
		}
	}
	return "unknown"
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

func (rp *report) markdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	cmd := "coordbench"
	if len(rp.cfg.args) > 0 {
		cmd += " " + strings.Join(rp.cfg.args, " ")
	}
	w("## coordbench run\n\n")
	w("- command: `%s` (%s, %v in all)\n", cmd, time.Now().UTC().Format("2006-01-02 15:04 UTC"), rp.elapsed.Round(time.Second))
	w("- coordinatord's lock core: %s\n", coreName(rp.cfg.core))
	w("- machine: %d CPUs (%s), %s memory, %s/%s, %s, etcd %s (a plain etcd: embed.NewConfig defaults, single member, in its own process, the same for every system)\n",
		runtime.NumCPU(), cpuModel(), memTotal(), runtime.GOOS, runtime.GOARCH, runtime.Version(), version.Version)
	w("- load average (1, 5, 15 min) at the start: %s; at the end: %s\n", rp.load[0], rp.load[1])
	w("- each cell: %v warm-up, then a %v measured window; %d repetitions, the systems interleaved (rotated order); values are median (min–max) over the repetitions\n",
		rp.cfg.warmup, rp.cfg.duration, rp.cfg.reps)
	for _, s := range rp.skipped {
		w("- skipped: %s\n", s)
	}
	w("- clients share %d gRPC connections to coordinatord and %d etcd clients; each worker has its own Mutex session (lease) and v3lock lease, reused across acquisitions; every coordinatord Acquire gets a new lease (TTL %v)\n\n",
		rp.cfg.conns, rp.cfg.conns, benchTTL)

	if ts := rp.targets(); len(ts) > 0 {
		w("### Targets\n\n| target | measured | met? |\n|---|---|---|\n")
		for _, t := range ts {
			met := "**not met**"
			if t.met {
				met = "met"
			}
			w("| %s | %s | %s |\n", t.goal, t.measured, met)
		}
		w("\n")
	}

	w("### Side by side\n\nRatio = coordinatord / peer (for rates higher is better, for latencies lower is better).\n\n")
	w("| scenario | metric | coordinatord | peer | peer value | ratio |\n|---|---|---|---|---|---|\n")
	for _, r := range rp.rows() {
		w("| %s | %s | %s | %s | %s | %.2fx |\n", r.scenario, r.metric, r.coord, r.peer, r.other, r.ratio)
	}
	w("\n")

	if len(rp.rss) > 0 {
		w("### Held locks: memory\n\nResident set size (VmRSS) once the locks are held (before any: coordinatord %s, etcd %s).\n\n", mib(rp.baseRSS[0]), mib(rp.baseRSS[1]))
		w("| locks held | coordinatord acquire p50 | coordinatord RSS | etcd RSS |\n|---|---|---|---|\n")
		for _, h := range rp.cfg.held {
			a, _ := rp.agg(scHeld, 1, h, sysCoord)
			m := rp.rss[h]
			w("| %s | %s | %s | %s |\n", thousands(float64(h)), fmtLat(a.p50), mib(m[0]), mib(m[1]))
		}
		w("\n")
	}

	b.WriteString(rp.counterMarkdown())
	b.WriteString(rp.failoverMarkdown())
	b.WriteString(rp.workMarkdown())

	w("### CPU during the measured windows\n\nCores used (median over repetitions): the load generator (every client), the coordinatord process, the etcd process, and every other process on the machine (interference from outside the benchmark). The machine has %d.\n\n", runtime.NumCPU())
	w("| scenario | clients | held | system | ops/s | client | coordinatord | etcd | other | errors |\n|---|---|---|---|---|---|---|---|---|---|\n")
	seen := map[cell]bool{}
	for _, r := range rp.results {
		if seen[r.cell] {
			continue
		}
		seen[r.cell] = true
		a, _ := rp.agg(r.scenario, r.clients, r.held, r.system)
		errs := fmt.Sprint(a.errs)
		if a.violations > 0 {
			errs += fmt.Sprintf(", %d EXCLUSION VIOLATIONS", a.violations)
		}
		w("| %s | %d | %d | %s | %s | %.2f | %.2f | %.2f | %.2f | %s |\n", r.scenario, r.clients, r.held, r.system, thousands(a.rate.med), a.client.med, a.coord.med, a.etcd.med, a.other.med, errs)
	}
	w("\n")
	return b.String()
}

// chart draws the speed-ups of coordinatord over its peers as horizontal
// bars on a log scale, with the targets as marks.
func (rp *report) chart() string {
	type bar struct {
		label   string
		v, need float64
		peer    string
	}
	var bars []bar
	needs := map[string]float64{}
	for _, t := range rp.targets() {
		switch {
		case strings.HasPrefix(t.goal, "contended hand-off, 16"):
			needs["contended 16: hand-offs/s vs "+sysMutex] = t.need
		case strings.HasPrefix(t.goal, "uncontended cycles, 64"):
			needs["uncontended 64: cycles/s vs "+sysMutex] = t.need
		case strings.HasPrefix(t.goal, "ValidateToken, 64"):
			needs["validate 64: ops/s vs Get"] = t.need
		case strings.HasPrefix(t.goal, "single-client"):
			needs["uncontended 1: acquire p50 vs "+sysMutex] = t.need
		}
	}
	for _, r := range rp.rows() {
		if strings.HasPrefix(r.peer, "what-if") || strings.Contains(r.label, "p99") || (strings.Contains(r.label, "acquire p50") && !strings.HasPrefix(r.label, "uncontended 1:") && !strings.Contains(r.label, "held")) {
			continue // keep the chart readable: the table has them all
		}
		if r.speedup > 0 {
			bars = append(bars, bar{label: r.label, v: r.speedup, need: needs[r.label], peer: r.peer})
		}
	}
	if len(rp.cfg.held) > 1 {
		lo, hi := rp.cfg.held[0], rp.cfg.held[len(rp.cfg.held)-1]
		a, ok1 := rp.agg(scHeld, 1, lo, sysCoord)
		z, ok2 := rp.agg(scHeld, 1, hi, sysCoord)
		if ok1 && ok2 && z.p50.med > 0 {
			bars = append(bars, bar{label: fmt.Sprintf("acquire p50: %s held vs %s held", thousands(float64(lo)), thousands(float64(hi))), v: a.p50.med / z.p50.med, need: 1 / 1.2, peer: "self"})
		}
	}

	const (
		left, right, top, barH, gap = 330, 40, 72, 16, 6
		width                       = 900
	)
	lo, hi := 0.1, 100.0
	for _, b := range bars {
		for hi < b.v*1.5 {
			hi *= 10
		}
		for lo > b.v/1.5 {
			lo /= 10
		}
	}
	plotW := float64(width - left - right)
	x := func(v float64) float64 {
		return float64(left) + plotW*(math.Log10(v)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))
	}
	height := top + len(bars)*(barH+gap) + 50
	colors := map[string]string{sysCoord: "#b07aa1", sysMutex: "#4e79a7", sysV3lock: "#59a14f", sysGet: "#f28e2b", "self": "#b07aa1", sysRecipeNow: "#bab0ac", sysRecipeNext: "#bab0ac"}
	for _, k := range rp.cfg.replicas {
		colors[sysReplicas(k)] = colors["self"] // the replicas scenario: coordinatord against itself
	}

	var s strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="10" y="20" font-size="15" font-weight="bold">coordinatord speed-up over each peer (log scale; right of 1x: coordinatord better)</text>` + "\n")
	p(`<text x="10" y="36" fill="#555">Same etcd, same run. Bar colour = peer: blue etcd Mutex, green etcd v3lock, orange linearizable etcd Get,</text>` + "\n")
	p(`<text x="10" y="50" fill="#555">purple coordinatord against itself (100 vs most locks held). Red tick = the target (reach or pass it).</text>` + "\n")
	for d := lo; d <= hi*1.0001; d *= 10 {
		for _, m := range []float64{1, 2, 5} {
			v := d * m
			if v > hi*1.0001 {
				break
			}
			xx := x(v)
			stroke := "#e0e0e0"
			if v == 1 {
				stroke = "#333"
			}
			p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s"/>`+"\n", xx, top-6, xx, height-40, stroke)
			p(`<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%gx</text>`+"\n", xx, height-26, v)
		}
	}
	for i, b := range bars {
		y := top + i*(barH+gap)
		x0, x1 := x(1), x(b.v)
		if x1 < x0 {
			x0, x1 = x1, x0
		}
		p(`<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", left-8, y+barH-4, html.EscapeString(b.label))
		p(`<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x0, y, math.Max(x1-x0, 1), barH, colors[b.peer])
		p(`<text x="%.1f" y="%d" fill="#000">%.2fx</text>`+"\n", math.Max(x(b.v), x(1))+4, y+barH-4, b.v)
		if b.need > 0 {
			xn := x(b.need)
			p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#d62728" stroke-width="3"/>`+"\n", xn, y-2, xn, y+barH+2)
		}
	}
	p(`<text x="%d" y="%d" fill="#555">%s</text>`+"\n", 10, height-8, html.EscapeString(fmt.Sprintf("%d CPUs, %s, etcd %s; %d reps x %v; median of each side", runtime.NumCPU(), runtime.Version(), version.Version, rp.cfg.reps, rp.cfg.duration)))
	p("</svg>\n")
	return s.String()
}

// coreName describes a -core value for the report.
func coreName(core string) string {
	if core == "shard" {
		return "shard (the shard-owner core: locks decided in memory by the owner of each shard, one guarded group commit)"
	}
	return "queue (every lock's queue kept in etcd)"
}
