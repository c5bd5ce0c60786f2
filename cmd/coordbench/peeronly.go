package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Peer fairness (-peer-only): etcd's Mutex measured four ways in one run,
// the variants interleaved (rotated order) in every cell:
//
//   - peerMinimal: a minimal program, as a user writes it: its own plain etcd
//     child (nothing else talks to it), ONE clientv3 client shared by the
//     workers, a session per worker, Lock/Unlock in a loop, a counter;
//   - peerNow: coordbench's Mutex peer as every scenario runs it, on the
//     plain etcd child, beside a coordinatord child and the other systems'
//     clients and leases;
//   - peerEmbedded: the same on coordinatord's embedded etcd configuration,
//     which every scenario ran on before;
//   - peerShared: the minimal program's loop on coordbench's etcd child (the
//     etcd, not the harness);
//   - peerCoord: coordinatord's cell on coordbench's etcd child, so that the
//     Mutex cells follow coordinatord's as they do in a full run.
const (
	peerMinimal  = "minimal program (own plain etcd, one client)"
	peerNow      = "coordbench Mutex peer (plain etcd child)"
	peerEmbedded = "coordbench Mutex peer (embedded-etcd configuration, before)"
	peerShared   = "minimal program on coordbench's etcd child"
	peerCoord    = "coordinatord on coordbench's etcd child"
)

// peerOnly runs the -peer-only comparison and prints its table.
func peerOnly(cfg config) (*report, error) {
	start := time.Now()
	cleanup, err := cfg.withDataDir()
	if err != nil {
		return nil, err
	}
	defer cleanup()
	now, stopNow, err := newBench(cfg, roleEtcd, filepath.Join(cfg.dataDir, "etcd"))
	if err != nil {
		return nil, err
	}
	defer stopNow()
	old, stopOld, err := newBench(cfg, roleEtcdEmbedded, filepath.Join(cfg.dataDir, "etcd-embedded"))
	if err != nil {
		return nil, err
	}
	defer stopOld()
	own, err := startChild(roleEtcd, "-data-dir", filepath.Join(cfg.dataDir, "etcd-minimal"))
	if err != nil {
		return nil, err
	}
	defer stopLogged(roleEtcd, own)
	ownCli, err := clientv3.New(clientv3.Config{Endpoints: []string{own.addr}, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	defer ownCli.Close()
	ownBench := &bench{cfg: cfg, etcd: own, coord: own, cl: &clients{etcd: []*clientv3.Client{ownCli}}}

	rep := &report{cfg: cfg, load: [2]string{loadAvg()}}
	variants := []string{peerMinimal, peerNow, peerEmbedded, peerShared, peerCoord}
	cells := []cell{}
	for _, n := range cfg.clients {
		cells = append(cells, cell{scenario: scUncontended, clients: n})
	}
	for _, n := range cfg.contended {
		cells = append(cells, cell{scenario: scContended, clients: n})
	}
	var seq atomic.Int64
	for _, c := range cells {
		for r := range cfg.reps {
			i := r % len(variants)
			for _, v := range slices.Concat(variants[i:], variants[:i]) {
				c.system = v
				var res result
				switch v {
				case peerMinimal:
					res = ownBench.minimal(c, r, own.addr, seq.Add(1))
				case peerShared:
					res = now.minimal(c, r, now.etcd.addr, seq.Add(1))
				case peerNow, peerEmbedded, peerCoord:
					b, sys := now, sysMutex
					switch v {
					case peerEmbedded:
						b = old
					case peerCoord:
						sys = sysCoord
					}
					mc := cell{scenario: c.scenario, clients: c.clients, system: sys}
					if c.scenario == scContended {
						res = b.contended(mc, r, "")
					} else {
						res = b.uncontended(mc, r, "")
					}
					res.cell = c
				}
				fmt.Fprintf(os.Stderr, "%-11s n=%-3d %-60s rep %d: %7.0f ops/s  etcd cpu %.2f  errs %d\n",
					c.scenario, c.clients, v, r, res.rate, res.etcdCPU, res.errs)
				rep.results = append(rep.results, res)
				map[string]*bench{peerMinimal: ownBench, peerNow: now, peerEmbedded: old, peerShared: now, peerCoord: now}[v].compact()
			}
		}
	}
	rep.elapsed = time.Since(start)
	rep.load[1] = loadAvg()
	fmt.Print(rep.peerMarkdown(cells, variants))
	return rep, nil
}

// minimal is the minimal program's cell: a new client of the etcd at url,
// a session per worker, each worker locking and unlocking its own name
// (uncontended) or the cell's one name (contended) until the end of the
// measured window. Only the etcd CPU is read, from /proc, as in window.
func (b *bench) minimal(c cell, rep int, url string, id int64) result {
	r := result{cell: c, rep: rep}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second})
	if err != nil {
		r.errs++
		return r
	}
	defer cli.Close()
	sessions := make([]*concurrency.Session, c.clients)
	for w := range sessions {
		if sessions[w], err = concurrency.NewSession(cli); err != nil {
			r.errs++
			return r
		}
		defer sessions[w].Close()
	}
	var (
		counting, stop atomic.Bool
		ops, errs      atomic.Int64
		wg             sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for w := range c.clients {
		name := fmt.Sprintf("/minimal/%d/w%d", id, w)
		if c.scenario == scContended {
			name = fmt.Sprintf("/minimal/%d", id)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				m := concurrency.NewMutex(sessions[w], name)
				if err := m.Lock(ctx); err != nil {
					if ctx.Err() == nil {
						errs.Add(1)
					}
					continue
				}
				if err := m.Unlock(context.Background()); err != nil {
					errs.Add(1)
					continue
				}
				if counting.Load() {
					ops.Add(1)
				}
			}
		}()
	}
	time.Sleep(b.cfg.warmup)
	ctr0, err0 := scrapeEtcd(context.Background(), url)
	cpu0, _ := cpuTime(b.etcd.pid())
	t0 := time.Now()
	counting.Store(true)
	time.Sleep(b.cfg.duration)
	counting.Store(false)
	elapsed := time.Since(t0)
	cpu1, _ := cpuTime(b.etcd.pid())
	ctr1, err1 := scrapeEtcd(context.Background(), url)
	r.work = b.workOf(ctr0, ctr1, err0, err1, cpu0, cpu1)
	stop.Store(true)
	time.AfterFunc(200*time.Millisecond, cancel) // contended waiters
	wg.Wait()
	r.ops, r.errs = int(ops.Load()), int(errs.Load())
	r.rate = float64(r.ops) / elapsed.Seconds()
	r.etcdCPU = (cpu1 - cpu0).Seconds() / elapsed.Seconds()
	return r
}

// peerMarkdown is the -peer-only table: each variant's rate and its ratio
// to the minimal program's, per cell.
func (rp *report) peerMarkdown(cells []cell, variants []string) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("## coordbench -peer-only: etcd's Mutex, four ways (and coordinatord), one run\n\n")
	w("- command: `coordbench %s` (%s, %v in all)\n", strings.Join(rp.cfg.args, " "), time.Now().UTC().Format("2006-01-02 15:04 UTC"), rp.elapsed.Round(time.Second))
	w("- load average (1, 5, 15 min) at the start: %s; at the end: %s\n", rp.load[0], rp.load[1])
	w("- each cell: %v warm-up, %v measured, %d repetitions, the variants rotated; median (min–max)\n\n", rp.cfg.warmup, rp.cfg.duration, rp.cfg.reps)
	w("| scenario | clients | variant | cycles/s | / minimal | etcd cores | raft proposals / cycle | WAL fsyncs / cycle | etcd CPU / cycle | errors |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range cells {
		base, _ := rp.agg(c.scenario, c.clients, 0, peerMinimal)
		for _, v := range variants {
			a, ok := rp.agg(c.scenario, c.clients, 0, v)
			if !ok {
				continue
			}
			ratio := 0.0
			if base.rate.med > 0 {
				ratio = a.rate.med / base.rate.med
			}
			k := rp.workAgg(c.scenario, c.clients, 0, v)
			w("| %s | %d | %s | %s | %.2fx | %.2f | %.2f | %.2f | %s | %d |\n", c.scenario, c.clients, v, fmtRate(a.rate), ratio, a.etcd.med,
				k.proposals.med, k.fsyncs.med, us(k.cpu.med), a.errs)
		}
	}
	w("\n")
	return b.String()
}
