package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// Scenarios.
const (
	scUncontended = "uncontended"
	scContended   = "contended"
	scValidate    = "validate"
	scHeld        = "held"
)

// cell is one measured configuration.
type cell struct {
	scenario string
	clients  int
	held     int // scHeld: locks held while measuring; scCounter: distinct counters
	system   string
}

// result is one repetition of a cell.
type result struct {
	cell
	rep        int
	ops        int     // completed operations in the measured window
	rate       float64 // ops per second
	p50, p99   time.Duration
	clientCPU  float64 // cores used by this process (every client of every system)
	coordCPU   float64 // cores used by the coordinatord process
	etcdCPU    float64 // cores used by the etcd process
	otherCPU   float64 // cores used by everything else on the machine (interference)
	errs       int
	violations int      // contended: a grant while another worker held the lock
	work       etcdWork // etcd's work during the measured window
}

// bench is one run: the children, the shared clients and the settings.
type bench struct {
	cfg     config
	etcd    *child
	coord   *child
	extra   []*child // further coordinatord replicas (etcd-bound, replicas and failover scenarios), while they run
	secret  string   // shard core: the file of the members' shared secret
	cl      *clients
	systems map[string]locker
	redis   *redisPeer   // the counter scenario's peer; nil when redis-server is not installed
	notes   []string     // for the report: peers skipped, and why
	skipped []string     // for the report: scenarios skipped, and why
	seq     atomic.Int64 // makes every cell's lock names unique
}

// op is one operation of worker w; it returns the latency sample to record
// (if any).
type op func(ctx context.Context, w int) (sample time.Duration, ok bool, err error)

// window runs workers that repeat op: a warm-up, then the measured window
// in which completed operations and their samples are counted.
func (b *bench) window(c cell, rep int, workers int, grace time.Duration, profile string, fn op) result {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		recording, stopping atomic.Bool
		wg                  sync.WaitGroup
		ops                 = make([]int, workers)
		errs                = make([]int, workers)
		samples             = make([][]time.Duration, workers)
		firstErr            atomic.Value
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stopping.Load() {
				s, ok, err := fn(ctx, w)
				if err != nil {
					if stopping.Load() {
						return
					}
					errs[w]++
					firstErr.CompareAndSwap(nil, err)
					time.Sleep(10 * time.Millisecond)
					continue
				}
				if recording.Load() {
					ops[w]++
					if ok {
						samples[w] = append(samples[w], s)
					}
				}
			}
		}()
	}
	time.Sleep(b.cfg.warmup)

	var profDone chan error
	if profile != "" {
		profDone = make(chan error, 2)
		go func() {
			profDone <- fetchProfile(b.coord.pprof, b.cfg.duration, filepath.Join(b.cfg.profileDir, "coordinatord-"+profile+".pprof"))
		}()
		go func() {
			profDone <- fetchProfile(b.etcd.pprof, b.cfg.duration, filepath.Join(b.cfg.profileDir, "etcd-"+profile+".pprof"))
		}()
	}
	ctr0, err0 := scrapeEtcd(context.Background(), b.etcd.addr)
	cpu0 := b.cpu()
	t0 := time.Now()
	recording.Store(true)
	time.Sleep(b.cfg.duration)
	recording.Store(false)
	elapsed := time.Since(t0)
	cpu1 := b.cpu()
	ctr1, err1 := scrapeEtcd(context.Background(), b.etcd.addr)
	stopping.Store(true)

	stopped := make(chan struct{})
	go func() { wg.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(grace):
		cancel() // waiters of a contended lock: end their wait
		<-stopped
	}
	if profDone != nil {
		for range 2 {
			if err := <-profDone; err != nil {
				fmt.Fprintln(os.Stderr, "coordbench: profile:", err)
			}
		}
	}

	r := result{cell: c, rep: rep}
	var all []time.Duration
	for w := range workers {
		r.ops += ops[w]
		r.errs += errs[w]
		all = append(all, samples[w]...)
	}
	slices.Sort(all)
	r.rate = float64(r.ops) / elapsed.Seconds()
	r.p50, r.p99 = percentile(all, 50), percentile(all, 99)
	secs := elapsed.Seconds()
	r.clientCPU = (cpu1[0] - cpu0[0]).Seconds() / secs
	r.coordCPU = (cpu1[1] - cpu0[1]).Seconds() / secs
	r.etcdCPU = (cpu1[2] - cpu0[2]).Seconds() / secs
	r.otherCPU = max((cpu1[3]-cpu0[3]).Seconds()/secs-r.clientCPU-r.coordCPU-r.etcdCPU, 0)
	r.work = b.workOf(ctr0, ctr1, err0, err1, cpu0[2], cpu1[2])
	if r.errs > 0 {
		fmt.Fprintf(os.Stderr, "coordbench: %s/%d/%s: %d errors, first: %v\n", c.scenario, c.clients, c.system, r.errs, firstErr.Load())
	}
	return r
}

// cpu is the CPU time used so far by this process, coordinatord (every
// replica when there are more), etcd and the whole machine.
func (b *bench) cpu() [4]time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	self := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	coord, _ := cpuTime(b.coord.pid())
	for _, c := range b.extra {
		c2, _ := cpuTime(c.pid())
		coord += c2
	}
	etcd, _ := cpuTime(b.etcd.pid())
	all, _ := machineBusy()
	return [4]time.Duration{self, coord, etcd, all}
}

func bg() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

// uncontended: each worker acquires and releases its own name; the sample
// is the acquire latency.
func (b *bench) uncontended(c cell, rep int, profile string) result {
	id := b.seq.Add(1)
	l := b.systems[c.system]
	return b.window(c, rep, c.clients, 5*time.Second, profile, func(ctx context.Context, w int) (time.Duration, bool, error) {
		name := fmt.Sprintf("u%d/w%d", id, w)
		t := time.Now()
		h, err := l.lock(ctx, w, name)
		if err != nil {
			return 0, false, err
		}
		lat := time.Since(t)
		rctx, cancel := bg()
		defer cancel()
		return lat, true, h.release(rctx)
	})
}

// contended: every worker acquires and releases ONE name. The sample is the
// wait: from the moment the previous holder started its release to the
// moment the next grant reached its client.
func (b *bench) contended(c cell, rep int, profile string) result {
	name := fmt.Sprintf("c%d", b.seq.Add(1))
	l := b.systems[c.system]
	var (
		lastRelease atomic.Int64 // ns since base; 0 before the first release
		holders     atomic.Int32
		violations  atomic.Int64
		base        = time.Now()
	)
	r := b.window(c, rep, c.clients, 200*time.Millisecond, profile, func(ctx context.Context, w int) (time.Duration, bool, error) {
		h, err := l.lock(ctx, w, name)
		if err != nil {
			return 0, false, err
		}
		granted := time.Since(base)
		if holders.Add(1) > holdersAllowed(c.system) {
			violations.Add(1)
		}
		prev := lastRelease.Load()
		holders.Add(-1)
		lastRelease.Store(int64(time.Since(base)))
		rctx, cancel := bg()
		defer cancel()
		err = h.release(rctx)
		return granted - time.Duration(prev), prev != 0, err
	})
	r.violations = int(violations.Load())
	return r
}

// validate: worker w checks the token of the lock it holds; the peer does
// what a resource would do by hand: a linearizable Get of the holder's key,
// comparing its create revision with the token.
func (b *bench) validate(c cell, rep int, profile string) (result, error) {
	id := b.seq.Add(1)
	type lock struct {
		name  string
		token int64
		key   string
		h     held
	}
	locks := make([]lock, c.clients)
	if c.system == sysFloor {
		locks = nil
	}
	sys := sysCoord
	if c.system == sysGet {
		sys = sysMutex
	}
	ctx, cancel := bg()
	defer cancel()
	for w := range locks {
		name := fmt.Sprintf("v%d/w%d", id, w)
		h, err := b.systems[sys].lock(ctx, w, name)
		if err != nil {
			return result{}, fmt.Errorf("validate setup: %w", err)
		}
		locks[w] = lock{name: name, token: h.token, key: h.key, h: h}
		if c.system == sysGet {
			r, err := b.cl.etcd[0].Get(ctx, h.key)
			if err != nil {
				return result{}, fmt.Errorf("validate setup: read %q: %w", h.key, err)
			}
			if len(r.Kvs) != 1 {
				return result{}, fmt.Errorf("validate setup: read %q: %d keys, want 1", h.key, len(r.Kvs))
			}
			locks[w].token = r.Kvs[0].CreateRevision
		}
	}
	defer func() {
		for _, lk := range locks {
			rctx, cancel := bg()
			_ = lk.h.release(rctx)
			cancel()
		}
	}()
	var fn op
	switch c.system {
	case sysFloor:
		fn = func(ctx context.Context, w int) (time.Duration, bool, error) {
			t := time.Now()
			r, err := b.cl.health[w%len(b.cl.health)].Check(ctx, &healthpb.HealthCheckRequest{})
			lat := time.Since(t)
			if err == nil && r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				err = fmt.Errorf("health: %v", r.GetStatus())
			}
			return lat, true, err
		}
	case sysGet:
		fn = func(ctx context.Context, w int) (time.Duration, bool, error) {
			lk := locks[w]
			t := time.Now()
			r, err := b.cl.etcd[w%len(b.cl.etcd)].Get(ctx, lk.key)
			lat := time.Since(t)
			if err == nil && (len(r.Kvs) != 1 || r.Kvs[0].CreateRevision != lk.token) {
				err = fmt.Errorf("lock %q: token %d is not current", lk.key, lk.token)
			}
			return lat, true, err
		}
	default:
		fn = func(ctx context.Context, w int) (time.Duration, bool, error) {
			lk := locks[w]
			lc := b.cl.coord[w%len(b.cl.coord)]
			t := time.Now()
			r, err := lc.ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: lk.name, Token: lk.token})
			lat := time.Since(t)
			if err == nil && !r.GetValid() {
				err = fmt.Errorf("lock %q: token %d: %v", lk.name, lk.token, r.GetReason())
			}
			return lat, true, err
		}
	}
	return b.window(c, rep, c.clients, 5*time.Second, profile, fn), nil
}

// heldPrefix starts the names of the held-lock scenario's locks.
const heldPrefix = "held/"

// heldLock is one of the locks the held-lock scenario keeps.
type heldLock struct {
	name   string
	token  int64
	handle string
}

// fill grows the set of held coordinatord locks to n, with 64 concurrent
// acquirers, and returns it.
func (b *bench) fill(hs []heldLock, n int) ([]heldLock, error) {
	const par = 64
	start := len(hs)
	if n <= start {
		return hs, nil
	}
	hs = slices.Grow(hs, n-start)[:n]
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		first atomic.Value
	)
	next.Store(int64(start))
	for w := range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lc := b.cl.coord[w%len(b.cl.coord)]
			for {
				i := int(next.Add(1) - 1)
				if i >= n || first.Load() != nil {
					return
				}
				name := fmt.Sprintf("%s%07d", heldPrefix, i)
				ctx, cancel := bg()
				g, err := lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: name, Ttl: durationpb.New(50 * time.Minute)})
				cancel()
				if err != nil {
					first.CompareAndSwap(nil, fmt.Errorf("fill %s: %w", name, err))
					return
				}
				hs[i] = heldLock{name: name, token: g.GetToken(), handle: g.GetHandle()}
			}
		}()
	}
	wg.Wait()
	if err, _ := first.Load().(error); err != nil {
		return hs, err
	}
	return hs, nil
}

// drain frees every held lock at once by deleting their queue keys in one
// etcd request (releasing 100k locks one by one would take minutes: each
// lease revoke forces an etcd backend commit). Their leases, now empty, end
// with their TTL, or with the benchmark's etcd.
func (b *bench) drain() {
	ctx, cancel := bg()
	defer cancel()
	prefix := strings.TrimSuffix(lease.NewKeyspace(coordPrefix).Queue(heldPrefix), "/")
	r, err := b.cl.etcd[0].Delete(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordbench: freeing the held locks:", err)
		return
	}
	fmt.Fprintf(os.Stderr, "held: freed %d locks\n", r.Deleted)
}

// compact compacts etcd's history up to now between cells, as a production
// etcd's auto-compaction would, so that a long run neither slows down on
// history nor reaches etcd's space quota. Not timed.
func (b *bench) compact() {
	ctx, cancel := bg()
	defer cancel()
	cli := b.cl.etcd[0]
	r, err := cli.Get(ctx, "compact-probe")
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordbench: compact:", err)
		return
	}
	if _, err := cli.Compact(ctx, r.Header.Revision, clientv3.WithCompactPhysical()); err != nil && status.Code(err) != codes.OutOfRange && !errors.Is(err, rpctypes.ErrCompacted) {
		fmt.Fprintln(os.Stderr, "coordbench: compact:", err)
	}
}
