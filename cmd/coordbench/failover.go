package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	sdk "github.com/coordinatord/coordinatord/client"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// The failover scenario (-core shard): 3 member replicas (the main child
// and two more, each on an address it keeps across restarts) under the
// uncontended load of the most -clients workers. The workers use the Go SDK
// (AcquireGrant, then Release: each retries UNAVAILABLE answers, an
// acquisition always with its one request id, as any program on the SDK
// does); each worker's gRPC connection balances round-robin over the 3
// members' addresses (a load balancer in front of the replicas), and every
// cycle takes a new name. Each repetition:
//
//  1. steady: -duration of load while nothing happens, the baseline of the
//     pauses;
//  2. rolling restart: each member in turn stopped gracefully (its stdin
//     closed: the daemon drains and hands its shards over), started again
//     on its address, and waited for until the shards are settled over the
//     3 again;
//  3. kill: one member other than the main child, the owner of about a
//     third of the shards, is sent SIGKILL: no drain, no hand-over, its
//     etcd lease abandoned. A probe per shard it owned tries, through the
//     two survivors, to acquire fresh names of that shard (each try once,
//     without waiting in a queue) until one is granted. The time from the
//     kill to the last of those first grants is when every one of its
//     shards serves again: target -shard-lease-ttl + 2 s.
//  4. the killed member is started again on its address, and the shards
//     settle over the 3.
//
// A failed call is an SDK call that returned an error (after its retries,
// within failCallTimeout) or a release that released nothing. A pause is
// the longest time one worker went without completing a cycle (between two
// of its completions, or from its last one to the end); the whole load's
// gap is the longest time without any completion. Each counts in every
// phase it overlaps (in the steady phase only if it ends there).

// failCallTimeout bounds each SDK call of the failover load (its retries
// included).
const failCallTimeout = 20 * time.Second

// Phases of a failover repetition.
type failPhase int

const (
	phSteady failPhase = iota
	phRolling
	phBetween
	phKill
	phRestore
	nPhases
)

type phaseStats struct {
	ops, failed, unavailable atomic.Int64
	slow                     atomic.Int64 // cycles that took over 300 ms
	ambiguous                atomic.Int64 // releases that released nothing after an UNAVAILABLE answer was retried
	pause, gap               atomic.Int64 // ns, the longest
	mu                       sync.Mutex
	firstErr                 string
}

func (s *phaseStats) fail(err error) {
	s.failed.Add(1)
	s.mu.Lock()
	if s.firstErr == "" {
		s.firstErr = err.Error()
	}
	s.mu.Unlock()
}

func setMax(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// failLoad is the failover scenario's load.
type failLoad struct {
	base     time.Time
	starts   [nPhases]atomic.Int64 // ns since base when each phase began; 0: not yet (they begin in order)
	stats    [nPhases]phaseStats
	lastAny  atomic.Int64
	stopping atomic.Bool
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	conns    []*grpc.ClientConn
	clients  []*sdk.Client
}

func (l *failLoad) now() int64 { return max(int64(time.Since(l.base)), 1) }

func (l *failLoad) begin(p failPhase) { l.starts[p].Store(l.now()) }

// at is the phase going on at t, ok false before the first.
func (l *failLoad) at(t int64) (failPhase, bool) {
	for p := nPhases - 1; p >= phSteady; p-- {
		if s := l.starts[p].Load(); s != 0 && s <= t {
			return p, true
		}
	}
	return 0, false
}

// span is when phase p began and ended (math.MaxInt64 while it goes on).
func (l *failLoad) span(p failPhase) (start, end int64) {
	start, end = l.starts[p].Load(), int64(math.MaxInt64)
	for q := p + 1; q < nPhases; q++ {
		if v := l.starts[q].Load(); v != 0 {
			return start, v
		}
	}
	return start, end
}

// each calls f with the stats of every phase the interval (a, z] overlaps,
// but of the steady phase (the baseline) only if it ends within it: a
// stall that the rolling restart begun after it causes is the restart's.
func (l *failLoad) each(a, z int64, f func(*phaseStats)) {
	for p := range nPhases {
		s, e := l.span(p)
		if s != 0 && s < z && a < e && (p != phSteady || z <= e) {
			f(&l.stats[p])
		}
	}
}

// seconds is how long phase p lasted.
func (l *failLoad) seconds(p failPhase) float64 {
	s, e := l.span(p)
	if s == 0 || e == math.MaxInt64 {
		return 0
	}
	return time.Duration(e - s).Seconds()
}

// dialBalanced is a connection that balances round-robin over addrs and
// reconnects to a member that restarted from 50 ms on (at most every
// second, as the replicas' connections to each other do); the UNAVAILABLE
// answers through it are counted.
func (l *failLoad) dialBalanced(addrs []string) (*grpc.ClientConn, error) {
	r := manual.NewBuilderWithScheme("coordbench")
	var as []resolver.Address
	for _, a := range addrs {
		as = append(as, resolver.Address{Addr: a})
	}
	r.InitialState(resolver.State{Addresses: as})
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if status.Code(err) == codes.Unavailable {
			if p, ok := l.at(l.now()); ok {
				l.stats[p].unavailable.Add(1)
			}
			if n, ok := ctx.Value(unavailableKey{}).(*atomic.Int32); ok {
				n.Add(1)
			}
		}
		return err
	}
	return grpc.NewClient(r.Scheme()+":///members", grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}),
		grpc.WithChainUnaryInterceptor(count))
}

// startFailLoad starts workers cycling over conns balanced connections to
// addrs; phase steady has not begun.
func startFailLoad(addrs []string, conns, workers int, id int64) (*failLoad, error) {
	l := &failLoad{base: time.Now()}
	for range conns {
		cc, err := l.dialBalanced(addrs)
		if err != nil {
			l.stop()
			return nil, err
		}
		l.conns = append(l.conns, cc)
		l.clients = append(l.clients, sdk.New(cc))
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	l.lastAny.Store(l.now())
	for w := range workers {
		l.wg.Go(func() { l.worker(ctx, w, l.clients[w%len(l.clients)], id) })
	}
	return l, nil
}

func (l *failLoad) worker(ctx context.Context, w int, c *sdk.Client, id int64) {
	last := l.now()
	for i := 0; ; i++ {
		if l.stopping.Load() {
			break
		}
		start := l.now()
		err := failCycle(ctx, c, fmt.Sprintf("f%d/w%d/%d", id, w, i))
		end := l.now()
		if l.stopping.Load() {
			break
		}
		if time.Duration(end-start) > 300*time.Millisecond {
			l.each(start, end, func(s *phaseStats) { s.slow.Add(1) })
		}
		if errors.Is(err, errAmbiguousRelease) {
			// The release's first attempt answered UNAVAILABLE and may
			// have released the grant: the retry found it gone. Counted,
			// and not a failure: the lock is released either way.
			l.each(start, end, func(s *phaseStats) { s.ambiguous.Add(1) })
			err = nil
		}
		if err != nil {
			l.each(start, end, func(s *phaseStats) { s.fail(err) })
			time.Sleep(10 * time.Millisecond)
			continue
		}
		pause := end - last
		l.each(last, end, func(s *phaseStats) { setMax(&s.pause, pause) })
		if prev := l.lastAny.Swap(end); end > prev {
			l.each(prev, end, func(s *phaseStats) { setMax(&s.gap, end-prev) })
		}
		if p, ok := l.at(end); ok {
			l.stats[p].ops.Add(1)
		}
		last = end
	}
	// A worker stalled when the load stops: its pause so far counts.
	end := l.now()
	l.each(last, end, func(s *phaseStats) { setMax(&s.pause, end-last) })
}

// unavailableKey carries, in a call's context, the count of UNAVAILABLE
// answers its attempts got.
type unavailableKey struct{}

// errAmbiguousRelease: a release released nothing after an UNAVAILABLE
// answer was retried (that first attempt may have released the grant).
var errAmbiguousRelease = errors.New("released nothing after a retried UNAVAILABLE answer")

// failCycle acquires name and releases it through the SDK.
func failCycle(ctx context.Context, c *sdk.Client, name string) error {
	ctx, cancel := context.WithTimeout(ctx, failCallTimeout)
	defer cancel()
	g, err := c.AcquireGrant(ctx, name, sdk.WithTTL(benchTTL))
	if err != nil {
		return fmt.Errorf("acquire %q: %w", name, err)
	}
	var retried atomic.Int32
	ok, err := c.Release(context.WithValue(ctx, unavailableKey{}, &retried), g.GrantRef)
	switch {
	case err != nil:
		return fmt.Errorf("release %q token %d: %w", name, g.Token, err)
	case !ok && retried.Load() > 0:
		return fmt.Errorf("release %q token %d: %w", name, g.Token, errAmbiguousRelease)
	case !ok:
		return fmt.Errorf("release %q token %d: released nothing at its first attempt (the grant was gone)", name, g.Token)
	}
	return nil
}

// stop ends the load (the last phase ends now) and waits for the workers.
func (l *failLoad) stop() {
	l.stopping.Store(true)
	if l.cancel != nil {
		l.cancel()
	}
	l.wg.Wait()
	for _, c := range l.clients {
		_ = c.Close()
	}
	for _, cc := range l.conns {
		_ = cc.Close()
	}
}

// phaseSummary is what the load saw in one phase of a repetition.
type phaseSummary struct {
	rate        float64 // cycles/s
	failed      int64   // SDK calls that returned an error
	unavailable int64   // UNAVAILABLE answers the SDK retried
	slow        int64   // cycles that took over 300 ms
	ambiguous   int64   // releases that released nothing after a retried UNAVAILABLE answer
	pause, gap  time.Duration
	firstErr    string
}

func (l *failLoad) summary(p failPhase) phaseSummary {
	st := &l.stats[p]
	sum := phaseSummary{failed: st.failed.Load(), unavailable: st.unavailable.Load(), slow: st.slow.Load(), ambiguous: st.ambiguous.Load(),
		pause: time.Duration(st.pause.Load()), gap: time.Duration(st.gap.Load()), firstErr: st.firstErr}
	if s := l.seconds(p); s > 0 {
		sum.rate = float64(st.ops.Load()) / s
	}
	return sum
}

func (s phaseSummary) String() string {
	e := ""
	if s.firstErr != "" {
		e = fmt.Sprintf(" (first: %s)", s.firstErr)
	}
	return fmt.Sprintf("%.0f cycles/s, %d failed calls%s, %d UNAVAILABLE retried, %d releases of nothing after a retry, %d cycles over 300 ms, pause %v, gap %v",
		s.rate, s.failed, e, s.unavailable, s.ambiguous, s.slow, s.pause.Round(time.Millisecond), s.gap.Round(time.Millisecond))
}

// failoverResult is one repetition of the failover scenario.
type failoverResult struct {
	rep                int
	shards             int             // shards of the killed member
	served             []time.Duration // each of its shards: kill -> first grant; < 0 if not within the probe's limit
	rollTook           time.Duration
	rollBack           []time.Duration // each member: from its stop to the shards settled again
	steady, roll, kill phaseSummary
}

// servedAll is the time until every shard of the killed member served
// again, and whether all did within the probe's limit.
func (f failoverResult) servedAll() (time.Duration, bool) {
	if len(f.served) == 0 {
		return 0, false
	}
	worst := time.Duration(0)
	for _, d := range f.served {
		if d < 0 {
			return 0, false
		}
		worst = max(worst, d)
	}
	return worst, true
}

// failover runs one repetition.
func (b *bench) failover(rep int) (failoverResult, error) {
	res := failoverResult{rep: rep}
	if err := b.setMembers(3); err != nil {
		return res, err
	}
	id := b.seq.Add(1)
	load, err := startFailLoad(b.memberAddrs(), b.cfg.conns, slices.Max(b.cfg.clients), id)
	if err != nil {
		return res, err
	}
	stopped := false
	defer func() {
		if !stopped {
			load.stop()
		}
	}()
	settle := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return b.waitSettled(ctx)
	}

	time.Sleep(b.cfg.warmup)
	load.begin(phSteady)
	time.Sleep(b.cfg.duration)

	// The rolling restart: every member in turn, the main child last.
	load.begin(phRolling)
	t := time.Now()
	order := append(slices.Clone(b.extra), b.coord)
	for _, m := range order {
		t0 := time.Now()
		stopLogged(roleCoordinator, m)
		c, err := b.startMember(m.addr)
		if err != nil {
			return res, fmt.Errorf("rolling restart: %w", err)
		}
		if m == b.coord {
			b.coord = c
		} else {
			b.extra[slices.Index(b.extra, m)] = c
		}
		if err := settle(); err != nil {
			return res, fmt.Errorf("rolling restart: %w", err)
		}
		res.rollBack = append(res.rollBack, time.Since(t0))
	}
	res.rollTook = time.Since(t)
	time.Sleep(500 * time.Millisecond) // a stall that ends just after the restart counts in it
	load.begin(phBetween)
	time.Sleep(min(b.cfg.duration, time.Second))

	// kill -9 of an owner (not the main child).
	ctx, cancel := bg()
	v, err := readShardView(ctx, b.cl.etcd[0])
	cancel()
	if err != nil {
		return res, err
	}
	vi := rep % len(b.extra)
	victim := b.extra[vi]
	shards := v.ownedBy(victim.addr)
	res.shards = len(shards)
	if len(shards) == 0 {
		return res, fmt.Errorf("the member at %s owns no shard", victim.addr)
	}
	var survivors []string
	for _, m := range b.members() {
		if m != victim {
			survivors = append(survivors, m.addr)
		}
	}
	probes, err := newProbes(survivors, v.count, id)
	if err != nil {
		return res, err
	}
	load.begin(phKill)
	killed := time.Now()
	victim.kill()
	res.served = probes.untilServed(shards, killed, b.cfg.shardTTL+30*time.Second)
	probes.close()
	time.Sleep(time.Second) // the load's calls on those shards complete
	load.begin(phRestore)
	c, err := b.startMember(victim.addr)
	if err != nil {
		return res, fmt.Errorf("restart the killed member: %w", err)
	}
	b.extra[vi] = c
	if err := settle(); err != nil {
		return res, fmt.Errorf("after the kill: %w", err)
	}
	time.Sleep(200 * time.Millisecond)
	load.stop()
	stopped = true

	res.steady, res.roll, res.kill = load.summary(phSteady), load.summary(phRolling), load.summary(phKill)
	all, ok := res.servedAll()
	fmt.Fprintf(os.Stderr, "failover rep %d: steady: %v\nfailover rep %d: rolling restart in %v (each member back after %v): %v\nfailover rep %d: kill -9 of the owner of %d shards: all served again after %v (all within the limit: %v); the load: %v\n",
		rep, res.steady, rep, res.rollTook.Round(time.Millisecond), roundAll(res.rollBack), res.roll, rep, res.shards, all.Round(time.Millisecond), ok, res.kill)
	return res, nil
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// probes acquire fresh names of given shards through the survivors.
type probes struct {
	conns []*grpc.ClientConn
	lcs   []coordinatorv1.LockServiceClient
	count int // shards
	id    int64
}

func newProbes(addrs []string, count int, id int64) (*probes, error) {
	p := &probes{count: count, id: id}
	for _, a := range addrs {
		cc, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			p.close()
			return nil, err
		}
		p.conns = append(p.conns, cc)
		p.lcs = append(p.lcs, coordinatorv1.NewLockServiceClient(cc))
	}
	return p, nil
}

func (p *probes) close() {
	for _, cc := range p.conns {
		_ = cc.Close()
	}
}

// name is the k-th probe name of shard s at or after *k.
func (p *probes) name(s uint32, k *int) string {
	for ; ; *k++ {
		n := fmt.Sprintf("probe%d/%d/%d", p.id, s, *k)
		if shard.ShardOf(n, p.count) == s {
			*k++
			return n
		}
	}
}

// untilServed probes each shard until a fresh name of it is granted (each
// try once, without waiting, with a 1 s deadline: a call on a shard nobody
// serves is refused within about 0.6 s, after the forwarding replica's
// retries), for at most limit from t0; it returns each shard's time from
// t0 to its first grant, -1 if none within the limit.
func (p *probes) untilServed(shards []uint32, t0 time.Time, limit time.Duration) []time.Duration {
	out := make([]time.Duration, len(shards))
	var wg sync.WaitGroup
	for i, s := range shards {
		wg.Go(func() {
			lc := p.lcs[i%len(p.lcs)]
			out[i] = -1
			k := 0
			for time.Since(t0) < limit {
				name := p.name(s, &k)
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				g, err := lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: name, Ttl: durationpb.New(benchTTL), Wait: durationpb.New(0)})
				cancel()
				if err == nil {
					out[i] = time.Since(t0)
					rctx, cancel := bg()
					_, _ = lc.Release(rctx, &coordinatorv1.ReleaseRequest{Name: name, Token: g.GetToken(), Handle: g.GetHandle()})
					cancel()
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	return out
}

// failoverMarkdown is the failover scenario's table.
func (rp *report) failoverMarkdown() string {
	if len(rp.failovers) == 0 {
		return ""
	}
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	n := slices.Max(rp.cfg.clients)
	w("### Failover (shard core, 3 members)\n\n")
	w("%d workers cycle acquire+release on new names through the Go SDK (its retries of UNAVAILABLE), each connection round-robin over the 3 members. Each repetition: a steady window (%v), a rolling restart (each member in turn stopped gracefully, started again on its address, the shards settled), then a kill -9 of a member owning about a third of the shards (lease TTL %v): a probe per shard it owned acquires fresh names of that shard through the survivors until one is granted. Failed calls: SDK calls that returned an error. Pause: the longest any one worker went without completing a cycle; gap: the longest without any completion.\n\n",
		n, rp.cfg.duration, rp.cfg.shardTTL)
	w("| rep | phase | cycles/s | failed calls | UNAVAILABLE retried | releases of nothing after a retry | cycles over 300 ms | pause (one client) | gap (whole load) | |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, f := range rp.failovers {
		first := time.Duration(-1)
		for _, d := range f.served {
			if d >= 0 && (first < 0 || d < first) {
				first = d
			}
		}
		all := "not all within the limit"
		if d, ok := f.servedAll(); ok {
			all = secs(d)
		}
		for _, ph := range []struct {
			name string
			s    phaseSummary
			note string
		}{
			{"steady", f.steady, ""},
			{"rolling restart", f.roll, fmt.Sprintf("took %s (each member back after %s)", secs(f.rollTook), joinSecs(f.rollBack))},
			{"kill -9", f.kill, fmt.Sprintf("the killed member's %d shards: the first served again after %s, all after %s", f.shards, secs(first), all)},
		} {
			s := ph.s
			w("| %d | %s | %s | %d | %d | %d | %d | %s | %s | %s |\n", f.rep+1, ph.name, thousands(s.rate), s.failed, s.unavailable, s.ambiguous, s.slow,
				msDur(s.pause), msDur(s.gap), ph.note)
		}
	}
	w("\n")
	for _, f := range rp.failovers {
		for _, ph := range []struct {
			name string
			s    phaseSummary
		}{{"steady", f.steady}, {"rolling restart", f.roll}, {"kill -9", f.kill}} {
			if ph.s.firstErr != "" {
				w("- rep %d, %s, first failed call: `%s`\n", f.rep+1, ph.name, ph.s.firstErr)
			}
		}
	}
	w("\n")
	return b.String()
}

func msDur(d time.Duration) string { return ms(float64(d)) + " ms" }

func secs(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

func joinSecs(ds []time.Duration) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = fmt.Sprintf("%.2f", d.Seconds())
	}
	return strings.Join(s, ", ") + " s"
}

// failoverTargets: a killed owner's shards serve again within its lease TTL
// + 2 s (the worst repetition); a rolling restart fails no call and pauses
// no client more than 300 ms.
func (rp *report) failoverTargets() []target {
	if len(rp.failovers) == 0 {
		return nil
	}
	ttl := rp.cfg.shardTTL
	var worst time.Duration
	var alls []string
	allOK := true
	var failed, unavail, ambiguous int64
	var pause, gap, steady time.Duration
	for _, f := range rp.failovers {
		d, ok := f.servedAll()
		if !ok {
			allOK = false
			alls = append(alls, "not all")
		} else {
			alls = append(alls, fmt.Sprintf("%.2f", d.Seconds()))
		}
		worst = max(worst, d)
		failed += f.roll.failed
		unavail += f.roll.unavailable
		ambiguous += f.roll.ambiguous
		pause, gap, steady = max(pause, f.roll.pause), max(gap, f.roll.gap), max(steady, f.steady.pause)
	}
	m := fmt.Sprintf("%s (worst of %d kills: %s s)", secs(worst), len(rp.failovers), strings.Join(alls, ", "))
	if !allOK {
		m = fmt.Sprintf("some shards not served within %v (kills: %s)", ttl+30*time.Second, strings.Join(alls, ", "))
	}
	return []target{
		{goal: fmt.Sprintf("after kill -9 of an owner, its shards serve again within its lease TTL + 2 s (%v)", ttl+2*time.Second),
			measured: m, met: allOK && worst <= ttl+2*time.Second, known: true},
		{goal: "rolling restart of 3 replicas under load: no failed call",
			measured: fmt.Sprintf("%d failed calls in %d restarts (%d UNAVAILABLE answers retried by the SDK; %d releases released nothing after such a retry)", failed, len(rp.failovers), unavail, ambiguous),
			met:      failed == 0, known: true},
		{goal: "rolling restart of 3 replicas under load: longest pause <= 300 ms",
			measured: fmt.Sprintf("%s (the longest any client went without a completed cycle; the whole load's longest gap %s; in the steady windows %s)", msDur(pause), msDur(gap), msDur(steady)),
			met:      pause <= 300*time.Millisecond, known: true},
	}
}
