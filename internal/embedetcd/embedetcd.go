// Package embedetcd runs a single-member etcd inside the process: the
// zero-setup default of the daemon and the real etcd every test runs against.
package embedetcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"sync"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap/zapcore"

	"github.com/coordinatord/coordinatord/internal/logging"
)

// Server is a running embedded etcd member.
type Server struct {
	etcd   *embed.Etcd
	scheme string
	close  sync.Once
}

type options struct {
	fast   bool
	logger *slog.Logger
	name   string
	tls    *transport.TLSInfo
}

// Option configures Start.
type Option func(*options)

// WithFastElection sets TickMs=10 and ElectionMs=100 so that a member starts
// in ~50 ms, and the cheapest bcrypt cost for etcd auth passwords; meant for
// tests. etcd's minimum lease TTL becomes 1s.
func WithFastElection() Option { return func(o *options) { o.fast = true } }

// WithLogger sends etcd's own log lines, at warning level and above, to l.
// Without it they are discarded.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithClientTLS serves clients over TLS with certFile and keyFile, and
// requires client certificates signed by the CA in caFile (etcd's
// --client-cert-auth). Meant for tests of a secured etcd.
func WithClientTLS(certFile, keyFile, caFile string) Option {
	return func(o *options) {
		o.tls = &transport.TLSInfo{CertFile: certFile, KeyFile: keyFile, TrustedCAFile: caFile, ClientCertAuth: true}
	}
}

// Start runs a single-member etcd whose data lives in dataDir (created if
// missing; reused if it holds a previous member's data). Client and peer
// listeners bind 127.0.0.1 on ports the kernel picks, so they never collide
// with a system etcd on 2379/2380.
func Start(ctx context.Context, dataDir string, opts ...Option) (*Server, error) {
	o := options{name: "coordinatord"}
	for _, opt := range opts {
		opt(&o)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded etcd: data dir: %w", err)
	}
	cfg := embed.NewConfig()
	cfg.Name = o.name
	cfg.Dir = dataDir
	if o.fast {
		cfg.TickMs = 10
		cfg.ElectionMs = 100
		cfg.BcryptCost = 4 // bcrypt's minimum: etcd auth in tests, fast even under -race
	}
	local := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	client := local
	if o.tls != nil {
		client.Scheme = "https"
		cfg.ClientTLSInfo = *o.tls
	}
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}
	cfg.ListenPeerUrls = []url.URL{local}
	cfg.AdvertisePeerUrls = []url.URL{local}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(logging.Zap(o.logger, zapcore.WarnLevel))

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: start in %q: %w", dataDir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: not ready: %w", ctx.Err())
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, errors.New("embedded etcd: not ready after 60s; check the data directory and the log")
	}
	return &Server{etcd: e, scheme: client.Scheme}, nil
}

// Endpoints are the client URLs to dial.
func (s *Server) Endpoints() []string {
	eps := make([]string, 0, len(s.etcd.Clients))
	for _, l := range s.etcd.Clients {
		eps = append(eps, s.scheme+"://"+l.Addr().String())
	}
	return eps
}

// Close stops the member and waits for it. Closing twice is harmless.
func (s *Server) Close() { s.close.Do(s.etcd.Close) }
