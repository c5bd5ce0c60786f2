// Package daemon wires coordinatord together: etcd (embedded or remote),
// the lease and fence services, and the gRPC server, with a bounded shutdown.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sync/errgroup"

	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/fence"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/logging"
	"github.com/coordinatord/coordinatord/internal/server"
)

// Config is everything Run needs.
type Config struct {
	// Listen is the gRPC listen address, e.g. "127.0.0.1:7070".
	Listen string
	// EtcdEndpoints are the etcd client URLs; empty starts an embedded
	// single-member etcd in DataDir.
	EtcdEndpoints []string
	// KeyPrefix is the etcd key prefix of every key written.
	KeyPrefix string
	// DataDir holds the embedded etcd's data.
	DataDir string
	// DefaultTTL and MaxTTL bound lease TTLs.
	DefaultTTL, MaxTTL time.Duration
	// MaxHold caps how long a grant may be renewed (zero: the lease
	// package's default, 1h).
	MaxHold time.Duration
	// MaxLockDelay caps the lock-delay an acquisition may ask for; zero
	// allows none.
	MaxLockDelay time.Duration
	// ShutdownTimeout bounds the graceful stop; then in-flight calls are cut.
	ShutdownTimeout time.Duration
	// Logger receives the structured logs.
	Logger *slog.Logger
	// OnListen, if set, is called with the bound address once serving.
	OnListen func(net.Addr)
}

// Run serves until ctx is cancelled, then stops: it marks itself not
// serving, ends every waiting Acquire (removing its queue key), stops gRPC
// gracefully within ShutdownTimeout, and closes etcd.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	endpoints := cfg.EtcdEndpoints
	if len(endpoints) == 0 {
		log.Warn("SINGLE-NODE MODE: no --etcd-endpoints given, starting an embedded single-member etcd; "+
			"fine for a laptop, a demo or one node, but it is a single point of failure: use a 3- or 5-member etcd cluster in production",
			"data_dir", cfg.DataDir)
		e, err := embedetcd.Start(ctx, cfg.DataDir, embedetcd.WithLogger(log))
		if err != nil {
			return err
		}
		defer e.Close()
		endpoints = e.Endpoints()
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      logging.Zap(log, zapcore.ErrorLevel),
	})
	if err != nil {
		return fmt.Errorf("etcd client for %v: %w", endpoints, err)
	}
	defer cli.Close()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = cli.Get(pctx, "health-probe")
	cancel()
	if err != nil {
		return fmt.Errorf("etcd at %v is not reachable: %w; check --etcd-endpoints and that the cluster has quorum", endpoints, err)
	}

	opts := []lease.Option{lease.WithKeyPrefix(cfg.KeyPrefix), lease.WithDefaultTTL(cfg.DefaultTTL),
		lease.WithMaxTTL(cfg.MaxTTL), lease.WithLogger(log)}
	if cfg.MaxHold > 0 {
		opts = append(opts, lease.WithMaxHoldCap(cfg.MaxHold))
	}
	opts = append(opts, lease.WithLockDelayCap(cfg.MaxLockDelay))
	mgr, err := lease.New(cli, opts...)
	if err != nil {
		return err
	}
	val := fence.New(cli, mgr.Keyspace())
	gs, hs := server.NewGRPCServer(server.NewLockService(mgr, val, log), log)

	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %q: %w", cfg.Listen, err)
	}
	log.Info("coordinatord serving", "addr", lis.Addr().String(), "etcd", endpoints, "key_prefix", mgr.Keyspace().Prefix())
	if cfg.OnListen != nil {
		cfg.OnListen(lis.Addr())
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := gs.Serve(lis); err != nil {
			return fmt.Errorf("grpc serve: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		log.Info("shutting down", "timeout", cfg.ShutdownTimeout.String())
		hs.Shutdown() // every service NOT_SERVING
		mgr.Close()   // waiting Acquires end, their queue keys removed
		stopped := make(chan struct{})
		go func() { gs.GracefulStop(); close(stopped) }()
		t := time.NewTimer(cfg.ShutdownTimeout)
		defer t.Stop()
		select {
		case <-stopped:
		case <-t.C:
			log.Warn("graceful stop timed out; cutting remaining calls")
			gs.Stop()
			<-stopped
		}
		return nil
	})
	err = g.Wait()
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	log.Info("stopped")
	return nil
}
