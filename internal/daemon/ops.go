package daemon

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/coordinatord/coordinatord/internal/epoch"
	"github.com/coordinatord/coordinatord/internal/opshttp"
	"github.com/coordinatord/coordinatord/internal/server"
)

// watchReadiness sets up the readiness probe (readinessProbe, every
// ReadinessInterval): it drives /readyz and the gRPC health status of
// readyService, NOT_SERVING until the first probe succeeds.
func (d *Daemon) watchReadiness(context.Context) error {
	hs, log := d.coord.Health(), d.log
	hs.SetServingStatus(readyService, healthpb.HealthCheckResponse_NOT_SERVING)
	var ready *opshttp.Readiness
	probe := readinessProbe(etcdProbe(d.coord.Etcd(), d.probeKey), d.coord.Epochs().Status)
	ready = opshttp.NewReadiness(d.cfg.readinessInterval(), time.Second, probe, func(ok bool) {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if ok {
			st = healthpb.HealthCheckResponse_SERVING
		} else {
			_, why := ready.Ready()
			log.Warn("not ready", "reason", why)
		}
		hs.SetServingStatus(readyService, st)
	})
	d.ready = ready
	return nil
}

// readinessProbe is one readiness probe: etcd answers (etcdProbe), and the
// token epoch is open. Its error is the reason /readyz gives.
//
// A paused epoch makes the replica unready, as an unreachable etcd or a full
// store (NOSPACE) does: while paused it answers every grant, renewal,
// release and validation UNAVAILABLE (reason EPOCH_PAUSED), so callers are
// better served by a replica that is not. It is decided the way etcd's
// reachability is, so as not to make the deployment flap more than etcd
// does: sampled by the same probe (every ReadinessInterval, 2 s), with no
// grace of its own, and Kubernetes takes a pod out only after
// failureThreshold failed probes in a row (deploy/: 2 or 3, 5 s apart). The
// pauses that every replica shares at once are etcd's own: a failed check
// of etcd's history is a failed etcd call, which fails the etcd probe too
// (and the next check, a second later, reopens), and a restore, during
// which etcd serves nobody anyway. A pause between two probes is never
// seen; a pause seen by one probe alone takes no pod out.
func readinessProbe(etcd func(context.Context) error, epochs func() epoch.State) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := etcd(ctx); err != nil {
			return fmt.Errorf("etcd probe failed: %w", err)
		}
		if why := epochs().Paused; why != "" {
			return fmt.Errorf("EPOCH_PAUSED: granting and validating are paused: %s", why)
		}
		return nil
	}
}

// listenMetrics binds MetricsListen, if set, for /metrics, /healthz and
// /readyz.
func (d *Daemon) listenMetrics() error {
	cfg := d.cfg
	if cfg.MetricsListen == "" {
		return nil
	}
	mlis, err := net.Listen("tcp", cfg.MetricsListen)
	if err != nil {
		return fmt.Errorf("listen on %q (--metrics-listen): %w", cfg.MetricsListen, err)
	}
	d.mlis = mlis
	d.hsrv = &http.Server{Handler: opshttp.Handler(d.reg, d.ready), ReadHeaderTimeout: 10 * time.Second}
	d.log.Info("metrics serving", "addr", mlis.Addr().String(), "paths", "/metrics /healthz /readyz")
	if cfg.OnMetricsListen != nil {
		cfg.OnMetricsListen(mlis.Addr())
	}
	return nil
}

// listenHealth binds HealthListen, if set, for a plaintext gRPC server of
// the health service only (and reflection).
func (d *Daemon) listenHealth() error {
	cfg := d.cfg
	if cfg.HealthListen == "" {
		return nil
	}
	hlis, err := net.Listen("tcp", cfg.HealthListen)
	if err != nil {
		return fmt.Errorf("listen on %q (--health-listen): %w", cfg.HealthListen, err)
	}
	d.hlis = hlis
	d.hgs = grpc.NewServer(grpc.MaxHeaderListSize(server.MaxHeaderListSize))
	healthpb.RegisterHealthServer(d.hgs, d.coord.Health())
	reflection.Register(d.hgs) // so that grpcurl needs no .proto files here either
	d.log.Info("plaintext gRPC health serving", "addr", hlis.Addr().String())
	if cfg.OnHealthListen != nil {
		cfg.OnHealthListen(hlis.Addr())
	}
	return nil
}
