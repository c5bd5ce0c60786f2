package daemon_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/daemon"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/logutil.(*MergeLogger).outputLoop"),
	)
}

// running is a daemon.Run in this process.
type running struct {
	t                     *testing.T
	addr, metrics, health string
	done                  chan error
	cancel                context.CancelFunc
}

// testCore is the core the suite runs on: COORDINATORD_TEST_CORE=shard
// runs it on the shard-owner core, else the queue core.
func testCore() string { return os.Getenv("COORDINATORD_TEST_CORE") }

// onTestCore puts cfg on the suite's core unless its test chose one: the
// shard core with a 2 s member lease, as internal/server's suite runs it.
func onTestCore(cfg daemon.Config) daemon.Config {
	if cfg.Core == "" && testCore() == daemon.CoreShard {
		cfg.Core = daemon.CoreShard
		if cfg.ShardLeaseTTL == 0 {
			cfg.ShardLeaseTTL = 2 * time.Second
		}
	}
	return cfg
}

// run serves cfg on the suite's core (onTestCore) as daemon.Run does (New,
// Run, Close), and returns once it listens and, a member of the shard
// core, serves every shard.
func run(t *testing.T, cfg daemon.Config) *running {
	t.Helper()
	cfg = onTestCore(cfg)
	r := &running{t: t, done: make(chan error, 1)}
	addrs := make(chan string, 3)
	cfg.Listen = "127.0.0.1:0"
	cfg.OnListen = func(a net.Addr) { addrs <- "grpc " + a.String() }
	want := 1
	if cfg.MetricsListen != "" {
		cfg.OnMetricsListen = func(a net.Addr) { addrs <- "http " + a.String() }
		want++
	}
	if cfg.HealthListen != "" {
		cfg.OnHealthListen = func(a net.Addr) { addrs <- "health " + a.String() }
		want++
	}
	if cfg.DefaultTTL == 0 {
		cfg.DefaultTTL, cfg.MaxTTL = 15*time.Second, 5*time.Minute
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 5 * time.Second
	}
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	started := make(chan *daemon.Daemon, 1)
	go func() {
		d, err := daemon.New(ctx, cfg.WithDefaults())
		if err != nil {
			r.done <- err
			return
		}
		started <- d
		err = d.Run(ctx)
		d.Close()
		r.done <- err
	}()
	for range want {
		select {
		case a := <-addrs:
			kind, addr, _ := strings.Cut(a, " ")
			switch kind {
			case "grpc":
				r.addr = addr
			case "http":
				r.metrics = addr
			case "health":
				r.health = addr
			}
		case err := <-r.done:
			t.Fatalf("daemon.Run ended before serving: %v", err)
		case <-time.After(60 * time.Second):
			t.Fatal("daemon not serving after 60s")
		}
	}
	t.Cleanup(r.stop)
	if cfg.Core == daemon.CoreShard && cfg.Role != daemon.RoleRelay {
		awaitShards(t, <-started)
	}
	return r
}

// awaitShards waits until the member d serves every shard: before, a call
// on a shard still loading answers SHARD_NOT_SERVED.
func awaitShards(t *testing.T, d *daemon.Daemon) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st := d.Shards().Status()
		if st.Serving == st.Shards {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon serves %d of %d shards 30s after start", st.Serving, st.Shards)
		}
	}
}

func (r *running) stop() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	if err := <-r.done; err != nil {
		r.t.Logf("daemon.Run after cancel: %v", err)
	}
}

func (r *running) conn(t *testing.T, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	c, err := grpc.NewClient(r.addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not true after 30s: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// scrape returns metric family -> "label=value,..." -> value (counter,
// gauge, or histogram sample count).
func scrape(t *testing.T, base string) map[string]map[string]float64 {
	t.Helper()
	code, body := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for name, f := range fams {
		out[name] = map[string]float64{}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			out[name][strings.Join(labels, ",")] = value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return -1
}

func TestMetricsAfterAScriptedScenario(t *testing.T) {
	e, err := embedetcd.Start(context.Background(), t.TempDir(), embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	r := run(t, daemon.Config{EtcdEndpoints: e.Endpoints(), KeyPrefix: "/m/", MetricsListen: "127.0.0.1:0"})
	base := "http://" + r.metrics
	conn := r.conn(t)
	lc := coordinatorv1.NewLockServiceClient(conn)
	eventually(t, "/readyz answers 200", func() bool { c, _ := get(t, base+"/readyz"); return c == http.StatusOK })

	// The script.
	a, err := lc.Acquire(ctxT(t), &coordinatorv1.AcquireRequest{Name: "x", Ttl: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lc.Acquire(ctxT(t), &coordinatorv1.AcquireRequest{Name: "y"}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // try-locks: not granted
		if _, err := lc.Acquire(ctxT(t), &coordinatorv1.AcquireRequest{Name: "x", Wait: durationpb.New(0)}); err == nil {
			t.Fatal("try-lock of a held lock granted")
		}
	}
	if _, err := lc.Acquire(ctxT(t), &coordinatorv1.AcquireRequest{Name: ""}); err == nil { // invalid_argument
		t.Fatal("empty name granted")
	}
	waitCtx, stopWaiting := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() {
		_, err := lc.Acquire(waitCtx, &coordinatorv1.AcquireRequest{Name: "x"})
		waited <- err
	}()
	eventually(t, "one waiter counted", func() bool {
		m := scrape(t, base)
		return m["coordinatord_lock_waiters"][""] == 1 && m["coordinatord_locks_held"][""] == 2
	})
	stopWaiting()
	t.Logf("cancelled waiter: %v", <-waited)
	for _, tok := range []int64{a.Token, a.Token - 1, a.Token + 1000} {
		if _, err := lc.ValidateToken(ctxT(t), &coordinatorv1.ValidateTokenRequest{Name: "x", Token: tok}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := lc.KeepAlive(ctxT(t), &coordinatorv1.KeepAliveRequest{Name: "x", Token: a.Token, Handle: a.Handle}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // released, then not_released
		if _, err := lc.Release(ctxT(t), &coordinatorv1.ReleaseRequest{Name: "x", Token: a.Token, Handle: a.Handle}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := lc.KeepAlive(ctxT(t), &coordinatorv1.KeepAliveRequest{Name: "x", Token: a.Token, Handle: a.Handle}); err == nil {
		t.Fatal("KeepAlive after release succeeded")
	}

	// One grant force-released, one left to expire (TTL 1s): no RPC sees
	// the expiry, the lock-end watch does.
	f, err := lc.Acquire(ctxT(t), &coordinatorv1.AcquireRequest{Name: "f", Ttl: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := lc.ForceRelease(ctxT(t), &coordinatorv1.ForceReleaseRequest{Name: "f", Token: f.Token}); err != nil || !r.GetReleased() {
		t.Fatalf("force-release: %v %v", r, err)
	}
	if _, err := lc.Acquire(ctxT(t), &coordinatorv1.AcquireRequest{Name: "e", Ttl: durationpb.New(time.Second)}); err != nil {
		t.Fatal(err)
	}

	cc := coordinatorv1.NewCounterServiceClient(conn)
	for range 2 { // allowed, then refused
		if _, err := cc.Hit(ctxT(t), &coordinatorv1.HitRequest{Name: "c", Limit: 1, Window: durationpb.New(time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cc.Hit(ctxT(t), &coordinatorv1.HitRequest{Name: "c"}); err == nil {
		t.Fatal("Hit without a limit succeeded")
	}

	var m map[string]map[string]float64
	eventually(t, "the cancelled waiter's key is gone and the expiry counted", func() bool {
		m = scrape(t, base)
		// (The expiry's count and its hold time are two updates: a scrape
		// may fall between them.)
		// A waiter cancelled as it was granted gives its grant up
		// (abandon): held counts it until that release commits.
		return m["coordinatord_lock_waiters"][""] == 0 && m["coordinatord_expirations_total"][""] == 1 &&
			m["coordinatord_hold_seconds"]["outcome=expired"] == 1 && m["coordinatord_locks_held"][""] == 1
	})
	for _, c := range []struct {
		family, labels string
		want           float64
	}{
		{"coordinatord_acquisitions_total", "outcome=granted", 4},
		{"coordinatord_grants_total", "kind=mutex", 4},
		{"coordinatord_acquisitions_total", "outcome=not_granted", 2},
		{"coordinatord_acquisitions_total", "outcome=invalid_argument", 1},
		{"coordinatord_acquisitions_total", "outcome=canceled", 1},
		{"coordinatord_acquire_wait_seconds", "outcome=granted", 4},
		{"coordinatord_acquire_wait_seconds", "outcome=canceled", 1},
		{"coordinatord_validations_total", "outcome=current", 1},
		{"coordinatord_validations_total", "outcome=superseded", 1},
		{"coordinatord_validations_total", "outcome=not_held", 1},
		{"coordinatord_validations_total", "outcome=fenced", 0},
		{"coordinatord_releases_total", "outcome=released", 1},
		{"coordinatord_releases_total", "outcome=not_released", 1},
		{"coordinatord_renewals_total", "outcome=renewed", 1},
		{"coordinatord_renewals_total", "outcome=not_found", 1},
		{"coordinatord_locks_held", "", 1}, // y
		{"coordinatord_lock_waiters", "", 0},
		{"coordinatord_hold_seconds", "outcome=released", 1}, // x
		{"coordinatord_hold_seconds", "outcome=forced", 1},   // f
		{"coordinatord_hold_seconds", "outcome=expired", 1},  // e
		{"coordinatord_expirations_total", "", 1},
		{"coordinatord_counter_hits_total", "outcome=allowed", 1},
		{"coordinatord_counter_hits_total", "outcome=refused", 1},
		{"coordinatord_counter_hits_total", "outcome=invalid_argument", 1},
		{"coordinatord_counter_hits_total", "outcome=uncounted", 0},
		{"grpc_server_handled_total", "grpc_code=OK,grpc_method=Acquire,grpc_service=coordinator.v1.LockService,grpc_type=unary", 4},
		{"grpc_server_handled_total", "grpc_code=Aborted,grpc_method=Acquire,grpc_service=coordinator.v1.LockService,grpc_type=unary", 2},
		{"grpc_server_handled_total", "grpc_code=OK,grpc_method=ValidateToken,grpc_service=coordinator.v1.LockService,grpc_type=unary", 3},
		{"grpc_server_handling_seconds", "grpc_method=Release,grpc_service=coordinator.v1.LockService,grpc_type=unary", 2},
		{"grpc_server_started_total", "grpc_method=List,grpc_service=coordinator.v1.LockService,grpc_type=unary", 0},
	} {
		got, ok := m[c.family][c.labels]
		if !ok || got != c.want {
			t.Errorf("%s{%s} = %v (present %v), want %v", c.family, c.labels, got, ok, c.want)
		}
	}
	if _, ok := m["go_goroutines"]; !ok {
		t.Error("no Go runtime metrics")
	}

	// Liveness stays up while etcd is gone; readiness follows etcd, over
	// HTTP and on the gRPC health service "coordinator.v1.LockService".
	hc := healthpb.NewHealthClient(conn)
	svc := func(name string) healthpb.HealthCheckResponse_ServingStatus {
		h, err := hc.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: name})
		if err != nil {
			t.Fatal(err)
		}
		return h.Status
	}
	if s := svc("coordinator.v1.LockService"); s != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("readiness health before etcd stops: %v", s)
	}
	e.Close()
	eventually(t, "/readyz answers 503 once etcd is gone", func() bool { c, _ := get(t, base+"/readyz"); return c == http.StatusServiceUnavailable })
	eventually(t, "gRPC readiness NOT_SERVING", func() bool { return svc("coordinator.v1.LockService") == healthpb.HealthCheckResponse_NOT_SERVING })
	if c, _ := get(t, base+"/healthz"); c != http.StatusOK {
		t.Fatalf("/healthz with etcd gone: %d, want 200", c)
	}
	if s := svc(""); s != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("liveness health with etcd gone: %v", s)
	}
	r.stop()
}

func TestLimitsAreWired(t *testing.T) {
	r := run(t, daemon.Config{MaxRecvMsgSize: 1024, MaxWaitersPerLock: 1, MaxWait: time.Minute, RateLimit: 0.01, RateBurst: 100})
	lc := coordinatorv1.NewLockServiceClient(r.conn(t))
	if _, err := lc.Describe(ctxT(t), &coordinatorv1.DescribeRequest{Name: strings.Repeat("n", 2000)}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("2 KB message: %v, want RESOURCE_EXHAUSTED", err)
	}
	if _, err := lc.Acquire(ctxT(t), &coordinatorv1.AcquireRequest{Name: "l"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() { _, err := lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "l"}); waited <- err }()
	eventually(t, "one waiter", func() bool {
		d, err := lc.Describe(ctxT(t), &coordinatorv1.DescribeRequest{Name: "l"})
		return err == nil && len(d.Waiters) == 1
	})
	if _, err := lc.Acquire(ctxT(t), &coordinatorv1.AcquireRequest{Name: "l"}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second waiter with max 1: %v, want RESOURCE_EXHAUSTED", err)
	}
	if _, err := lc.Acquire(ctxT(t), &coordinatorv1.AcquireRequest{Name: "l", Wait: durationpb.New(time.Hour)}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("wait above max: %v, want INVALID_ARGUMENT", err)
	}
	cancel()
	t.Logf("cancelled waiter: %v", <-waited)
	var err error
	for range 200 { // burst 100: this caller runs out
		if _, err = lc.ValidateToken(ctxT(t), &coordinatorv1.ValidateTokenRequest{Name: "l", Token: 1}); err != nil {
			break
		}
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("beyond the rate burst: %v, want RESOURCE_EXHAUSTED", err)
	}
	if _, err := healthpb.NewHealthClient(r.conn(t)).Check(ctxT(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health is not rate limited: %v", err)
	}
	r.stop()
}

// A daemon stopped as soon as it starts (a SIGTERM right after "serving")
// still stops cleanly: a server whose Serve had not begun when the drain
// stopped it is not a failure. It used to be one ("grpc serve: the server
// has been stopped"), and coordinatord exited 1 on a plain SIGTERM.
func TestRunStoppedBeforeItServesReturnsNil(t *testing.T) {
	for i := range 5 {
		cfg := daemon.Config{
			Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", HealthListen: "127.0.0.1:0",
			DataDir: t.TempDir(), DefaultTTL: 15 * time.Second, MaxTTL: time.Minute, ShutdownTimeout: 5 * time.Second,
		}
		d, err := daemon.New(ctxT(t), onTestCore(cfg).WithDefaults())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err = d.Run(ctx)
		d.Close()
		if err != nil {
			t.Fatalf("run %d: Run stopped at once: %v, want nil", i, err)
		}
	}
}
