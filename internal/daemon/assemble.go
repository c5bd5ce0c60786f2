package daemon

import (
	"cmp"
	"context"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/coordinatord/coordinatord/internal/authz"
	"github.com/coordinatord/coordinatord/internal/coordinator"
	"github.com/coordinatord/coordinatord/internal/counter"
	"github.com/coordinatord/coordinatord/internal/fence"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/server"
	"github.com/coordinatord/coordinatord/internal/shard"
	"github.com/coordinatord/coordinatord/internal/tlsconf"
)

// assemble builds the coordinator (coordinator.New) from cfg: its etcd
// client, the lease manager's caps, the validator's mark limit, and the gRPC
// server's metrics, credentials, authorization and limits; then probes etcd
// through it and counts locks (the queue core's in etcd, the shard core's
// in this member's tables) and the token epoch for the metrics.
func (d *Daemon) assemble(ctx context.Context) error {
	cfg := d.cfg
	etcdCfg, err := d.etcdClientConfig()
	if err != nil {
		return err
	}
	d.reg = prometheus.NewRegistry()
	d.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	d.metrics = server.NewMetrics(d.reg)
	srvOpts, err := d.grpcOptions()
	if err != nil {
		return err
	}
	leaseOpts := []lease.Option{lease.WithKeyPrefix(cfg.KeyPrefix), lease.WithDefaultTTL(cfg.DefaultTTL), lease.WithMaxTTL(cfg.MaxTTL),
		lease.WithMaxHoldCap(cfg.MaxHold), lease.WithLockDelayCap(cfg.MaxLockDelay),
		// Enforced in the join's etcd transaction: exact across replicas.
		lease.WithMaxWaitersPerLock(cfg.MaxWaitersPerLock), lease.WithMaxLocksPerIdentity(cfg.MaxLocksPerIdentity),
		lease.WithMaxWait(cfg.MaxWait)}
	coordOpts := []coordinator.Option{
		coordinator.WithLogger(d.log),
		coordinator.WithLease(leaseOpts...),
		coordinator.WithFence(fence.WithMarkLimit(cfg.MaxMarksPerIdentity)),
		coordinator.WithCounter(counterOptions(cfg)...),
		coordinator.WithServer(srvOpts...)}
	if cfg.Core == CoreShard {
		coordOpts = append(coordOpts, coordinator.WithShardCore(d.shardOptions()...))
	}
	d.coord, err = coordinator.New(etcdCfg, coordOpts...)
	if err != nil {
		return err
	}
	d.reg.MustRegister(epochCollector{status: d.coord.Epochs().Status})
	if err := d.probeEtcd(ctx); err != nil {
		return err
	}
	if own := d.coord.Shards(); own != nil {
		// The census of this member's shards, from memory (sum over replicas).
		d.reg.MustRegister(shardCollector{status: own.Status}, shardCensus{census: own.Census})
	} else {
		// The cluster's census, from etcd (every replica counts all: max).
		d.metrics.CountLocks(2*time.Second, d.coord.Leases().Census)
	}
	d.metrics.Initialize(d.coord.GRPC())
	return nil
}

// shardOptions are the shard core's options from cfg: the member (its id
// random, its address -advertise, else the gRPC listener's) or a relay.
func (d *Daemon) shardOptions() []shard.OwnerOption {
	cfg := d.cfg
	opts := []shard.OwnerOption{shard.WithOwnerLogger(d.log), shard.WithMaxWaitersPerLock(int(cfg.MaxWaitersPerLock)), shard.WithMarkLimit(cfg.MaxMarksPerIdentity)}
	if cfg.ShardLeaseTTL > 0 {
		opts = append(opts, shard.WithLeaseTTL(cfg.ShardLeaseTTL))
	}
	advertise := cfg.Advertise
	if advertise == "" {
		advertise = d.lis.Addr().String()
		if ap, err := netip.ParseAddrPort(advertise); err == nil && cfg.Role != RoleRelay && ap.Addr().IsUnspecified() {
			d.log.Warn("the shard core's member advertises a wildcard address, which its peers cannot reach; set -advertise (the pod IP in Kubernetes)",
				"advertise", advertise)
		}
	}
	opts = append(opts, shard.WithMember("", advertise))
	if cfg.Role == RoleRelay {
		opts = append(opts, shard.AsRelay())
	}
	d.log.Info("shard core", "role", cmp.Or(cfg.Role, RoleMember), "advertise", advertise)
	return opts
}

// grpcOptions are the gRPC server's options from cfg: metrics, TLS,
// authorization (loading the policy into d.store), the shard core's
// forwarding, rate and stream caps, the wait limit, and gRPC's own
// message, stream, keepalive and idle limits.
func (d *Daemon) grpcOptions() ([]server.Option, error) {
	cfg, log := d.cfg, d.log
	opts := []server.Option{d.metrics.Option()}
	if cfg.TLSCert != "" || cfg.TLSKey != "" || cfg.TLSClientCA != "" {
		ts, err := tlsconf.NewServer(cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA)
		if err != nil {
			return nil, err
		}
		ts.OnReloadError = func(err error) {
			log.Error("TLS files changed but do not load; still serving the previous certificate", "err", err)
		}
		opts = append(opts, server.WithServerOptions(grpc.Creds(credentials.NewTLS(ts.Config()))))
		log.Info("gRPC over TLS", "mutual_tls", ts.MutualTLS())
		if cfg.Core == CoreShard {
			// Peers serve the same TLS: their certificates are checked
			// against -tls-client-ca (else the system roots), and this
			// replica's certificate is its client certificate.
			peerTLS, err := tlsconf.Client(cfg.TLSClientCA, cfg.TLSCert, cfg.TLSKey)
			if err != nil {
				return nil, err
			}
			if cfg.PeerServerName != "" { // one name on every member's certificate, not each pod's IP
				peerTLS.ServerName = cfg.PeerServerName
			}
			opts = append(opts, server.WithPeerDialOptions(grpc.WithTransportCredentials(credentials.NewTLS(peerTLS))))
		}
	} else if !loopback(cfg.Listen) {
		log.Warn("PLAINTEXT gRPC on a non-loopback address: anyone on the network can read handles and take locks; "+
			"use --tls-cert/--tls-key (and --tls-client-ca for mutual TLS), or listen on 127.0.0.1 for a sidecar",
			"listen", cfg.Listen)
	}
	if cfg.AuthPolicy != "" {
		store, err := authz.NewStore(cfg.AuthPolicy, cfg.AuthTokens)
		if err != nil {
			return nil, err
		}
		d.store = store
		var authOpts []server.AuthOption
		if cfg.TLSIdentityFromCN {
			authOpts = append(authOpts, server.WithIdentityFromCN())
		}
		u, st := server.AuthInterceptors(store, authOpts...)
		opts = append(opts, server.WithInnerInterceptors([]grpc.UnaryServerInterceptor{u}, []grpc.StreamServerInterceptor{st}))
		log.Info("authorization on", "policy", cfg.AuthPolicy, "tokens", cfg.AuthTokens)
	} else {
		log.Warn("NO AUTHORIZATION: every client may use every lock; set --auth-policy for a shared service")
	}
	secret, err := cfg.memberSecret()
	if err != nil {
		return nil, err
	}
	switch {
	case secret != nil:
		opts = append(opts, server.WithMemberSecret(secret))
	case cfg.Core == CoreShard && cfg.AuthPolicy != "":
		log.Warn("no -member-secret-file: calls of authenticated clients on shards owned by other members are not forwarded " +
			"(they answer SHARD_NOT_SERVED); give every replica the same -member-secret-file")
	}
	if cfg.RateLimit > 0 {
		u, st := server.RateLimit(cfg.RateLimit, max(cfg.RateBurst, 1))
		opts = append(opts, server.WithInnerInterceptors([]grpc.UnaryServerInterceptor{u}, []grpc.StreamServerInterceptor{st}))
	}
	if cfg.MaxWatchStreams > 0 || cfg.MaxHoldStreams > 0 {
		caps := server.StreamCaps{MaxWatch: cfg.MaxWatchStreams, MaxHold: cfg.MaxHoldStreams}
		opts = append(opts, server.WithInnerInterceptors(nil, []grpc.StreamServerInterceptor{caps.Interceptor()}))
	}
	if cfg.MaxRecvMsgSize > 0 {
		opts = append(opts, server.WithServerOptions(grpc.MaxRecvMsgSize(cfg.MaxRecvMsgSize)))
	}
	if cfg.MaxConcurrentStreams > 0 {
		opts = append(opts, server.WithServerOptions(grpc.MaxConcurrentStreams(cfg.MaxConcurrentStreams)))
	}
	if cfg.KeepaliveMinTime > 0 {
		opts = append(opts, server.WithServerOptions(grpc.KeepaliveEnforcementPolicy(
			keepalive.EnforcementPolicy{MinTime: cfg.KeepaliveMinTime, PermitWithoutStream: true})))
	}
	if cfg.MaxConnectionIdle > 0 {
		opts = append(opts, server.WithServerOptions(grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: cfg.MaxConnectionIdle})))
	}
	return opts, nil
}

// counterOptions are the counters' options of cfg: the unavailable-store
// policy and the store timeout.
func counterOptions(cfg Config) []counter.Option {
	opts := []counter.Option{counter.WithPolicy(counter.FailClosed)}
	if cfg.CounterFailOpen {
		opts[0] = counter.WithPolicy(counter.FailOpen)
	}
	if cfg.CounterStoreTimeout > 0 {
		opts = append(opts, counter.WithStoreTimeout(cfg.CounterStoreTimeout))
	}
	return opts
}
