package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/coordinatord/coordinatord/internal/embedetcd"
)

// The etcd child comes in two configurations:
//
//   - roleEtcd, a plain etcd: embed.NewConfig()'s defaults, as etcd's users
//     run it (and as coordinatord reaches a real etcd cluster): default
//     timings, no auto-compaction (the benchmark compacts between cells),
//     clients and peer on plain HTTP on 127.0.0.1, etcd's default log level
//     (info) written to a file in its data directory. Every scenario runs
//     on it, for every system.
//   - roleEtcdEmbedded, coordinatord's embedded etcd (internal/embedetcd:
//     periodic auto-compaction, the space keeper, peer TLS), which every
//     scenario ran on before; -peer-only measures the Mutex on it too, to
//     show what it changed (docs/BENCHMARKS.md, "Peer fairness").
const roleEtcdEmbedded = "child-etcd-embedded"

// etcdChild is a running etcd member of either configuration.
type etcdChild interface {
	Endpoints() []string
	Close()
}

type plainEtcd struct{ e *embed.Etcd }

func (p plainEtcd) Endpoints() []string {
	eps := make([]string, 0, len(p.e.Clients))
	for _, l := range p.e.Clients {
		eps = append(eps, "http://"+l.Addr().String())
	}
	return eps
}

func (p plainEtcd) Close() { p.e.Close() }

// startEtcd starts the etcd of role in dataDir and waits until it serves.
func startEtcd(ctx context.Context, role, dataDir string) (etcdChild, error) {
	if role == roleEtcdEmbedded {
		// etcd's default timings (TickMs 100, ElectionMs 1000), and TCP as
		// a separate etcd cluster is reached (not the embedded mode's socket).
		return embedetcd.Start(ctx, dataDir, embedetcd.WithInsecureTCPClients())
	}
	cfg := embed.NewConfig()
	cfg.Dir = dataDir
	local := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{local}, []url.URL{local}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{local}, []url.URL{local}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogOutputs = []string{filepath.Join(dataDir, "etcd.log")}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return plainEtcd{e}, nil
	case err = <-e.Err():
	case <-ctx.Done():
		err = ctx.Err()
	case <-time.After(60 * time.Second):
		err = errors.New("not ready after 60s")
	}
	e.Close()
	return nil, fmt.Errorf("etcd: %w", err)
}
