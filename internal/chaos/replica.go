package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/coordinator"
	"github.com/coordinatord/coordinatord/internal/epoch"
	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/server"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// ServerLog, if set before replicas start, receives the handlers' logs
// (such as the cause of an INTERNAL answer).
var ServerLog *slog.Logger

// KeyPrefix is the etcd key prefix of every replica.
const KeyPrefix = "/chaos/"

// Replica is one coordinator (internal/coordinator: lease manager,
// validator with its holder view, gRPC server on loopback) whose etcd client
// reaches each member through its own Proxy.
type Replica struct {
	ID      int
	proxies []*Proxy
	opts    []grpc.ServerOption
	// shardCfg: the replica runs the shard-owner core (shards.go); nil:
	// the queue core.
	shardCfg *ShardConfig

	mu       sync.Mutex
	addr     string
	coord    *coordinator.Coordinator
	conn     *grpc.ClientConn
	lc       coordinatorv1.LockServiceClient
	running  bool
	stopEnds func() // stops the lock-end watch
	// owner is the running shard-owner core (read without mu: Owner).
	owner atomic.Pointer[shard.Owner]

	// Events counts the replica's warnings across restarts.
	Events *Events
	endsMu sync.Mutex
	ends   []lease.GrantEnd
}

// NewReplica starts a replica with a proxy in front of every member of c.
// opts are added to the gRPC server's (a test can inject a broken build).
func NewReplica(id int, c *Cluster, opts ...grpc.ServerOption) (*Replica, error) {
	return newReplica(id, c, nil, opts...)
}

func newReplica(id int, c *Cluster, sc *ShardConfig, opts ...grpc.ServerOption) (*Replica, error) {
	r := &Replica{ID: id, opts: opts, shardCfg: sc, Events: NewEvents()}
	for i := range c.Size() {
		p, err := NewProxy(strings.TrimPrefix(c.ClientURL(i), "http://"))
		if err != nil {
			r.Close()
			return nil, err
		}
		r.proxies = append(r.proxies, p)
	}
	c.OnKill(func(member int) {
		p := r.proxies[member]
		if m := p.Mode(); m == Pass {
			p.Set(Reset, 0)
			p.Set(Pass, 0)
		}
	})
	if err := r.Restart(); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Endpoints are the proxied etcd endpoints the replica uses.
func (r *Replica) Endpoints() []string {
	eps := make([]string, len(r.proxies))
	for i, p := range r.proxies {
		eps[i] = "http://" + p.Addr()
	}
	return eps
}

// Addr is the replica's gRPC address (kept across Crash and Restart).
func (r *Replica) Addr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addr
}

// Client is a LockService client connected to the replica. It keeps working
// across Crash and Restart (gRPC reconnects to the same address).
func (r *Replica) Client() coordinatorv1.LockServiceClient {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lc
}

// Restart starts the replica (again) on its address.
func (r *Replica) Restart() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running {
		return nil
	}
	// A member of the shard core advertises its listener's address, which
	// must be known before coordinator.New: it listens first. A replica of
	// the queue core listens once it is built, as before (until then its
	// clients' calls are refused at once rather than left waiting).
	var lis net.Listener
	var err error
	if r.shardCfg != nil {
		if lis, err = r.listen(); err != nil {
			return err
		}
	}
	// Validations answer from the watch-fed holder view (the checkers
	// hold it to linearizability like everything else).
	copts := []coordinator.Option{coordinator.WithLogger(ServerLog),
		// The lease manager's warnings are counted (after WithLogger: it wins).
		coordinator.WithLease(lease.WithKeyPrefix(KeyPrefix), lease.WithLogger(r.Events.Logger())),
		coordinator.WithServer(server.WithServerOptions(r.opts...))}
	if r.shardCfg != nil {
		copts = append(copts, coordinator.WithShardCore(r.shardCfg.options(r, lis.Addr().String())...))
	}
	c, err := coordinator.New(clientv3.Config{
		Endpoints:            r.Endpoints(),
		DialTimeout:          2 * time.Second,
		DialKeepAliveTime:    time.Second,
		DialKeepAliveTimeout: time.Second,
		Logger:               zap.NewNop(),
	}, copts...)
	if err != nil {
		if lis != nil {
			lis.Close()
		}
		return err
	}
	if lis == nil {
		if lis, err = r.listen(); err != nil {
			c.Close()
			return err
		}
	}
	c.ServeInBackground(lis)
	r.addr = lis.Addr().String()
	if r.conn == nil {
		r.conn, err = grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			c.Close()
			return err
		}
		r.lc = coordinatorv1.NewLockServiceClient(r.conn)
	}
	// The lock-end watch, as the daemon runs it (for its metrics; started
	// over when the token epoch changes).
	ectx, ecancel := context.WithCancel(context.Background())
	edone := make(chan struct{})
	go func() {
		defer close(edone)
		_ = c.WatchEnds(ectx, 0, func(e lease.GrantEnd) {
			r.endsMu.Lock()
			r.ends = append(r.ends, e)
			r.endsMu.Unlock()
		})
	}()
	r.stopEnds = func() { ecancel(); <-edone }
	r.coord, r.running = c, true
	r.owner.Store(c.Shards())
	return nil
}

// listen listens on the replica's address (a free port the first time),
// waiting for a moment if the port is still held by the replica just
// stopped.
func (r *Replica) listen() (net.Listener, error) {
	addr := r.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var lis net.Listener
	var err error
	for attempt := 0; ; attempt++ {
		lis, err = net.Listen("tcp", addr)
		if err == nil || attempt == 50 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("chaos: replica %d listen: %w", r.ID, err)
	}
	return lis, nil
}

// SawEnd tells whether the replica's lock-end watch reported the end of
// the grant (name, token); token is the wire's (keyspace.TokenOf), the
// lock-end watch speaks create revisions.
func (r *Replica) SawEnd(name string, token int64) bool {
	_, token = keyspace.SplitToken(token)
	r.endsMu.Lock()
	defer r.endsMu.Unlock()
	for _, e := range r.ends {
		if e.Name == name && e.Token == token {
			return true
		}
	}
	return false
}

// Following tells whether the replica runs and its holder view follows etcd.
func (r *Replica) Following() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running && r.coord.Fence().Following()
}

// Epoch is the replica's token epoch keeper's state (zero when it is not
// running).
func (r *Replica) Epoch() epoch.State {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.running {
		return epoch.State{}
	}
	return r.coord.Epochs().Status()
}

// Running tells whether the replica serves (it was not crashed).
func (r *Replica) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running
}

// Crash stops the replica as a crash would: its etcd traffic is cut first
// (blackholed: nothing more reaches etcd, so it cleans nothing up), then its
// server stops (in-flight calls fail with a broken connection, grants stay in
// etcd), then its etcd client closes. A crashed process answers nothing
// more: no call sees an error made by a closing etcd client. The proxies are
// back to Pass for Restart.
func (r *Replica) Crash() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.running {
		return
	}
	r.running = false
	r.owner.Store(nil)
	r.PartitionFromEtcd()
	r.coord.GRPC().Stop() // before the etcd client closes: no call sees a closing client
	r.coord.Crash()
	r.stopEnds()
	r.Heal()
}

// PartitionFromEtcd blackholes every proxy of the replica: its etcd calls
// hang (and time out) while its gRPC server keeps answering.
func (r *Replica) PartitionFromEtcd() {
	for _, p := range r.proxies {
		p.Set(Blackhole, 0)
	}
}

// ResetEtcd closes the replica's etcd connections (they reconnect).
func (r *Replica) ResetEtcd() {
	for _, p := range r.proxies {
		p.Set(Reset, 0)
	}
	time.Sleep(20 * time.Millisecond)
	r.Heal()
}

// DelayEtcd adds d to every chunk between the replica and etcd.
func (r *Replica) DelayEtcd(d time.Duration) {
	for _, p := range r.proxies {
		p.Set(Delay, d)
	}
}

// Heal puts every proxy back to Pass.
func (r *Replica) Heal() {
	for _, p := range r.proxies {
		p.Set(Pass, 0)
	}
}

// Close crashes the replica, closes its client connection and proxies.
func (r *Replica) Close() {
	r.Crash()
	r.mu.Lock()
	if r.conn != nil {
		r.conn.Close()
		r.conn = nil
	}
	r.mu.Unlock()
	for _, p := range r.proxies {
		p.Close()
	}
}

// Env is a cluster with replicas: what every scenario starts from.
type Env struct {
	Cluster  *Cluster
	Replicas []*Replica
	// Etcd is a direct (unproxied) client for assertions.
	Etcd *clientv3.Client
	// Compactor compacts etcd's history to its current revision every
	// CompactEvery, under every scenario (a fault like the others).
	Compactor *Compactor
}

// NewEnv starts a 3-member cluster under dir and n replicas.
// opts go to every replica's gRPC server.
func NewEnv(dir string, replicas int, opts ...grpc.ServerOption) (*Env, error) {
	c, err := StartCluster(dir, 3)
	if err != nil {
		return nil, err
	}
	e := &Env{Cluster: c}
	if e.Etcd, err = c.Client(); err != nil {
		e.Close()
		return nil, err
	}
	for i := range replicas {
		r, err := NewReplica(i, c, opts...)
		if err != nil {
			e.Close()
			return nil, err
		}
		e.Replicas = append(e.Replicas, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := Ready(ctx, e.Etcd); err != nil {
		e.Close()
		return nil, err
	}
	e.Compactor = StartCompactor(e.Etcd)
	return e, nil
}

// Close stops everything.
func (e *Env) Close() {
	if e.Compactor != nil {
		e.Compactor.Stop()
	}
	for _, r := range e.Replicas {
		r.Close()
	}
	if e.Etcd != nil {
		e.Etcd.Close()
	}
	e.Cluster.Close()
}

// CountKeys counts the keys under KeyPrefix+sub (direct read).
func (e *Env) CountKeys(ctx context.Context, sub string) (int64, error) {
	r, err := e.Etcd.Get(ctx, KeyPrefix+sub, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return r.Count, nil
}
