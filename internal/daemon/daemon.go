// Package daemon wires coordinatord together: etcd (embedded or remote),
// the coordinator (see internal/coordinator), its listeners and operations
// endpoints, with a bounded shutdown.
//
// A Daemon is built by New, serves in Run until its context ends, and
// releases what is left in Close:
//
//	d, err := daemon.New(ctx, cfg)
//	if err != nil { ... }
//	defer d.Close()
//	return d.Run(ctx)
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/coordinatord/coordinatord/internal/authz"
	"github.com/coordinatord/coordinatord/internal/coordinator"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/opshttp"
	"github.com/coordinatord/coordinatord/internal/server"
)

// readyService is the gRPC health service name that follows etcd's
// reachability and the token epoch (readinessProbe); the empty name "" stays
// SERVING until shutdown (liveness).
const readyService = "coordinator.v1.LockService"

// Daemon is one coordinatord: built by New, served by Run, released by
// Close.
type Daemon struct {
	cfg Config
	log *slog.Logger

	// etcd (startEtcd)
	embedded  *embedetcd.Server // nil with EtcdEndpoints
	endpoints []string
	// assemble
	coord    *coordinator.Coordinator
	probeKey string
	startRev int64 // etcd's revision at start-up (WatchEnds follows from it)
	reg      *prometheus.Registry
	metrics  *server.Metrics
	store    *authz.Store // nil without AuthPolicy
	ready    *opshttp.Readiness
	// listen
	lis  net.Listener
	mlis net.Listener // nil without MetricsListen
	hsrv *http.Server
	hlis net.Listener // nil without HealthListen
	hgs  *grpc.Server
	hup  chan os.Signal

	closeOnce sync.Once
}

// New validates cfg and builds the daemon, step by step: etcd (an embedded
// single member without EtcdEndpoints, then a client that must reach it),
// the gRPC listener (bound before the coordinator: its address is what a
// member of the shard core advertises by default), the coordinator with its
// gRPC options, readiness, and the other listeners (bound here, so that
// OnListen and its siblings report real addresses). Nothing serves until
// Run. On an error, whatever was started is closed.
func New(ctx context.Context, cfg Config) (_ *Daemon, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, log: cfg.logger()}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	for _, step := range []func(context.Context) error{d.startEtcd, d.bind, d.assemble, d.watchReadiness, d.listen} {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// Run serves cfg.WithDefaults() until ctx is cancelled: New, Run, Close.
func Run(ctx context.Context, cfg Config) error {
	d, err := New(ctx, cfg.WithDefaults())
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Run(ctx)
}

// Run serves until ctx is cancelled or a server fails, then drains (see
// drain) and returns; Close releases the rest. Call it once.
func (d *Daemon) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	d.serve(g, gctx)
	g.Go(func() error { <-gctx.Done(); d.drain(); return nil })
	err := g.Wait()
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	d.log.Info("stopped")
	return nil
}

// serve starts, in g, every server and background job of the daemon; each
// ends when gctx does or its server stops. A server the drain stopped before
// its Serve began (a stop right after start) answers ErrServerStopped (or
// http.ErrServerClosed): a clean end, not a failure.
func (d *Daemon) serve(g *errgroup.Group, gctx context.Context) {
	cfg, coord := d.cfg, d.coord
	if d.hgs != nil {
		g.Go(func() error {
			if err := d.hgs.Serve(d.hlis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				return fmt.Errorf("health serve: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error { d.ready.Run(gctx); return nil })
	g.Go(func() error { return coord.Fence().RetainMarks(gctx, cfg.MarkRetention, d.log) })
	if d.hsrv != nil {
		// Hold times and expiries (only when metrics are served): on the
		// queue core seen in etcd's history, from the revision read at
		// start-up on; on the shard core the ends this member's tables
		// make (coordinator.WatchEnds).
		g.Go(func() error { return coord.WatchEnds(gctx, d.startRev, d.metrics.GrantEnded) })
		g.Go(func() error {
			if err := d.hsrv.Serve(d.mlis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("metrics serve: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error {
		if err := coord.Serve(d.lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("grpc serve: %w", err)
		}
		return nil
	})
	g.Go(func() error { reloadAuth(gctx, d.store, cfg.AuthReloadInterval, d.hup, d.log); return nil })
}

// drain stops taking work, in this order:
//
//  1. /readyz answers not ready;
//  2. the coordinator drains (coordinator.Drain): every gRPC health service
//     NOT_SERVING, every waiting Acquire ended and its queue key removed,
//     gRPC stopped gracefully within ShutdownTimeout, then in-flight calls
//     cut;
//  3. the plaintext health server stops;
//  4. the metrics server shuts down (within a second).
//
// etcd stays open for all of it (the queue keys are removed through it);
// Close closes it.
func (d *Daemon) drain() {
	d.log.Info("shutting down", "timeout", d.cfg.ShutdownTimeout.String())
	d.ready.Stopping()
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.ShutdownTimeout)
	if d.coord.Drain(ctx) {
		d.log.Warn("graceful stop timed out; cutting remaining calls")
	}
	cancel()
	if d.hgs != nil {
		d.hgs.Stop()
	}
	if d.hsrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = d.hsrv.Shutdown(sctx)
		cancel()
	}
}

// Close releases what Run has not, in this order, whether or not Run ran:
//
//  1. SIGHUP is no longer caught;
//  2. listeners never served are closed;
//  3. the coordinator closes (coordinator.Close): after Run, only its
//     holder view and etcd client are left;
//  4. the embedded etcd, if any, stops: last, since everything above is
//     its client.
//
// Close is idempotent.
func (d *Daemon) Close() { d.closeOnce.Do(d.close) }

func (d *Daemon) close() {
	if d.hup != nil {
		signal.Stop(d.hup)
	}
	for _, l := range []net.Listener{d.lis, d.mlis, d.hlis} {
		if l != nil {
			_ = l.Close() // already closed if served
		}
	}
	if d.hgs != nil {
		d.hgs.Stop()
	}
	if d.coord != nil {
		d.coord.Close()
	}
	if d.embedded != nil {
		d.embedded.Close()
	}
}

// bind binds the gRPC listener (with MaxConnections); it serves from Run.
func (d *Daemon) bind(context.Context) error {
	lis, err := net.Listen("tcp", d.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %q: %w", d.cfg.Listen, err)
	}
	d.lis = server.LimitConnections(lis, d.cfg.MaxConnections)
	return nil
}

// listen reports the gRPC listener, binds the metrics and the plaintext
// health listeners if configured, and starts catching SIGHUP.
func (d *Daemon) listen(context.Context) error {
	cfg, log := d.cfg, d.log
	// SIGHUP is caught from here on, whether or not there is anything to
	// reload: its default action would kill the daemon without a graceful
	// stop (exit 129).
	d.hup = make(chan os.Signal, 1)
	signal.Notify(d.hup, syscall.SIGHUP)
	log.Info("coordinatord serving", "addr", d.lis.Addr().String(), "etcd", d.endpoints, "key_prefix", d.coord.Leases().Keyspace().Prefix())
	if cfg.OnListen != nil {
		cfg.OnListen(d.lis.Addr())
	}
	if err := d.listenMetrics(); err != nil {
		return err
	}
	return d.listenHealth()
}
