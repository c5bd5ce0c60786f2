// Command coordinatord serves leases on named locks with fencing tokens.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coordinatord/coordinatord/internal/daemon"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/fence"
	"github.com/coordinatord/coordinatord/internal/version"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

// errVersion is parse's answer to -version: print the version, exit 0.
var errVersion = errors.New("-version")

// run is the whole command: flags (and environment) to a Config, checked
// once by Config.Validate (a bad value exits 2, naming its flag), then the
// daemon's New, Run and Close (a failure exits 1). -help and -version print
// and exit 0.
func run(args []string) int {
	cfg, err := parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if errors.Is(err, errVersion) {
		fmt.Println("coordinatord", version.Get())
		return 0
	}
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordinatord:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, cfg); err != nil {
		cfg.Logger.Error("coordinatord failed", "err", err)
		return 1
	}
	return 0
}

// serve runs the daemon of cfg until ctx ends.
func serve(ctx context.Context, cfg daemon.Config) error {
	d, err := daemon.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Run(ctx)
}

// envPrefix starts the environment variable of every flag:
// COORDINATORD_<FLAG>, the flag's name in upper case with '-' as '_'
// (-max-ttl: COORDINATORD_MAX_TTL).
const envPrefix = "COORDINATORD_"

// applyEnv sets every flag of fs that has a COORDINATORD_* variable in
// environ, through the flag's own parser, so that a malformed value refuses
// to start exactly as the same flag would (it used to become the default
// silently); an empty value counts as unset. Run it before parsing the
// command line, which then overrides.
// It returns the COORDINATORD_* variables that name no flag, sorted, for a
// warning: their names only, since a value may be a secret.
func applyEnv(fs *flag.FlagSet, environ []string) (unknown []string, err error) {
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		rest, ok := strings.CutPrefix(k, envPrefix)
		if !ok {
			continue
		}
		name := strings.ToLower(strings.ReplaceAll(rest, "_", "-"))
		if fs.Lookup(name) == nil || rest != strings.ToUpper(rest) {
			unknown = append(unknown, k)
			continue
		}
		if v == "" {
			continue // set but empty: unset, as a manifest's `value: ""` means
		}
		if err := fs.Set(name, v); err != nil {
			return nil, fmt.Errorf("%s=%q: %w (refused as -%s would be)", k, v, err, name)
		}
	}
	slices.Sort(unknown)
	return unknown, nil
}

// uint32Value is a flag.Value for a uint32.
type uint32Value struct{ p *uint32 }

func (v uint32Value) String() string {
	if v.p == nil {
		return "0"
	}
	return strconv.FormatUint(uint64(*v.p), 10)
}

func (v uint32Value) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return errors.New("want a whole number from 0 to 4294967295")
	}
	*v.p = uint32(n)
	return nil
}

// parse turns the command line and the COORDINATORD_* environment into a
// Config, its Logger included. It refuses only what cannot become a Config
// (a malformed number, an unreadable password file, a log level or format
// that names none); Config.Validate checks the values.
func parse(args []string) (daemon.Config, error) {
	fs := flag.NewFlagSet("coordinatord", flag.ContinueOnError)
	var (
		cfg          daemon.Config
		endpoints    string
		level        string
		format       string
		passwordFile string
	)
	cfg.MaxConcurrentStreams = 1000
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:7070", "gRPC listen address (env COORDINATORD_LISTEN)")
	fs.StringVar(&endpoints, "etcd-endpoints", "", "comma-separated etcd client URLs; empty starts an embedded single-member etcd (env COORDINATORD_ETCD_ENDPOINTS)")
	fs.StringVar(&cfg.EtcdCA, "etcd-ca", "", "PEM CA bundle that signed etcd's server certificates (env COORDINATORD_ETCD_CA)")
	fs.StringVar(&cfg.EtcdCert, "etcd-cert", "", "PEM client certificate for etcd's --client-cert-auth (env COORDINATORD_ETCD_CERT)")
	fs.StringVar(&cfg.EtcdKey, "etcd-key", "", "PEM private key of -etcd-cert (env COORDINATORD_ETCD_KEY)")
	fs.StringVar(&cfg.EtcdUsername, "etcd-username", "", "etcd user (etcd auth) (env COORDINATORD_ETCD_USERNAME)")
	fs.StringVar(&passwordFile, "etcd-password-file", "", "file holding the etcd user's password (env COORDINATORD_ETCD_PASSWORD_FILE)")
	fs.StringVar(&cfg.KeyPrefix, "key-prefix", "/coordinatord/", "etcd key prefix of every key written (env COORDINATORD_KEY_PREFIX)")
	fs.StringVar(&cfg.DataDir, "data-dir", "coordinatord-data", "data directory of the embedded etcd (env COORDINATORD_DATA_DIR)")
	fs.StringVar(&cfg.EtcdAutoCompactionMode, "etcd-auto-compaction-mode", embedetcd.DefaultCompactionMode, "embedded etcd only: periodic (retention is a duration) or revision (retention is a count of revisions) (env COORDINATORD_ETCD_AUTO_COMPACTION_MODE)")
	fs.StringVar(&cfg.EtcdAutoCompactionRetention, "etcd-auto-compaction-retention", embedetcd.DefaultRetention, "embedded etcd only: history kept; a Watch can resume from a revision this old (periodic: up to twice as old); 0: no compaction but under space pressure (env COORDINATORD_ETCD_AUTO_COMPACTION_RETENTION)")
	fs.Int64Var(&cfg.EtcdQuotaBackendBytes, "etcd-quota-backend-bytes", 0, "embedded etcd only: store size at which writes are refused (RESOURCE_EXHAUSTED, reason STORE_FULL) until space is reclaimed; 0: 2 GiB (env COORDINATORD_ETCD_QUOTA_BACKEND_BYTES)")
	fs.DurationVar(&cfg.DefaultTTL, "default-ttl", 15*time.Second, "lease TTL when a request asks for none (env COORDINATORD_DEFAULT_TTL)")
	fs.DurationVar(&cfg.MaxTTL, "max-ttl", 5*time.Minute, "largest lease TTL a request may ask for (env COORDINATORD_MAX_TTL)")
	fs.DurationVar(&cfg.MaxHold, "max-hold", daemon.DefaultMaxHold, "longest a grant may be renewed; requests may ask for less (env COORDINATORD_MAX_HOLD)")
	fs.DurationVar(&cfg.MaxLockDelay, "max-lock-delay", time.Minute, "largest lock-delay a request may ask for (env COORDINATORD_MAX_LOCK_DELAY)")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", daemon.DefaultShutdownTimeout, "bound on the graceful stop (env COORDINATORD_SHUTDOWN_TIMEOUT)")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM server certificate file; with -tls-key, gRPC is served over TLS 1.2+ (env COORDINATORD_TLS_CERT)")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "PEM private key file of -tls-cert (env COORDINATORD_TLS_KEY)")
	fs.StringVar(&cfg.TLSClientCA, "tls-client-ca", "", "PEM CA bundle; set, every client must present a certificate signed by it (mutual TLS) (env COORDINATORD_TLS_CLIENT_CA)")
	fs.StringVar(&cfg.AuthPolicy, "auth-policy", "", "JSON authorization policy file; set, every call but health and reflection needs an identity (client certificate or bearer token) allowed by it (env COORDINATORD_AUTH_POLICY)")
	fs.StringVar(&cfg.AuthTokens, "auth-tokens", "", "bearer token file: lines \"identity sha256-hex-of-token\" (env COORDINATORD_AUTH_TOKENS)")
	fs.DurationVar(&cfg.AuthReloadInterval, "auth-reload-interval", daemon.DefaultAuthReloadInterval, "how often the policy and token files are checked for changes; SIGHUP reloads at once (env COORDINATORD_AUTH_RELOAD_INTERVAL)")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", "", "HTTP address of /metrics (Prometheus), /healthz and /readyz, e.g. 127.0.0.1:9090; empty: off (env COORDINATORD_METRICS_LISTEN)")
	fs.IntVar(&cfg.MaxRecvMsgSize, "max-recv-msg-size", 256<<10, "largest request message in bytes; larger ones get RESOURCE_EXHAUSTED (env COORDINATORD_MAX_RECV_MSG_SIZE)")
	fs.Var(uint32Value{&cfg.MaxConcurrentStreams}, "max-concurrent-streams", "concurrent calls per client connection (HTTP/2 streams); more wait for a free one; 0: no limit (env COORDINATORD_MAX_CONCURRENT_STREAMS)")
	fs.DurationVar(&cfg.KeepaliveMinTime, "keepalive-min-time", 10*time.Second, "clients sending HTTP/2 pings more often than this get GOAWAY (too_many_pings) (env COORDINATORD_KEEPALIVE_MIN_TIME)")
	fs.Float64Var(&cfg.RateLimit, "rate-limit", 1000, "requests per second per caller (authenticated identity, else client IP), every stream message counting as one; beyond: RESOURCE_EXHAUSTED; 0: no limit (env COORDINATORD_RATE_LIMIT)")
	fs.IntVar(&cfg.RateBurst, "rate-burst", 2000, "burst allowed above -rate-limit (env COORDINATORD_RATE_BURST)")
	fs.StringVar(&cfg.Core, "core", daemon.CoreQueue, "the lock core: queue (every queue kept in etcd) or shard (being built: locks decided in memory by one owner per shard and persisted by one guarded group commit) (env COORDINATORD_CORE)")
	fs.StringVar(&cfg.Role, "role", daemon.RoleMember, "with -core shard: member (owns shards, forwards the calls on the others' shards to their owners) or relay (owns nothing, forwards every call, e.g. as a sidecar) (env COORDINATORD_ROLE)")
	fs.StringVar(&cfg.Advertise, "advertise", "", "with -core shard: host:port the other replicas forward this member's calls to; empty: the -listen address as bound; set it to the pod IP in Kubernetes (env COORDINATORD_ADVERTISE)")
	fs.StringVar(&cfg.PeerServerName, "peer-server-name", "", "with -core shard and -tls-cert: the name every member's certificate carries, checked when a replica forwards to a peer; empty: the peer's advertised host, which its certificate must then carry (an IP SAN for a pod IP) (env COORDINATORD_PEER_SERVER_NAME)")
	fs.StringVar(&cfg.MemberSecretFile, "member-secret-file", "", "with -core shard: file holding the secret every replica shares (printable ASCII, at least 16 bytes, e.g. openssl rand -hex 32): forwarded calls carry their caller's identity with it, and a replica accepts a forwarded identity only with it; needed with -auth-policy (env COORDINATORD_MEMBER_SECRET_FILE)")
	fs.DurationVar(&cfg.ShardLeaseTTL, "shard-lease-ttl", 5*time.Second, "with -core shard: the member's etcd lease; a crashed owner's shards serve again about this long after its last renewal (env COORDINATORD_SHARD_LEASE_TTL)")
	fs.Int64Var(&cfg.MaxWaitersPerLock, "max-waiters-per-lock", 1000, "waiters allowed in one lock's queue; beyond: RESOURCE_EXHAUSTED; 0: no limit (env COORDINATORD_MAX_WAITERS_PER_LOCK)")
	fs.Int64Var(&cfg.MaxLocksPerIdentity, "max-locks-per-identity", 1000, "locks one authenticated identity may hold or wait for at once, across all replicas; beyond: RESOURCE_EXHAUSTED; applies only with -auth-policy; 0: no limit (env COORDINATORD_MAX_LOCKS_PER_IDENTITY)")
	fs.Int64Var(&cfg.MaxMarksPerIdentity, "max-marks-per-identity", fence.DefaultMarkLimit, "resource marks (ValidateToken with a resource) one identity may create, across all replicas; unauthenticated callers count as one identity; beyond: RESOURCE_EXHAUSTED; 0: no limit (env COORDINATORD_MAX_MARKS_PER_IDENTITY)")
	fs.DurationVar(&cfg.MarkRetention, "mark-retention", 30*24*time.Hour, "a resource mark whose lock has had no holder or waiter for this long is deleted (safe: see FenceService in fence.proto); 0: keep marks forever (env COORDINATORD_MARK_RETENTION)")
	fs.BoolVar(&cfg.CounterFailOpen, "counter-fail-open", false, "counter hits that name no on_unavailable policy are allowed (uncounted) while etcd is unavailable; off: they answer UNAVAILABLE (env COORDINATORD_COUNTER_FAIL_OPEN)")
	fs.DurationVar(&cfg.CounterStoreTimeout, "counter-store-timeout", daemon.DefaultCounterStoreTimeout, "how long a counter hit waits for etcd before etcd counts as unavailable and the fail-open/closed policy answers (env COORDINATORD_COUNTER_STORE_TIMEOUT)")
	fs.DurationVar(&cfg.MaxWait, "max-wait", 15*time.Minute, "longest queue wait of an Acquire: an unset wait waits this long, a longer one is INVALID_ARGUMENT; 0: no limit (env COORDINATORD_MAX_WAIT)")
	fs.StringVar(&cfg.HealthListen, "health-listen", "", "plaintext gRPC address serving only grpc.health.v1.Health, for Kubernetes gRPC probes (they cannot speak TLS); empty: off (env COORDINATORD_HEALTH_LISTEN)")
	fs.StringVar(&level, "log-level", "info", "debug, info, warn or error (env COORDINATORD_LOG_LEVEL)")
	fs.StringVar(&format, "log-format", "json", "json or text (env COORDINATORD_LOG_FORMAT)")
	fs.BoolVar(&cfg.TLSIdentityFromCN, "tls-identity-from-cn", false, "identify a client certificate without URI or DNS SANs by its subject CN; off: such a certificate names no identity, since a CN may imitate a SAN (env COORDINATORD_TLS_IDENTITY_FROM_CN)")
	fs.IntVar(&cfg.MaxWatchStreams, "max-watch-streams-per-caller", 256, "concurrent Watch streams per caller (authenticated identity, else client IP) on this replica; beyond: RESOURCE_EXHAUSTED; 0: no limit (env COORDINATORD_MAX_WATCH_STREAMS_PER_CALLER)")
	fs.IntVar(&cfg.MaxHoldStreams, "max-hold-streams-per-caller", 1000, "concurrent Hold streams per caller (authenticated identity, else client IP) on this replica; beyond: RESOURCE_EXHAUSTED; 0: no limit (env COORDINATORD_MAX_HOLD_STREAMS_PER_CALLER)")
	fs.IntVar(&cfg.MaxConnections, "max-connections", 4096, "open client connections on the gRPC listener; one beyond is closed at once; 0: no limit (env COORDINATORD_MAX_CONNECTIONS)")
	fs.DurationVar(&cfg.MaxConnectionIdle, "max-connection-idle", 5*time.Minute, "a client connection without a call for this long is sent GOAWAY (clients reconnect on their next call); 0: never (env COORDINATORD_MAX_CONNECTION_IDLE)")
	unknownEnv, err := applyEnv(fs, os.Environ())
	if err != nil {
		return cfg, err
	}
	// Registered after applyEnv: COORDINATORD_VERSION in a manifest must not
	// turn the daemon into a command that prints and exits.
	showVersion := fs.Bool("version", false, "print the version (release, VCS revision, Go toolchain) and exit")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if *showVersion {
		return cfg, errVersion
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q; see -help", fs.Args())
	}
	for _, e := range strings.Split(endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			cfg.EtcdEndpoints = append(cfg.EtcdEndpoints, e)
		}
	}
	if passwordFile != "" {
		b, err := os.ReadFile(passwordFile)
		if err != nil {
			return cfg, fmt.Errorf("-etcd-password-file: %w", err)
		}
		cfg.EtcdPassword = strings.TrimRight(string(b), "\r\n")
	}
	if cfg.Logger, err = newLogger(level, format); err != nil {
		return cfg, err
	}
	for _, k := range unknownEnv {
		cfg.Logger.Warn("unknown environment variable ignored: no flag reads it; check its spelling (see -help)", "variable", k)
	}
	return cfg, nil
}

// newLogger is the logger of -log-level and -log-format, on stderr. It is
// built here rather than checked by Config.Validate: a Config carries a
// logger, not its flags.
func newLogger(level, format string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("-log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("-log-format %q: want json or text", format)
}
