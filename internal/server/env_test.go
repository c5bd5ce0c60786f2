package server_test

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/chaos"
	"github.com/coordinatord/coordinatord/internal/coordinator"
	"github.com/coordinatord/coordinatord/internal/counter"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/fence"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/server"
	"github.com/coordinatord/coordinatord/internal/shard"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// grpc-go's and etcd's process-wide background goroutines.
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/logutil.(*MergeLogger).outputLoop"),
	)
}

// env is one coordinator (lease manager + gRPC server on loopback TCP) over
// one embedded etcd.
type env struct {
	t       *testing.T
	dataDir string
	etcd    *embedetcd.Server
	coord   *coordinator.Coordinator
	cli     *clientv3.Client // the coordinator's etcd client, for assertions
	mgr     *lease.Manager
	gs      *grpc.Server
	addr    string
	conn    *grpc.ClientConn
	lc      coordinatorv1.LockServiceClient
	stopped bool
	// fenceOpts configure the validators of the coordinator and its replicas.
	fenceOpts []fence.Option
	// counterOpts configure the counters of the coordinator and its replicas.
	counterOpts []counter.Option
	// onShards runs the coordinator and its replicas on the shard core
	// whatever the suite's core (COORDINATORD_TEST_CORE).
	onShards bool
	// replicas are the replicas started (replica), crashed or not.
	replicas []*replica
}

func newEnv(t *testing.T, opts ...lease.Option) *env {
	t.Helper()
	e := &env{t: t, dataDir: t.TempDir()}
	e.start(opts...)
	t.Cleanup(e.stop)
	return e
}

func (e *env) start(opts ...lease.Option) {
	t := e.t
	t.Helper()
	var err error
	// TCP, not the private socket: replicas reach etcd through a TCP fault
	// proxy.
	e.etcd, err = embedetcd.Start(context.Background(), e.dataDir, embedetcd.WithFastElection(), embedetcd.WithInsecureTCPClients())
	if err != nil {
		t.Fatal(err)
	}
	e.assemble(clientv3.Config{Endpoints: e.etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()}, nil, opts...)
	e.stopped = false
}

// assemble builds the coordinator over etcd as the daemon does
// (coordinator.New: every test's validations go through the watch-fed holder
// view), serves it on loopback and connects e.lc to it.
func (e *env) assemble(etcd clientv3.Config, srv []server.Option, opts ...lease.Option) {
	t := e.t
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = lis.Addr().String()
	copts := []coordinator.Option{coordinator.WithLease(append([]lease.Option{lease.WithKeyPrefix("/test/")}, opts...)...),
		coordinator.WithFence(e.fenceOpts...), coordinator.WithCounter(e.counterOpts...), coordinator.WithServer(srv...)}
	if e.sharded() {
		copts = append(copts, coordinator.WithShardCore(shard.WithShards(16), shard.WithLeaseTTL(2*time.Second), shard.WithMember("", e.addr)))
	}
	c, err := coordinator.New(etcd, copts...)
	if err != nil {
		lis.Close()
		t.Fatal(err)
	}
	e.coord, e.cli, e.mgr, e.gs = c, c.Etcd(), c.Leases(), c.GRPC()
	c.ServeInBackground(lis)
	e.conn = e.dial()
	e.lc = coordinatorv1.NewLockServiceClient(e.conn)
	if e.sharded() {
		awaitShards(t, c)
	}
}

// testCore is the core the suite runs on: COORDINATORD_TEST_CORE=shard
// runs it on the shard-owner core, else the queue core.
func testCore() string { return os.Getenv("COORDINATORD_TEST_CORE") }

// sharded says whether e runs (or is to run) on the shard core: the suite's
// core, or onShards.
func (e *env) sharded() bool { return e.onShards || testCore() == "shard" }

// awaitShards waits until the shard core's members together serve every
// shard, each of them some.
func awaitShards(t *testing.T, members ...*coordinator.Coordinator) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		total, shards, idle := 0, 0, false
		for _, m := range members {
			st := m.Shards().Status()
			total, shards, idle = total+st.Serving, st.Shards, idle || st.Serving == 0
		}
		if total == shards && !idle {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shard core's %d members serve %d of %d shards 15s after start", len(members), total, shards)
		}
	}
}

func (e *env) dial() *grpc.ClientConn {
	e.t.Helper()
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	return conn
}

func (e *env) stop() {
	if e.stopped {
		return
	}
	e.stopped = true
	e.coord.Close()
	e.conn.Close()
	e.etcd.Close()
}

// restart stops the coordinator and etcd and starts both again on the same
// etcd data.
func (e *env) restart() {
	e.stop()
	e.start()
}

// rev is etcd's current revision.
func (e *env) rev() int64 {
	e.t.Helper()
	r, err := e.cli.Get(context.Background(), "/nothing")
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Header.Revision
}

// queueKeys counts the keys in a lock's queue: on the shard core, which
// keeps its queues in memory, the lock's holders and waiters.
func (e *env) queueKeys(name string) int64 {
	e.t.Helper()
	if e.sharded() {
		hs, ws := e.onOwner(name)
		return int64(hs + ws)
	}
	r, err := e.cli.Get(context.Background(), e.mgr.Keyspace().Queue(name), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Count
}

// eventually polls cond every 10ms for up to d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not true after %v: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func dur(d time.Duration) *durationpb.Duration { return durationpb.New(d) }

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// acquire grants name or fails the test.
func (e *env) acquire(name string, ttl time.Duration) *coordinatorv1.AcquireResponse {
	e.t.Helper()
	r, err := e.lc.Acquire(ctxT(e.t, 20*time.Second), &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(ttl)})
	if err != nil {
		e.t.Fatalf("acquire %q: %v", name, err)
	}
	return r
}

// tryAcquire is Acquire with wait=0.
func (e *env) tryAcquire(name string) (*coordinatorv1.AcquireResponse, error) {
	return e.lc.Acquire(ctxT(e.t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(10 * time.Second), Wait: dur(0)})
}

func (e *env) validate(name string, token int64) *coordinatorv1.ValidateTokenResponse {
	e.t.Helper()
	r, err := e.lc.ValidateToken(ctxT(e.t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: name, Token: token})
	if err != nil {
		e.t.Fatalf("validate %q %d: %v", name, token, err)
	}
	return r
}

func (e *env) release(name string, token int64, handle string) bool {
	e.t.Helper()
	r, err := e.lc.Release(ctxT(e.t, 10*time.Second), &coordinatorv1.ReleaseRequest{Name: name, Token: token, Handle: handle})
	if err != nil {
		e.t.Fatalf("release %q %d: %v", name, token, err)
	}
	return r.Released
}

func (e *env) describe(name string) *coordinatorv1.DescribeResponse {
	e.t.Helper()
	r, err := e.lc.Describe(ctxT(e.t, 10*time.Second), &coordinatorv1.DescribeRequest{Name: name})
	if err != nil {
		e.t.Fatalf("describe %q: %v", name, err)
	}
	return r
}

func code(err error) codes.Code { return status.Code(err) }

// holderToken extracts the ErrorInfo holder token of an ABORTED Acquire.
func holderToken(t *testing.T, err error) int64 {
	t.Helper()
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == "LOCK_HELD" {
			n, err := strconv.ParseInt(info.GetMetadata()["holderToken"], 10, 64)
			if err != nil {
				t.Fatalf("holderToken: %v", err)
			}
			return n
		}
	}
	t.Fatalf("no LOCK_HELD ErrorInfo in %v", err)
	return 0
}

// fieldOf extracts the BadRequest field of an INVALID_ARGUMENT error.
func fieldOf(err error) string {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	return ""
}

func withMaxTTL(d time.Duration) lease.Option { return lease.WithMaxTTL(d) }

// replica is a second coordinator on the same etcd, with its own etcd
// client, lease manager, validator (and holder view) and gRPC server.
type replica struct {
	proxy *chaos.Proxy
	coord *coordinator.Coordinator
	conn  *grpc.ClientConn
	lc    coordinatorv1.LockServiceClient
}

func (e *env) replica() *replica {
	t := e.t
	// The replica reaches etcd through a fault proxy, so that a crash can
	// cut it off at once: nothing it does afterwards reaches etcd.
	proxy, err := chaos.NewProxy(strings.TrimPrefix(e.etcd.Endpoints()[0], "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	copts := []coordinator.Option{coordinator.WithLease(lease.WithKeyPrefix("/test/")), coordinator.WithFence(e.fenceOpts...), coordinator.WithCounter(e.counterOpts...)}
	if e.sharded() { // a second member: the shards split between the two, each forwards to the other
		copts = append(copts, coordinator.WithShardCore(shard.WithShards(16), shard.WithLeaseTTL(2*time.Second), shard.WithMember("", lis.Addr().String())))
	}
	c, err := coordinator.New(clientv3.Config{Endpoints: []string{"http://" + proxy.Addr()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}, copts...)
	if err != nil {
		lis.Close()
		t.Fatal(err)
	}
	c.ServeInBackground(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{coord: c, conn: conn, lc: coordinatorv1.NewLockServiceClient(conn), proxy: proxy}
	e.replicas = append(e.replicas, r)
	t.Cleanup(func() { r.crash() })
	if e.sharded() {
		awaitShards(t, e.coord, c)
	}
	return r
}

// crash cuts the replica off etcd first (so it can clean nothing up), then
// stops it.
func (r *replica) crash() {
	r.proxy.Set(chaos.Blackhole, 0)
	r.coord.Crash()
	r.conn.Close()
}

// queueCoreOnly skips, on the shard core, a test of the queue core's etcd
// layout (queue keys, a waiter's own lease), which the shard core does not
// have: it keeps its waiters in memory. shardTest names the shard core's
// test of the same promise.
func queueCoreOnly(t *testing.T, shardTest string) {
	t.Helper()
	if testCore() == "shard" {
		t.Skipf("the queue core's etcd layout; on the shard core see %s", shardTest)
	}
}

// onOwner counts a lock's holders and waiters on the shard core, from the
// table of the member (this coordinator or one of its replicas) that
// serves the name's shard, without a call (so without credentials).
func (e *env) onOwner(name string) (holders, waiters int) {
	e.t.Helper()
	members := []*coordinator.Coordinator{e.coord}
	for _, r := range e.replicas {
		members = append(members, r.coord)
	}
	var last error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, m := range members {
			hs, ws, err := m.Shards().Describe(name)
			if err == nil {
				return len(hs), len(ws)
			}
			last = err
		}
	}
	e.t.Fatalf("no member serves the shard of %q: %v", name, last)
	return 0, 0
}

// waiters counts a lock's waiters, on either core.
func (e *env) waiters(name string) int {
	e.t.Helper()
	if e.sharded() {
		_, ws := e.onOwner(name)
		return ws
	}
	d, err := e.mgr.Describe(context.Background(), name)
	if err != nil {
		e.t.Fatal(err)
	}
	return len(d.Waiters)
}

// stopTakingWork is what the daemon does on SIGTERM before the graceful
// stop: the queue core's lease manager closes (its waiters end, their keys
// removed); the shard core hands its shards over (their waiters end).
func (e *env) stopTakingWork() {
	if e.sharded() {
		e.coord.Shards().Close(ctxT(e.t, 10*time.Second))
		return
	}
	e.mgr.Close()
}

// countKeys counts etcd's keys under prefix.
func (e *env) countKeys(prefix string) int64 {
	e.t.Helper()
	r, err := e.cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Count
}
