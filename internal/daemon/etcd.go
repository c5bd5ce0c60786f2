package daemon

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"

	"github.com/coordinatord/coordinatord/internal/logging"
	"github.com/coordinatord/coordinatord/internal/tlsconf"
)

// flowWindow is the HTTP/2 flow-control window of the etcd client's
// streams and connection.
const flowWindow = 1 << 20

// startEtcd starts the embedded single-member etcd when no EtcdEndpoints are
// given, and records the endpoints the coordinator's client dials.
func (d *Daemon) startEtcd(ctx context.Context) error {
	d.endpoints = d.cfg.EtcdEndpoints
	if len(d.endpoints) > 0 {
		return nil
	}
	d.log.Warn("SINGLE-NODE MODE: no --etcd-endpoints given, starting an embedded single-member etcd; "+
		"fine for a laptop, a demo or one node, but it is a single point of failure: use a 3- or 5-member etcd cluster in production",
		"data_dir", d.cfg.DataDir)
	e, err := startEmbedded(ctx, d.cfg, d.log)
	if err != nil {
		return err
	}
	d.embedded = e
	d.endpoints = e.Endpoints()
	return nil
}

// etcdClientConfig is the configuration of the coordinator's etcd client:
// TLS and credentials from cfg, etcd's own logs at error level only.
func (d *Daemon) etcdClientConfig() (clientv3.Config, error) {
	etcdTLS, err := tlsconf.Client(d.cfg.EtcdCA, d.cfg.EtcdCert, d.cfg.EtcdKey)
	if err != nil {
		return clientv3.Config{}, fmt.Errorf("etcd client TLS: %w", err)
	}
	return clientv3.Config{
		Endpoints:   d.endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      logging.Zap(d.log, zapcore.ErrorLevel),
		TLS:         etcdTLS,
		Username:    d.cfg.EtcdUsername,
		Password:    d.cfg.EtcdPassword,
		// Fixed flow-control windows turn off gRPC's bandwidth estimator,
		// which pings etcd for most responses: a packet each way per
		// request for nothing (requests and answers here are small).
		DialOptions: []grpc.DialOption{
			grpc.WithInitialWindowSize(flowWindow), grpc.WithInitialConnWindowSize(flowWindow),
		},
	}, nil
}

// probeEtcd checks that etcd answers (with quorum) and records its current
// revision; an external etcd that has never compacted is reported.
func (d *Daemon) probeEtcd(ctx context.Context) error {
	cli := d.coord.Etcd()
	d.probeKey = d.coord.Leases().Keyspace().Readyz()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	probe, err := cli.Get(pctx, d.probeKey, clientv3.WithCountOnly())
	cancel()
	if err != nil {
		return fmt.Errorf("etcd at %v is not reachable: %w; check --etcd-endpoints and that the cluster has quorum", d.endpoints, err)
	}
	d.startRev = probe.Header.Revision
	if len(d.cfg.EtcdEndpoints) > 0 {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		warnIfNeverCompacted(wctx, cli, d.probeKey, d.startRev, d.log)
		cancel()
	}
	return nil
}
