// Package embedetcd runs a single-member etcd inside the process: the
// zero-setup default of the daemon and the real etcd every test runs against.
//
// The member is private to the process (see private.go) and keeps its store
// bounded (see space.go): history is compacted (by default every 5 minutes,
// keeping the last 5 to 10 minutes), the file defragmented when most of it
// is free, and a full store (etcd's NOSPACE alarm) is recovered without an
// operator.
package embedetcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap/zapcore"

	"github.com/coordinatord/coordinatord/internal/logging"
)

// Compaction defaults: periodic mode keeps history by time, so a Watch cut
// off can resume from its last revision for at least DefaultRetention (5 to
// 10 minutes: etcd compacts every retention, to the revision it had one
// retention earlier). At ~776 B of history per acquire/release, 10 minutes
// at a sustained 1,000 cycles/s is ~470 MB, a quarter of the default 2 GiB
// quota; faster writers are covered by the compaction under space pressure
// in space.go.
const (
	DefaultCompactionMode = "periodic"
	DefaultRetention      = "5m"
)

// Server is a running embedded etcd member.
type Server struct {
	etcd    *embed.Etcd
	scheme  string
	tempDir string // socket directory to remove on Close, if not in the data dir
	space   *keeper
	close   sync.Once
}

type options struct {
	fast       bool
	logger     *slog.Logger
	name       string
	tls        *transport.TLSInfo
	tcp        bool
	mode       string
	retention  string
	quota      int64
	spaceCheck time.Duration
}

// Option configures Start.
type Option func(*options)

// WithFastElection sets TickMs=10 and ElectionMs=100 so that a member starts
// in ~50 ms, and the cheapest bcrypt cost for etcd auth passwords; meant for
// tests. etcd's minimum lease TTL becomes 1s.
func WithFastElection() Option { return func(o *options) { o.fast = true } }

// WithLogger sends etcd's own log lines, at warning level and above, and
// the space keeper's, to l. Without it they are discarded.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithClientTLS serves clients on 127.0.0.1 over TLS with certFile and
// keyFile, and requires client certificates signed by the CA in caFile
// (etcd's --client-cert-auth), instead of the private unix socket. Meant for
// tests of a secured etcd.
func WithClientTLS(certFile, keyFile, caFile string) Option {
	return func(o *options) {
		o.tls = &transport.TLSInfo{CertFile: certFile, KeyFile: keyFile, TrustedCAFile: caFile, ClientCertAuth: true}
	}
}

// WithInsecureTCPClients serves clients on 127.0.0.1 over plain HTTP with
// no authentication, instead of the private unix socket: ANY local process
// can then read and write every key. Only for tests that must put a TCP
// proxy between a client and the member.
func WithInsecureTCPClients() Option { return func(o *options) { o.tcp = true } }

// WithAutoCompaction sets etcd's --auto-compaction-mode ("periodic" or
// "revision") and --auto-compaction-retention (periodic: a duration such as
// "5m", or a number of hours; revision: how many revisions to keep, checked
// every 5 minutes). Retention "0" turns it off. The default is periodic,
// 5m. A Watch whose start_revision was compacted answers OUT_OF_RANGE.
func WithAutoCompaction(mode, retention string) Option {
	return func(o *options) { o.mode, o.retention = mode, retention }
}

// WithQuota sets etcd's --quota-backend-bytes, the size at which the store
// refuses writes (NOSPACE alarm); 0 is etcd's default, 2 GiB.
func WithQuota(bytes int64) Option { return func(o *options) { o.quota = bytes } }

// WithSpaceCheck sets how often the space keeper looks at the store's size
// and alarms (default 5s); see space.go.
func WithSpaceCheck(every time.Duration) Option { return func(o *options) { o.spaceCheck = every } }

// ValidateCompaction tells whether mode and retention are what etcd accepts,
// with an error that names the setting.
func ValidateCompaction(mode, retention string) error {
	switch mode {
	case "periodic":
		if n, err := strconv.Atoi(retention); err == nil {
			if n < 0 {
				return fmt.Errorf("auto-compaction retention %q: must not be negative", retention)
			}
			return nil
		}
		if d, err := time.ParseDuration(retention); err != nil || d < 0 {
			return fmt.Errorf("auto-compaction retention %q: want a duration such as 5m (or 0: off) in periodic mode", retention)
		}
	case "revision":
		if n, err := strconv.ParseInt(retention, 10, 64); err != nil || n < 0 {
			return fmt.Errorf("auto-compaction retention %q: want a number of revisions (or 0: off) in revision mode", retention)
		}
	default:
		return fmt.Errorf("auto-compaction mode %q: want periodic or revision", mode)
	}
	return nil
}

// Start runs a single-member etcd whose data lives in dataDir (created if
// missing; reused if it holds a previous member's data). Clients connect
// through a unix socket in dataDir/private (mode 0700); the peer listener
// binds 127.0.0.1 on a port the kernel picks, with TLS and client
// certificates nobody holds (see private.go).
func Start(ctx context.Context, dataDir string, opts ...Option) (*Server, error) {
	o := options{name: "coordinatord", mode: DefaultCompactionMode, retention: DefaultRetention, spaceCheck: 5 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	if err := ValidateCompaction(o.mode, o.retention); err != nil {
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	if o.quota < 0 {
		return nil, fmt.Errorf("embedded etcd: quota %d bytes: must not be negative", o.quota)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded etcd: data dir: %w", err)
	}
	private, err := privateDir(filepath.Join(dataDir, privateDirName))
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: private directory: %w", err)
	}
	s := &Server{}
	cfg, err := s.config(o, dataDir, private)
	if err != nil {
		s.removeTemp()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		s.removeTemp()
		return nil, fmt.Errorf("embedded etcd: start in %q: %w", dataDir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err = <-e.Err():
	case <-ctx.Done():
		err = fmt.Errorf("not ready: %w", ctx.Err())
	case <-time.After(60 * time.Second):
		err = errors.New("not ready after 60s; check the data directory and the log")
	}
	if err != nil {
		e.Close()
		s.removeTemp()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	s.etcd = e
	s.space = startKeeper(e.Server, quotaOf(cfg), o.spaceCheck, o.logger)
	return s, nil
}

// config is etcd's configuration for o, with the client and peer listeners
// private to this process.
func (s *Server) config(o options, dataDir, private string) (*embed.Config, error) {
	cfg := embed.NewConfig()
	cfg.Name = o.name
	cfg.Dir = dataDir
	if o.fast {
		cfg.TickMs = 10
		cfg.ElectionMs = 100
		cfg.BcryptCost = 4 // bcrypt's minimum: etcd auth in tests, fast even under -race
	}
	cfg.AutoCompactionMode, cfg.AutoCompactionRetention = o.mode, o.retention
	cfg.QuotaBackendBytes = o.quota

	var client url.URL
	switch {
	case o.tls != nil:
		client = url.URL{Scheme: "https", Host: "127.0.0.1:0"}
		cfg.ClientTLSInfo = *o.tls
	case o.tcp:
		client = url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	default:
		dir, temporary, err := socketDir(private)
		if err != nil {
			return nil, fmt.Errorf("socket directory: %w", err)
		}
		if temporary {
			s.tempDir = dir
		}
		client = url.URL{Scheme: "unix", Path: filepath.Join(dir, "client.sock")}
	}
	s.scheme = client.Scheme
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}

	peerTLS, err := peerTLS(private)
	if err != nil {
		return nil, fmt.Errorf("peer certificate: %w", err)
	}
	cfg.PeerTLSInfo = *peerTLS
	peer := url.URL{Scheme: "https", Host: "127.0.0.1:0"}
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(logging.Zap(o.logger, zapcore.WarnLevel))
	return cfg, nil
}

// Endpoints are the client URLs to dial (clientv3 understands unix://).
func (s *Server) Endpoints() []string {
	eps := make([]string, 0, len(s.etcd.Clients))
	for _, l := range s.etcd.Clients {
		eps = append(eps, s.scheme+"://"+l.Addr().String())
	}
	return eps
}

// Close stops the space keeper and the member, and waits for both. Closing
// twice is harmless.
func (s *Server) Close() {
	s.close.Do(func() {
		s.space.stop()
		s.etcd.Close()
		s.removeTemp()
	})
}

func (s *Server) removeTemp() {
	if s.tempDir != "" {
		_ = os.RemoveAll(s.tempDir)
	}
}
