// Package daemon wires coordinatord together: etcd (embedded or remote),
// the lease and fence services, and the gRPC server, with a bounded shutdown.
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
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/coordinatord/coordinatord/internal/authz"
	"github.com/coordinatord/coordinatord/internal/fence"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/logging"
	"github.com/coordinatord/coordinatord/internal/opshttp"
	"github.com/coordinatord/coordinatord/internal/server"
	"github.com/coordinatord/coordinatord/internal/tlsconf"
)

// Config is everything Run needs.
type Config struct {
	// Listen is the gRPC listen address, e.g. "127.0.0.1:7070".
	Listen string
	// EtcdEndpoints are the etcd client URLs; empty starts an embedded
	// single-member etcd in DataDir.
	EtcdEndpoints []string
	// EtcdCA, EtcdCert and EtcdKey (PEM files) secure the connection to
	// etcd: the CA that signed etcd's server certificate, and the client
	// certificate etcd requires with --client-cert-auth.
	EtcdCA, EtcdCert, EtcdKey string
	// EtcdUsername and EtcdPassword authenticate to etcd (etcd auth/RBAC).
	EtcdUsername, EtcdPassword string
	// KeyPrefix is the etcd key prefix of every key written.
	KeyPrefix string
	// DataDir holds the embedded etcd's data.
	DataDir string
	// Embedded etcd only (ignored with EtcdEndpoints): its auto-compaction
	// (etcd's --auto-compaction-mode and -retention; empty: periodic, 5m;
	// retention "0": off), its quota (--quota-backend-bytes; 0: 2 GiB), and
	// how often its space keeper looks (0: 5s), see internal/embedetcd.
	EtcdAutoCompactionMode, EtcdAutoCompactionRetention string
	EtcdQuotaBackendBytes                               int64
	EtcdSpaceCheck                                      time.Duration
	// ReadinessInterval is how often etcd is probed for /readyz and the gRPC
	// health status (0: 2s).
	ReadinessInterval time.Duration
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

	// TLSCert and TLSKey (PEM files) switch gRPC to TLS; with TLSClientCA
	// every client must present a certificate that chains to it (mutual
	// TLS). The files are re-read when they change.
	TLSCert, TLSKey, TLSClientCA string
	// TLSIdentityFromCN identifies a client certificate without URI or DNS
	// SANs by its subject CN (see authz.IdentityFromCert); off, such a
	// certificate names no identity.
	TLSIdentityFromCN bool

	// AuthPolicy, if set, is the authorization policy file (JSON, see
	// authz.Policy): every call but health and reflection then needs an
	// identity, from a verified client certificate or a bearer token listed
	// in AuthTokens. Both files are reloaded when they change (checked every
	// AuthReloadInterval) and on SIGHUP.
	AuthPolicy, AuthTokens string
	AuthReloadInterval     time.Duration

	// MetricsListen, if set, is the HTTP address of /metrics, /healthz and
	// /readyz, e.g. "127.0.0.1:9090".
	MetricsListen string
	// OnMetricsListen, if set, is called with the metrics listener's address.
	OnMetricsListen func(net.Addr)
	// HealthListen, if set, is a second, plaintext gRPC address that serves
	// only grpc.health.v1.Health (same statuses) and reflection: for
	// Kubernetes gRPC probes, which cannot speak TLS.
	HealthListen string
	// OnHealthListen, if set, is called with the health listener's address.
	OnHealthListen func(net.Addr)

	// Limits; 0 disables each.
	MaxRecvMsgSize       int           // largest request message, bytes (gRPC's own default, 4 MiB, if 0)
	MaxConcurrentStreams uint32        // concurrent calls per client connection
	KeepaliveMinTime     time.Duration // clients pinging more often get GOAWAY (gRPC's default, 5m, if 0)
	RateLimit            float64       // requests per second per caller (identity, else IP)
	RateBurst            int           // burst of RateLimit
	MaxWaitersPerLock    int64         // waiters per lock
	MaxLocksPerIdentity  int64         // locks held or awaited per authenticated identity (needs AuthPolicy)
	MaxWait              time.Duration // queue wait of an Acquire
	MaxWatchStreams      int           // concurrent Watch streams per caller (identity, else IP)
	MaxHoldStreams       int           // concurrent Hold streams per caller (identity, else IP)
	MaxConnections       int           // open client connections on the gRPC listener
	MaxConnectionIdle    time.Duration // a connection without calls this long is sent GOAWAY
	MaxMarksPerIdentity  int64         // resource marks one identity may create (unauthenticated callers: one identity)
	MarkRetention        time.Duration // a mark whose lock stayed free this long is deleted (see fence.SweepMarks)
}

// readyService is the gRPC health service name that follows etcd's
// reachability (the empty name "" stays SERVING until shutdown: liveness).
const readyService = "coordinator.v1.LockService"

// flowWindow is the HTTP/2 flow-control window of the etcd client's
// streams and connection.
const flowWindow = 1 << 20

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
		e, err := startEmbedded(ctx, cfg, log)
		if err != nil {
			return err
		}
		defer e.Close()
		endpoints = e.Endpoints()
	}
	etcdTLS, err := tlsconf.Client(cfg.EtcdCA, cfg.EtcdCert, cfg.EtcdKey)
	if err != nil {
		return fmt.Errorf("etcd client TLS: %w", err)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      logging.Zap(log, zapcore.ErrorLevel),
		TLS:         etcdTLS,
		Username:    cfg.EtcdUsername,
		Password:    cfg.EtcdPassword,
		// Fixed flow-control windows turn off gRPC's bandwidth estimator,
		// which pings etcd for most responses: a packet each way per
		// request for nothing (requests and answers here are small).
		DialOptions: []grpc.DialOption{
			grpc.WithInitialWindowSize(flowWindow), grpc.WithInitialConnWindowSize(flowWindow),
		},
	})
	if err != nil {
		return fmt.Errorf("etcd client for %v: %w", endpoints, err)
	}
	defer cli.Close()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	probeKey := lease.NewKeyspace(cfg.KeyPrefix).Prefix() + "readyz"
	probe, err := cli.Get(pctx, probeKey, clientv3.WithCountOnly())
	cancel()
	if err != nil {
		return fmt.Errorf("etcd at %v is not reachable: %w; check --etcd-endpoints and that the cluster has quorum", endpoints, err)
	}
	if len(cfg.EtcdEndpoints) > 0 {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		warnIfNeverCompacted(wctx, cli, probeKey, probe.Header.Revision, log)
		cancel()
	}

	opts := []lease.Option{lease.WithKeyPrefix(cfg.KeyPrefix), lease.WithDefaultTTL(cfg.DefaultTTL),
		lease.WithMaxTTL(cfg.MaxTTL), lease.WithLogger(log)}
	if cfg.MaxHold > 0 {
		opts = append(opts, lease.WithMaxHoldCap(cfg.MaxHold))
	}
	opts = append(opts, lease.WithLockDelayCap(cfg.MaxLockDelay),
		// Enforced in the join's etcd transaction: exact across replicas.
		lease.WithMaxWaitersPerLock(cfg.MaxWaitersPerLock), lease.WithMaxLocksPerIdentity(cfg.MaxLocksPerIdentity),
		lease.WithMaxWait(cfg.MaxWait))
	mgr, err := lease.New(cli, opts...)
	if err != nil {
		return err
	}
	val := fence.New(cli, mgr.Keyspace(), fence.WithMarkLimit(cfg.MaxMarksPerIdentity))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := server.NewMetrics(reg)
	metrics.CountLocks(2*time.Second, mgr.Census)
	srvOpts := []server.Option{metrics.Option()}
	if cfg.TLSCert != "" || cfg.TLSKey != "" || cfg.TLSClientCA != "" {
		ts, err := tlsconf.NewServer(cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA)
		if err != nil {
			return err
		}
		ts.OnReloadError = func(err error) {
			log.Error("TLS files changed but do not load; still serving the previous certificate", "err", err)
		}
		srvOpts = append(srvOpts, server.WithServerOptions(grpc.Creds(credentials.NewTLS(ts.Config()))))
		log.Info("gRPC over TLS", "mutual_tls", ts.MutualTLS())
	} else if !loopback(cfg.Listen) {
		log.Warn("PLAINTEXT gRPC on a non-loopback address: anyone on the network can read handles and take locks; "+
			"use --tls-cert/--tls-key (and --tls-client-ca for mutual TLS), or listen on 127.0.0.1 for a sidecar",
			"listen", cfg.Listen)
	}
	var store *authz.Store
	if cfg.AuthPolicy != "" {
		if store, err = authz.NewStore(cfg.AuthPolicy, cfg.AuthTokens); err != nil {
			return err
		}
		var authOpts []server.AuthOption
		if cfg.TLSIdentityFromCN {
			authOpts = append(authOpts, server.WithIdentityFromCN())
		}
		u, st := server.AuthInterceptors(store, authOpts...)
		srvOpts = append(srvOpts, server.WithInnerInterceptors([]grpc.UnaryServerInterceptor{u}, []grpc.StreamServerInterceptor{st}))
		log.Info("authorization on", "policy", cfg.AuthPolicy, "tokens", cfg.AuthTokens)
	} else if cfg.AuthTokens != "" {
		return errors.New("--auth-tokens needs --auth-policy: tokens name identities, the policy says what they may do")
	} else {
		log.Warn("NO AUTHORIZATION: every client may use every lock; set --auth-policy for a shared service")
	}
	if cfg.RateLimit > 0 {
		u, st := server.RateLimit(cfg.RateLimit, max(cfg.RateBurst, 1))
		srvOpts = append(srvOpts, server.WithInnerInterceptors([]grpc.UnaryServerInterceptor{u}, []grpc.StreamServerInterceptor{st}))
	}
	if cfg.MaxWatchStreams > 0 || cfg.MaxHoldStreams > 0 {
		caps := server.StreamCaps{MaxWatch: cfg.MaxWatchStreams, MaxHold: cfg.MaxHoldStreams}
		srvOpts = append(srvOpts, server.WithInnerInterceptors(nil, []grpc.StreamServerInterceptor{caps.Interceptor()}))
	}
	if cfg.MaxRecvMsgSize > 0 {
		srvOpts = append(srvOpts, server.WithServerOptions(grpc.MaxRecvMsgSize(cfg.MaxRecvMsgSize)))
	}
	if cfg.MaxConcurrentStreams > 0 {
		srvOpts = append(srvOpts, server.WithServerOptions(grpc.MaxConcurrentStreams(cfg.MaxConcurrentStreams)))
	}
	if cfg.KeepaliveMinTime > 0 {
		srvOpts = append(srvOpts, server.WithServerOptions(grpc.KeepaliveEnforcementPolicy(
			keepalive.EnforcementPolicy{MinTime: cfg.KeepaliveMinTime, PermitWithoutStream: true})))
	}
	if cfg.MaxConnectionIdle > 0 {
		srvOpts = append(srvOpts, server.WithServerOptions(grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: cfg.MaxConnectionIdle})))
	}
	gs, hs := server.NewGRPCServer(server.NewLockService(mgr, val, log), log, srvOpts...)
	metrics.Initialize(gs)
	hs.SetServingStatus(readyService, healthpb.HealthCheckResponse_NOT_SERVING)
	readyEvery := cfg.ReadinessInterval
	if readyEvery <= 0 {
		readyEvery = 2 * time.Second
	}
	var ready *opshttp.Readiness
	ready = opshttp.NewReadiness(readyEvery, time.Second, etcdProbe(cli, probeKey), func(ok bool) {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if ok {
			st = healthpb.HealthCheckResponse_SERVING
		} else {
			_, why := ready.Ready()
			log.Warn("not ready", "reason", why)
		}
		hs.SetServingStatus(readyService, st)
	})

	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %q: %w", cfg.Listen, err)
	}
	lis = server.LimitConnections(lis, cfg.MaxConnections)
	// SIGHUP is caught from here on, whether or not there is anything to
	// reload: its default action would kill the daemon without a graceful
	// stop (exit 129).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	log.Info("coordinatord serving", "addr", lis.Addr().String(), "etcd", endpoints, "key_prefix", mgr.Keyspace().Prefix())
	if cfg.OnListen != nil {
		cfg.OnListen(lis.Addr())
	}

	var hsrv *http.Server
	var mlis net.Listener
	if cfg.MetricsListen != "" {
		if mlis, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			lis.Close()
			return fmt.Errorf("listen on %q (--metrics-listen): %w", cfg.MetricsListen, err)
		}
		hsrv = &http.Server{Handler: opshttp.Handler(reg, ready), ReadHeaderTimeout: 10 * time.Second}
		log.Info("metrics serving", "addr", mlis.Addr().String(), "paths", "/metrics /healthz /readyz")
		if cfg.OnMetricsListen != nil {
			cfg.OnMetricsListen(mlis.Addr())
		}
	}

	var (
		hgs  *grpc.Server
		hlis net.Listener
	)
	if cfg.HealthListen != "" {
		if hlis, err = net.Listen("tcp", cfg.HealthListen); err != nil {
			lis.Close()
			if mlis != nil {
				mlis.Close()
			}
			return fmt.Errorf("listen on %q (--health-listen): %w", cfg.HealthListen, err)
		}
		hgs = grpc.NewServer(grpc.MaxHeaderListSize(server.MaxHeaderListSize))
		healthpb.RegisterHealthServer(hgs, hs)
		reflection.Register(hgs) // so that grpcurl needs no .proto files here either
		log.Info("plaintext gRPC health serving", "addr", hlis.Addr().String())
		if cfg.OnHealthListen != nil {
			cfg.OnHealthListen(hlis.Addr())
		}
	}

	g, gctx := errgroup.WithContext(ctx)
	if hgs != nil {
		g.Go(func() error {
			if err := hgs.Serve(hlis); err != nil {
				return fmt.Errorf("health serve: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error { ready.Run(gctx); return nil })
	// Validations share one barrier read and answer from a watch-fed view.
	g.Go(func() error { return val.Follow(gctx, log) })
	g.Go(func() error { return val.RetainMarks(gctx, cfg.MarkRetention, log) })
	if hsrv != nil {
		// Hold times and expiries are seen in etcd's history, from the
		// revision read at start-up on (only when metrics are served).
		g.Go(func() error { return mgr.WatchEnds(gctx, probe.Header.Revision, metrics.GrantEnded) })
	}
	if hsrv != nil {
		g.Go(func() error {
			if err := hsrv.Serve(mlis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("metrics serve: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error {
		if err := gs.Serve(lis); err != nil {
			return fmt.Errorf("grpc serve: %w", err)
		}
		return nil
	})
	g.Go(func() error { reloadAuth(gctx, store, cfg.AuthReloadInterval, hup, log); return nil })
	g.Go(func() error {
		<-gctx.Done()
		log.Info("shutting down", "timeout", cfg.ShutdownTimeout.String())
		ready.Stopping()
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
		if hgs != nil {
			hgs.Stop()
		}
		if hsrv != nil {
			sctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = hsrv.Shutdown(sctx)
			cancel()
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

// reloadAuth re-reads the policy and token files when they change (polled
// every interval) and on a signal from hup, until ctx ends. A file that does
// not load is logged and the previous version stays in force. Without a
// store (no --auth-policy) a signal is logged and changes nothing.
func reloadAuth(ctx context.Context, store *authz.Store, interval time.Duration, hup <-chan os.Signal, log *slog.Logger) {
	if interval <= 0 {
		interval = 5 * time.Second
	}
	var tick <-chan time.Time
	if store != nil {
		t := time.NewTicker(interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		var (
			changed bool
			err     error
		)
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if store == nil {
				log.Info("SIGHUP: nothing to reload (no --auth-policy); still serving")
				continue
			}
			changed, err = store.Reload()
		case <-tick:
			changed, err = store.ReloadIfChanged()
		}
		switch {
		case err != nil:
			log.Error("authorization files do not load; the previous policy stays in force", "err", err)
		case changed:
			log.Info("authorization files reloaded; streams of revoked identities ended")
		}
	}
}

// loopback tells whether a listen address binds only the loopback interface.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
