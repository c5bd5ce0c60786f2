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

	"github.com/coordinatord/coordinatord/internal/opshttp"
	"github.com/coordinatord/coordinatord/internal/server"
)

// watchReadiness sets up the readiness probe of etcd (every
// ReadinessInterval): it drives /readyz and the gRPC health status of
// readyService, NOT_SERVING until the first probe succeeds.
func (d *Daemon) watchReadiness(context.Context) error {
	hs, log := d.coord.Health(), d.log
	hs.SetServingStatus(readyService, healthpb.HealthCheckResponse_NOT_SERVING)
	var ready *opshttp.Readiness
	ready = opshttp.NewReadiness(d.cfg.readinessInterval(), time.Second, etcdProbe(d.coord.Etcd(), d.probeKey), func(ok bool) {
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
