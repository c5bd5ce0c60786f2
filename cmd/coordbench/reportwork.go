package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// workSpread is the aggregate of a cell's etcd work per operation over its
// repetitions (those whose work is known and that completed operations).
type workSpread struct {
	n                      int
	proposals, fsyncs, cpu spread // cpu: etcd CPU nanoseconds per operation
	opsPerCPU              spread
}

func (rp *report) workAgg(sc string, clients, held int, system string) workSpread {
	var ws workSpread
	var pr, fs, cpu, opc []float64
	for _, r := range rp.results {
		if r.scenario != sc || r.clients != clients || r.held != held || r.system != system || !r.work.known || r.ops == 0 {
			continue
		}
		p := r.work.per(r.ops)
		ws.n++
		pr, fs = append(pr, p.proposals), append(fs, p.fsyncs)
		cpu, opc = append(cpu, float64(p.cpu)), append(opc, p.opsPerCPUSecond)
	}
	ws.proposals, ws.fsyncs, ws.cpu, ws.opsPerCPU = spreadOf(pr), spreadOf(fs), spreadOf(cpu), spreadOf(opc)
	return ws
}

// us formats nanoseconds as microseconds.
func us(ns float64) string { return fmt.Sprintf("%.0f µs", ns/1e3) }

// perCPU formats operations per etcd CPU-second.
func perCPU(v float64) string {
	if math.IsInf(v, 1) {
		return "∞"
	}
	return thousands(v)
}

// isPeer tells whether a system is one of coordinatord's peers (not
// coordinatord in another shape).
func isPeer(system string) bool {
	return system == sysMutex || system == sysV3lock || system == sysGet || system == sysNaiveTxn || strings.HasPrefix(system, "what-if")
}

// workMarkdown is the table of etcd's work per operation of every cell, and
// the headline: operations per etcd CPU-second, coordinatord / peer.
func (rp *report) workMarkdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("### etcd work per operation\n\nFrom etcd's own metrics endpoint (raft proposals committed, WAL fsyncs) and `/proc` (etcd's CPU time), read before and after each measured window, divided by the operations completed in it; median over repetitions. A cycle is one acquire and its release; a hand-off one grant. Operations per etcd CPU-second is the capacity a shared etcd gives each system.\n\n")
	w("| scenario | clients | held | system | ops/s | raft proposals / op | WAL fsyncs / op | etcd CPU / op | ops per etcd CPU-second |\n|---|---|---|---|---|---|---|---|---|\n")
	type group struct {
		scenario      string
		clients, held int
	}
	var groups []group
	seen := map[cell]bool{}
	for _, r := range rp.results {
		if seen[r.cell] {
			continue
		}
		seen[r.cell] = true
		if g := (group{r.scenario, r.clients, r.held}); !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
		a, _ := rp.agg(r.scenario, r.clients, r.held, r.system)
		k := rp.workAgg(r.scenario, r.clients, r.held, r.system)
		if !usesEtcd(r.system) || k.n == 0 {
			w("| %s | %d | %d | %s | %s | – | – | – | – |\n", r.scenario, r.clients, r.held, r.system, thousands(a.rate.med))
			continue
		}
		w("| %s | %d | %d | %s | %s | %.2f | %.2f | %s | %s |\n", r.scenario, r.clients, r.held, r.system, thousands(a.rate.med),
			k.proposals.med, k.fsyncs.med, us(k.cpu.med), perCPU(k.opsPerCPU.med))
	}
	w("\n")

	var rows []string
	for _, g := range groups {
		self := rp.workAgg(g.scenario, g.clients, g.held, sysCoord)
		if self.n == 0 {
			continue
		}
		for _, r := range rp.results {
			if r.scenario != g.scenario || r.clients != g.clients || r.held != g.held || !isPeer(r.system) || slices.ContainsFunc(rows, func(s string) bool {
				return strings.HasPrefix(s, fmt.Sprintf("| %s | %d | %d | %s |", g.scenario, g.clients, g.held, r.system))
			}) {
				continue
			}
			p := rp.workAgg(g.scenario, g.clients, g.held, r.system)
			if p.n == 0 {
				continue
			}
			rows = append(rows, fmt.Sprintf("| %s | %d | %d | %s | %s | %s | %.2fx |\n", g.scenario, g.clients, g.held, r.system,
				perCPU(self.opsPerCPU.med), perCPU(p.opsPerCPU.med), ratioOf(self.opsPerCPU.med, p.opsPerCPU.med)))
		}
	}
	if len(rows) > 0 {
		w("### Operations per etcd CPU-second, coordinatord / peer\n\n| scenario | clients | held | peer | coordinatord | peer value | ratio |\n|---|---|---|---|---|---|---|\n")
		for _, r := range rows {
			b.WriteString(r)
		}
		w("\n")
	}
	return b.String()
}

// workTargets are the goals on etcd's work per operation.
func (rp *report) workTargets() []target {
	var ts []target
	pair := func(sc string, clients int, peer string) (workSpread, workSpread, bool) {
		a, p := rp.workAgg(sc, clients, 0, sysCoord), rp.workAgg(sc, clients, 0, peer)
		return a, p, a.n > 0 && p.n > 0
	}
	if a, p, ok := pair(scUncontended, 64, sysMutex); ok {
		r := ratioOf(a.opsPerCPU.med, p.opsPerCPU.med)
		ts = append(ts, target{goal: "uncontended, 64 clients: operations per etcd CPU-second >= 2x the Mutex's",
			measured: fmt.Sprintf("%.2fx (%s vs %s)", r, perCPU(a.opsPerCPU.med), perCPU(p.opsPerCPU.med)), met: r >= 2, known: true})
		f := ratioOf(a.fsyncs.med, p.fsyncs.med)
		ts = append(ts, target{goal: "uncontended, 64 clients: WAL fsyncs per cycle <= 0.5x the Mutex's",
			measured: fmt.Sprintf("%.2fx (%.2f vs %.2f)", f, a.fsyncs.med, p.fsyncs.med), met: a.fsyncs.med <= 0.5*p.fsyncs.med, known: true})
	}
	for _, n := range rp.cfg.contended {
		if a := rp.workAgg(scContended, n, 0, sysCoord); a.n > 0 {
			ts = append(ts, target{goal: fmt.Sprintf("contended, %d clients: raft proposals per hand-off <= 1", n),
				measured: fmt.Sprintf("%.2f", a.proposals.med), met: a.proposals.med <= 1, known: true})
		}
	}
	if a, p, ok := pair(scValidate, 64, sysGet); ok {
		r := ratioOf(a.opsPerCPU.med, p.opsPerCPU.med)
		ts = append(ts, target{goal: "ValidateToken, 64 clients: operations per etcd CPU-second >= 10x the linearizable Get's",
			measured: fmt.Sprintf("%.2fx (%s vs %s)", r, perCPU(a.opsPerCPU.med), perCPU(p.opsPerCPU.med)), met: r >= 10, known: true})
	}
	return append(ts, rp.etcdBoundTargets()...)
}
