package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// The etcd-bound scenario: etcd pinned to one CPU, everything else (the
// coordinatord children and the load generator) to another, so that etcd
// is the shared bottleneck it is at scale. Each system runs the
// uncontended cycle with the most workers of -clients: which one gets more
// locks out of a saturated etcd. coordinatord runs once with one replica
// and once with two replicas on the same etcd, half the workers on each,
// to show what a replica adds when etcd is the limit.
const (
	scEtcdBound = "etcdbound"
	sysCoord2   = "coordinatord, 2 replicas"
)

// runEtcdBound measures the scenario; with fewer than 2 CPUs it only notes
// that it was skipped.
func (b *bench) runEtcdBound(progress func(result), rotate func([]string, int) []string) error {
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		return fmt.Errorf("etcd-bound: %w", err)
	}
	cpus := cpusOf(all)
	if len(cpus) < 2 {
		b.skipped = append(b.skipped, fmt.Sprintf("the etcd-bound scenario: this process may run on %d CPU, it needs 2 (etcd on one, the rest on the other)", len(cpus)))
		return nil
	}
	second, err := startChild(roleCoordinator, b.coordArgs("")...)
	if err != nil {
		return fmt.Errorf("etcd-bound: second coordinatord: %w", err)
	}
	defer stopLogged(roleCoordinator, second)
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	both := &clients{}
	for i := range b.cl.coord {
		gc, err := grpc.NewClient(second.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("etcd-bound: %w", err)
		}
		conns = append(conns, gc)
		// Interleaved, so that worker w%2 == 0 goes to the first replica.
		both.coord = append(both.coord, b.cl.coord[i], coordinatorv1.NewLockServiceClient(gc))
	}
	b.systems[sysCoord2] = coordLocker{both}
	b.extra = []*child{second}
	defer func() { b.extra = nil }()

	var one, rest unix.CPUSet
	one.Set(cpus[0])
	rest.Set(cpus[1])
	pids := []int{os.Getpid(), b.coord.pid(), second.pid()}
	if err := pin(b.etcd.pid(), one); err != nil {
		return fmt.Errorf("etcd-bound: pin etcd: %w", err)
	}
	defer func() { _ = pin(b.etcd.pid(), all) }()
	for _, pid := range pids {
		if err := pin(pid, rest); err != nil {
			return fmt.Errorf("etcd-bound: pin %d: %w", pid, err)
		}
	}
	defer func() {
		for _, pid := range pids {
			_ = pin(pid, all)
		}
	}()
	fmt.Fprintf(os.Stderr, "etcdbound: etcd on CPU %d; coordinatord (2 replicas) and the load generator on CPU %d\n", cpus[0], cpus[1])

	n := slices.Max(b.cfg.clients)
	for r := range b.cfg.reps {
		for _, s := range rotate([]string{sysCoord, sysCoord2, sysMutex, sysV3lock}, r) {
			progress(b.uncontended(cell{scenario: scEtcdBound, clients: n, system: s}, r, ""))
		}
	}
	return nil
}

// cpusOf lists the CPUs of a set.
func cpusOf(set unix.CPUSet) []int {
	var cpus []int
	for i := range len(set) * 64 {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus
}

// pin sets the CPU affinity of every thread of process pid (a Go process
// has many; a thread created later inherits its creator's). Twice, for the
// threads created while the first pass ran.
func pin(pid int, set unix.CPUSet) error {
	for range 2 {
		tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
		if err != nil {
			return err
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("thread %d: %w", tid, err)
			}
		}
	}
	return nil
}

// etcdBoundRows compares, in the scenario, coordinatord (one replica, then
// two) with the peers, and two replicas with one.
func (rp *report) etcdBoundRows(cmp func(sc string, clients, held int, peer, scenario, metric, label string, latency bool, pick func(agg) spread)) {
	if len(rp.cfg.clients) == 0 {
		return
	}
	n := slices.Max(rp.cfg.clients)
	sc := fmt.Sprintf("etcd-bound (etcd on one CPU, the rest on the other), %d clients", n)
	rate := func(a agg) spread { return a.rate }
	for _, peer := range []string{sysMutex, sysV3lock} {
		cmp(scEtcdBound, n, 0, peer, sc, "locks/s (acquire+release cycles)", fmt.Sprintf("etcd-bound %d: locks/s vs %s", n, peer), false, rate)
		cmp(scEtcdBound, n, 0, sysCoord2+" vs "+peer, sc, "2 coordinatord replicas: locks/s", fmt.Sprintf("etcd-bound %d: 2 replicas vs %s", n, peer), false, rate)
	}
	cmp(scEtcdBound, n, 0, sysCoord2+" vs "+sysCoord, sc, "2 coordinatord replicas vs 1: locks/s", fmt.Sprintf("etcd-bound %d: 2 replicas vs 1", n), false, rate)
}

// etcdBoundTargets: coordinatord gets at least 1.5x the Mutex's locks out
// of a saturated etcd.
func (rp *report) etcdBoundTargets() []target {
	if len(rp.cfg.clients) == 0 {
		return nil
	}
	n := slices.Max(rp.cfg.clients)
	a, ok1 := rp.agg(scEtcdBound, n, 0, sysCoord)
	p, ok2 := rp.agg(scEtcdBound, n, 0, sysMutex)
	if !ok1 || !ok2 || p.rate.med == 0 {
		return nil
	}
	r := a.rate.med / p.rate.med
	m := fmt.Sprintf("%.2fx (%s vs %s locks/s)", r, thousands(a.rate.med), thousands(p.rate.med))
	if two, ok := rp.agg(scEtcdBound, n, 0, sysCoord2); ok {
		m += fmt.Sprintf("; 2 replicas: %.2fx (%s)", two.rate.med/p.rate.med, thousands(two.rate.med))
	}
	return []target{{goal: fmt.Sprintf("etcd-bound, %d clients: coordinatord >= 1.5x the Mutex's locks/s", n), measured: m, met: r >= 1.5, known: true, speedup: r, need: 1.5}}
}
