package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// etcd's work per operation. Before and after each measured window the
// benchmark reads two counters from etcd's own metrics endpoint (the
// client URL's /metrics) and etcd's CPU time from /proc; the differences,
// divided by the operations completed in the window, say what each
// operation cost etcd, whatever the process hops cost around it. The reads
// bracket the window from just outside it, so the counters also take in the
// operations of the few milliseconds a read takes (under 0.2% of a 4 s
// window).
const (
	metricProposals = "etcd_server_proposals_committed_total"      // raft entries committed
	metricFsyncs    = "etcd_disk_wal_fsync_duration_seconds_count" // WAL fsyncs
)

// etcdCounters are the two counters at one instant.
type etcdCounters struct{ proposals, fsyncs float64 }

// parseMetrics reads the Prometheus text exposition format and returns the
// value of each of names, summed over its label sets. A name that is not
// there is an error: the counters exist from etcd's start.
func parseMetrics(r io.Reader, names ...string) (map[string]float64, error) {
	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	got := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if !want[name] {
			continue
		}
		if strings.HasPrefix(rest, "{") {
			end := strings.LastIndexByte(rest, '}')
			if end < 0 {
				return nil, fmt.Errorf("metric %s: unterminated labels", name)
			}
			rest = rest[end+1:]
		}
		f := strings.Fields(rest) // value [timestamp]
		if len(f) < 1 {
			return nil, fmt.Errorf("metric %s: no value", name)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metric %s: value %q: %w", name, f[0], err)
		}
		got[name] += v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, n := range names {
		if _, ok := got[n]; !ok {
			return nil, fmt.Errorf("metric %s: not exposed", n)
		}
	}
	return got, nil
}

// scrapeEtcd reads the counters from the etcd at clientURL.
func scrapeEtcd(ctx context.Context, clientURL string) (etcdCounters, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(clientURL, "/")+"/metrics", nil)
	if err != nil {
		return etcdCounters{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return etcdCounters{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return etcdCounters{}, fmt.Errorf("etcd metrics: %s", resp.Status)
	}
	m, err := parseMetrics(resp.Body, metricProposals, metricFsyncs)
	if err != nil {
		return etcdCounters{}, err
	}
	return etcdCounters{proposals: m[metricProposals], fsyncs: m[metricFsyncs]}, nil
}

// etcdWork is what etcd did during one window.
type etcdWork struct {
	proposals, fsyncs float64
	cpu               time.Duration
	known             bool // both scrapes succeeded
}

// errCountersBack: a counter went down between the reads (etcd restarted).
var errCountersBack = errors.New("etcd counters went back between the reads")

// workBetween is the work between two reads of the counters and of etcd's
// CPU time.
func workBetween(before, after etcdCounters, cpuBefore, cpuAfter time.Duration) (etcdWork, error) {
	if after.proposals < before.proposals || after.fsyncs < before.fsyncs || cpuAfter < cpuBefore {
		return etcdWork{}, errCountersBack
	}
	return etcdWork{proposals: after.proposals - before.proposals, fsyncs: after.fsyncs - before.fsyncs,
		cpu: cpuAfter - cpuBefore, known: true}, nil
}

// perOp is the work of one operation out of ops: raft proposals, WAL
// fsyncs, etcd CPU. All zero when no operation completed or the work is
// unknown.
type perOp struct {
	proposals, fsyncs float64
	cpu               time.Duration
	opsPerCPUSecond   float64 // +Inf when etcd's CPU time did not move (its clock ticks are 10 ms)
}

func (w etcdWork) per(ops int) perOp {
	if ops <= 0 || !w.known {
		return perOp{}
	}
	n := float64(ops)
	p := perOp{proposals: w.proposals / n, fsyncs: w.fsyncs / n, cpu: time.Duration(float64(w.cpu) / n)}
	p.opsPerCPUSecond = math.Inf(1)
	if w.cpu > 0 {
		p.opsPerCPUSecond = n / w.cpu.Seconds()
	}
	return p
}

// ratioOf is a / b, 0 when either is unknown (0) or infinite.
func ratioOf(a, b float64) float64 {
	if a <= 0 || b <= 0 || math.IsInf(a, 0) || math.IsInf(b, 0) {
		return 0
	}
	return a / b
}

// usesEtcd tells whether a system's operations go to etcd (the Redis
// peers and the no-op RPC do not: their etcd work is not theirs).
func usesEtcd(system string) bool {
	switch system {
	case sysRedisAlways, sysRedisNo, sysFloor:
		return false
	}
	return true
}

// workOf is the work between two scrapes of the bench's etcd (unknown, and
// said on stderr, when a scrape failed).
func (b *bench) workOf(before, after etcdCounters, errBefore, errAfter error, cpuBefore, cpuAfter time.Duration) etcdWork {
	err := errors.Join(errBefore, errAfter)
	var w etcdWork
	if err == nil {
		w, err = workBetween(before, after, cpuBefore, cpuAfter)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordbench: etcd work:", err)
	}
	return w
}
