// Package coordinator assembles one coordinator: an etcd client, the lease
// manager over it, the fence validator and the counters beside it, the
// token epoch keeper that the locks and the fence answer through
// (internal/epoch: restores of etcd), the gRPC
// server in front of them, and the validator's holder view following etcd. It is the one
// constructor of that graph: the daemon, internal/testcoord, the chaos
// replicas, the benchmarks and the server tests all build it here, so that
// none of them drifts from what the daemon serves (two test setups once ran
// without the holder view).
//
// It does not listen, start etcd, or read configuration: the caller brings
// the etcd client's configuration, the listener and the options of each part.
package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/coordinatord/coordinatord/internal/counter"
	"github.com/coordinatord/coordinatord/internal/epoch"
	"github.com/coordinatord/coordinatord/internal/fence"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/server"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// Coordinator is one assembled coordinator. Its holder view runs from New
// until Close; serve it with Serve, stop it with Drain (graceful) and Close,
// or with Crash in fault-injection tests.
type Coordinator struct {
	cli *clientv3.Client
	mgr *lease.Manager
	val *fence.Validator
	ep  *epoch.Keeper
	own *shard.Owner // WithShardCore, else nil
	svc *server.LockService
	cnt *counter.Service
	gs  *grpc.Server
	hs  *health.Server
	log *slog.Logger

	viewMu     sync.Mutex // guards stopFollow and closed (the keeper restarts the view)
	stopFollow func()
	closed     bool
	stopEpoch  func()
	closeOnce  sync.Once
}

type options struct {
	lease   []lease.Option
	fence   []fence.Option
	counter []counter.Option
	server  []server.Option
	log     *slog.Logger
	epoch   time.Duration
	shards  []shard.OwnerOption
	sharded bool
}

// WithShardCore serves the lock calls from the shard-owner core
// (internal/shard) instead of the queue core, with these options.
func WithShardCore(opts ...shard.OwnerOption) Option {
	return func(o *options) { o.sharded, o.shards = true, append(o.shards, opts...) }
}

// Option configures New.
type Option func(*options)

// WithLease adds options of the lease manager.
func WithLease(opts ...lease.Option) Option {
	return func(o *options) { o.lease = append(o.lease, opts...) }
}

// WithFence adds options of the fence validator.
func WithFence(opts ...fence.Option) Option {
	return func(o *options) { o.fence = append(o.fence, opts...) }
}

// WithCounter adds options of the counters (the key prefix is the lease
// manager's).
func WithCounter(opts ...counter.Option) Option {
	return func(o *options) { o.counter = append(o.counter, opts...) }
}

// WithServer adds options of the gRPC server (interceptors, credentials,
// limits, raw grpc.ServerOptions).
func WithServer(opts ...server.Option) Option {
	return func(o *options) { o.server = append(o.server, opts...) }
}

// WithEpochInterval sets how often the epoch keeper checks etcd's history
// for a restore (default epoch.DefaultInterval).
func WithEpochInterval(d time.Duration) Option { return func(o *options) { o.epoch = d } }

// WithLogger sets the logger of every part: the lease manager, the holder
// view, the handlers and the gRPC server (default: discard).
func WithLogger(log *slog.Logger) Option { return func(o *options) { o.log = log } }

// New connects an etcd client with etcd, builds the lease manager, the fence
// validator and the gRPC server over it, and starts the validator's holder
// view (validations without a resource answer from it). On an error nothing
// is left running.
func New(etcd clientv3.Config, opts ...Option) (*Coordinator, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	var seen witness
	cli, err := clientv3.New(seen.config(etcd))
	if err != nil {
		return nil, fmt.Errorf("etcd client for %v: %w", etcd.Endpoints, err)
	}
	mgr, err := lease.New(cli, append([]lease.Option{lease.WithLogger(o.log)}, o.lease...)...)
	if err != nil {
		cli.Close()
		return nil, err
	}
	c := &Coordinator{cli: cli, mgr: mgr, log: o.log}
	epochOpts := []epoch.Option{epoch.WithLogger(o.log), epoch.OnBump(c.restartView)}
	if o.epoch > 0 {
		epochOpts = append(epochOpts, epoch.WithInterval(o.epoch))
	}
	c.ep = epoch.New(cli, mgr.Keyspace(), epochOpts...)
	seen.keeper.Store(c.ep)
	c.val = fence.New(cli, mgr.Keyspace(), append([]fence.Option{fence.WithEpochs(c.ep)}, o.fence...)...)
	c.cnt = counter.New(cli, append([]counter.Option{counter.WithKeyPrefix(mgr.Keyspace().Prefix()), counter.WithLogger(o.log)}, o.counter...)...)
	svcOpts := []server.ServiceOption{server.WithEpochs(c.ep)}
	if o.sharded {
		sctx, scancel := context.WithTimeout(context.Background(), firstCheckTimeout)
		// One configuration for both cores: the limits given to the lease
		// manager and the validator apply to the shard core too (explicit
		// shard options come after, and win).
		waiters, perIdentity := mgr.Limits()
		shardOpts := append([]shard.OwnerOption{shard.WithMaxWaitersPerLock(int(waiters)), shard.WithMaxLocksPerIdentity(perIdentity),
			shard.WithMarkLimit(c.val.MarkLimit())}, o.shards...)
		c.own, err = shard.NewOwner(sctx, cli, mgr.Keyspace().Prefix(), shardOpts...)
		scancel()
		if err != nil {
			mgr.Close()
			c.cnt.Close()
			cli.Close()
			return nil, fmt.Errorf("shard-owner core: %w", err)
		}
		svcOpts = append(svcOpts, server.WithShardCore(c.own))
	}
	c.svc = server.NewLockService(mgr, c.val, c.cnt, o.log, svcOpts...)
	c.gs, c.hs = server.NewGRPCServer(c.svc, o.log, o.server...)
	if c.own != nil { // the lock counts homed on other members, through the server's forwarding
		c.own.SetIdentityHomes(c.svc.IdentityHomes())
	}
	// The first check before anything is served: a restore found is fenced
	// off now. If etcd does not answer, the keeper stays paused (every
	// grant and validation UNAVAILABLE) until its loop's first success.
	ctx, cancel := context.WithTimeout(context.Background(), firstCheckTimeout)
	if err := c.ep.Check(ctx); err != nil {
		o.log.Warn("epoch: first check of etcd's history failed; granting and validating paused until one succeeds", "err", err)
	}
	cancel()
	c.stopFollow = c.val.FollowInBackground(o.log)
	c.stopEpoch = c.ep.RunInBackground()
	return c, nil
}

// firstCheckTimeout bounds New's first check of etcd's history.
const firstCheckTimeout = 5 * time.Second

// restartView restarts the holder view after the token epoch changed: the
// view followed the history before the restore, and a watch resumed across
// a restore without --bump-revision waits for revisions that came back.
func (c *Coordinator) restartView(int64) {
	c.viewMu.Lock()
	defer c.viewMu.Unlock()
	if c.closed || c.stopFollow == nil {
		return
	}
	c.stopFollow()
	c.stopFollow = c.val.FollowInBackground(c.log)
}

// stopView stops the holder view for good.
func (c *Coordinator) stopView() {
	c.viewMu.Lock()
	defer c.viewMu.Unlock()
	c.closed = true
	if c.stopFollow != nil {
		c.stopFollow()
	}
}

// Etcd is the coordinator's etcd client (closed by Close).
func (c *Coordinator) Etcd() *clientv3.Client { return c.cli }

// Leases is the lease manager.
func (c *Coordinator) Leases() *lease.Manager { return c.mgr }

// Fence is the fence validator.
func (c *Coordinator) Fence() *fence.Validator { return c.val }

// Epochs is the token epoch keeper.
func (c *Coordinator) Epochs() *epoch.Keeper { return c.ep }

// Shards is the shard-owner core, nil unless WithShardCore.
func (c *Coordinator) Shards() *shard.Owner { return c.own }

// closeShards hands the shard core's shards over (graceful), if it runs.
func (c *Coordinator) closeShards(ctx context.Context) {
	if c.own != nil {
		c.own.Close(ctx)
	}
}

// Counters is the counter service.
func (c *Coordinator) Counters() *counter.Service { return c.cnt }

// GRPC is the gRPC server, with the lock, fence, counter, health and reflection
// services registered.
func (c *Coordinator) GRPC() *grpc.Server { return c.gs }

// Health is the gRPC server's health service, for the caller to flip.
func (c *Coordinator) Health() *health.Server { return c.hs }

// Serve serves gRPC on lis until the server stops (grpc.Server.Serve).
func (c *Coordinator) Serve(lis net.Listener) error { return c.gs.Serve(lis) }

// ServeInBackground serves gRPC on lis in a goroutine that ends when the
// server stops (Drain, Close or Crash).
func (c *Coordinator) ServeInBackground(lis net.Listener) {
	go func() { _ = c.gs.Serve(lis) }()
}

// Drain stops taking work, gracefully, in this order:
//
//  1. every health service answers NOT_SERVING, so that balancers move on;
//  2. the shard core, if it runs, hands its shards over (shard.Owner
//     HandOver): what is in flight commits and is answered, the owner keys
//     go, the next owners start at once; its view of the owners keeps
//     following etcd until Close, so that the calls still arriving in 3
//     are forwarded to the next owners. Closed before gRPC stopped, it
//     answered them "shutting down" after the forwarder's retries (0.6 s)
//     against a view that no longer moved: one UNAVAILABLE and a 0.6–1 s
//     pause per caller in a rolling restart (coordbench failover);
//  3. the lease manager closes: every waiting Acquire ends and its queue key
//     is removed (this needs etcd, which is still open); grants stay; the
//     counters take no more hits and finish the commits in flight;
//  4. gRPC stops gracefully: no new calls, in-flight ones finish; when ctx
//     ends first, the calls left are cut (and Drain returns true).
//
// The holder view, the shard core's view and lease, and the etcd client
// stay until Close.
func (c *Coordinator) Drain(ctx context.Context) (cut bool) {
	c.hs.Shutdown()
	if c.own != nil {
		c.own.HandOver(ctx)
	}
	c.mgr.Close()
	c.cnt.Close()
	stopped := make(chan struct{})
	go func() { c.gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
		return false
	case <-ctx.Done():
		c.gs.Stop()
		<-stopped
		return true
	}
}

// Close stops what is left, at once, in this order: the shard core's
// shards (handed over), the lease manager (waiting Acquires end, their
// queue keys removed), the counters, gRPC (in-flight calls cut), the
// connections to peers (forwarding), the epoch keeper's loop, the holder
// view, then the etcd client, which everything before needed. After Drain
// only the last four have anything to do. Close is idempotent.
func (c *Coordinator) Close() {
	c.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), firstCheckTimeout)
		c.closeShards(ctx)
		cancel()
		c.mgr.Close()
		c.cnt.Close()
		c.gs.Stop()
		_ = c.svc.Close() // the connections to peers, once no call forwards
		c.stopEpoch()
		c.stopView()
		c.cli.Close()
	})
}

// Crash stops the coordinator as a crashed process stops: the etcd client
// first, so that nothing is cleaned up in etcd (queue keys and grants stay
// until their leases expire), then gRPC (in-flight calls fail), the lease
// manager and the holder view. For fault-injection tests.
func (c *Coordinator) Crash() {
	c.closeOnce.Do(func() {
		c.cli.Close()
		c.gs.Stop()
		_ = c.svc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		c.closeShards(ctx) // etcd is gone: nothing is handed over, the keys end with the lease
		cancel()
		c.mgr.Close()
		c.cnt.Close()
		c.stopEpoch()
		c.stopView()
	})
}
