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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coordinatord/coordinatord/internal/daemon"
	"github.com/coordinatord/coordinatord/internal/fence"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cfg, logger, err := parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordinatord:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := daemon.Run(ctx, cfg); err != nil {
		logger.Error("coordinatord failed", "err", err)
		return 1
	}
	return 0
}

// env returns $COORDINATORD_<NAME> or def.
func env(name, def string) string {
	if v, ok := os.LookupEnv("COORDINATORD_" + name); ok {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	v := env(name, "")
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "coordinatord: COORDINATORD_%s=%q is not a duration; using %v\n", name, v, def)
		return def
	}
	return d
}

func envInt(name string, def int) int {
	v := env(name, "")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "coordinatord: COORDINATORD_%s=%q is not an integer; using %d\n", name, v, def)
		return def
	}
	return n
}

func envFloat(name string, def float64) float64 {
	v := env(name, "")
	if v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		fmt.Fprintf(os.Stderr, "coordinatord: COORDINATORD_%s=%q is not a number; using %g\n", name, v, def)
		return def
	}
	return f
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

func parse(args []string) (daemon.Config, *slog.Logger, error) {
	fs := flag.NewFlagSet("coordinatord", flag.ContinueOnError)
	var (
		cfg          daemon.Config
		endpoints    string
		level        string
		format       string
		passwordFile string
	)
	cfg.MaxConcurrentStreams = uint32(envInt("MAX_CONCURRENT_STREAMS", 1000))
	fs.StringVar(&cfg.Listen, "listen", env("LISTEN", "127.0.0.1:7070"), "gRPC listen address (env COORDINATORD_LISTEN)")
	fs.StringVar(&endpoints, "etcd-endpoints", env("ETCD_ENDPOINTS", ""), "comma-separated etcd client URLs; empty starts an embedded single-member etcd (env COORDINATORD_ETCD_ENDPOINTS)")
	fs.StringVar(&cfg.EtcdCA, "etcd-ca", env("ETCD_CA", ""), "PEM CA bundle that signed etcd's server certificates (env COORDINATORD_ETCD_CA)")
	fs.StringVar(&cfg.EtcdCert, "etcd-cert", env("ETCD_CERT", ""), "PEM client certificate for etcd's --client-cert-auth (env COORDINATORD_ETCD_CERT)")
	fs.StringVar(&cfg.EtcdKey, "etcd-key", env("ETCD_KEY", ""), "PEM private key of -etcd-cert (env COORDINATORD_ETCD_KEY)")
	fs.StringVar(&cfg.EtcdUsername, "etcd-username", env("ETCD_USERNAME", ""), "etcd user (etcd auth) (env COORDINATORD_ETCD_USERNAME)")
	fs.StringVar(&passwordFile, "etcd-password-file", env("ETCD_PASSWORD_FILE", ""), "file holding the etcd user's password (env COORDINATORD_ETCD_PASSWORD_FILE)")
	fs.StringVar(&cfg.KeyPrefix, "key-prefix", env("KEY_PREFIX", "/coordinatord/"), "etcd key prefix of every key written (env COORDINATORD_KEY_PREFIX)")
	fs.StringVar(&cfg.DataDir, "data-dir", env("DATA_DIR", "coordinatord-data"), "data directory of the embedded etcd (env COORDINATORD_DATA_DIR)")
	fs.DurationVar(&cfg.DefaultTTL, "default-ttl", envDuration("DEFAULT_TTL", 15*time.Second), "lease TTL when a request asks for none (env COORDINATORD_DEFAULT_TTL)")
	fs.DurationVar(&cfg.MaxTTL, "max-ttl", envDuration("MAX_TTL", 5*time.Minute), "largest lease TTL a request may ask for (env COORDINATORD_MAX_TTL)")
	fs.DurationVar(&cfg.MaxHold, "max-hold", envDuration("MAX_HOLD", time.Hour), "longest a grant may be renewed; requests may ask for less (env COORDINATORD_MAX_HOLD)")
	fs.DurationVar(&cfg.MaxLockDelay, "max-lock-delay", envDuration("MAX_LOCK_DELAY", time.Minute), "largest lock-delay a request may ask for (env COORDINATORD_MAX_LOCK_DELAY)")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", envDuration("SHUTDOWN_TIMEOUT", 10*time.Second), "bound on the graceful stop (env COORDINATORD_SHUTDOWN_TIMEOUT)")
	fs.StringVar(&cfg.TLSCert, "tls-cert", env("TLS_CERT", ""), "PEM server certificate file; with -tls-key, gRPC is served over TLS 1.2+ (env COORDINATORD_TLS_CERT)")
	fs.StringVar(&cfg.TLSKey, "tls-key", env("TLS_KEY", ""), "PEM private key file of -tls-cert (env COORDINATORD_TLS_KEY)")
	fs.StringVar(&cfg.TLSClientCA, "tls-client-ca", env("TLS_CLIENT_CA", ""), "PEM CA bundle; set, every client must present a certificate signed by it (mutual TLS) (env COORDINATORD_TLS_CLIENT_CA)")
	fs.StringVar(&cfg.AuthPolicy, "auth-policy", env("AUTH_POLICY", ""), "JSON authorization policy file; set, every call but health and reflection needs an identity (client certificate or bearer token) allowed by it (env COORDINATORD_AUTH_POLICY)")
	fs.StringVar(&cfg.AuthTokens, "auth-tokens", env("AUTH_TOKENS", ""), "bearer token file: lines \"identity sha256-hex-of-token\" (env COORDINATORD_AUTH_TOKENS)")
	fs.DurationVar(&cfg.AuthReloadInterval, "auth-reload-interval", envDuration("AUTH_RELOAD_INTERVAL", 5*time.Second), "how often the policy and token files are checked for changes; SIGHUP reloads at once (env COORDINATORD_AUTH_RELOAD_INTERVAL)")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", env("METRICS_LISTEN", ""), "HTTP address of /metrics (Prometheus), /healthz and /readyz, e.g. 127.0.0.1:9090; empty: off (env COORDINATORD_METRICS_LISTEN)")
	fs.IntVar(&cfg.MaxRecvMsgSize, "max-recv-msg-size", envInt("MAX_RECV_MSG_SIZE", 256<<10), "largest request message in bytes; larger ones get RESOURCE_EXHAUSTED (env COORDINATORD_MAX_RECV_MSG_SIZE)")
	fs.Var(uint32Value{&cfg.MaxConcurrentStreams}, "max-concurrent-streams", "concurrent calls per client connection (HTTP/2 streams); more wait for a free one; 0: no limit (env COORDINATORD_MAX_CONCURRENT_STREAMS)")
	fs.DurationVar(&cfg.KeepaliveMinTime, "keepalive-min-time", envDuration("KEEPALIVE_MIN_TIME", 10*time.Second), "clients sending HTTP/2 pings more often than this get GOAWAY (too_many_pings) (env COORDINATORD_KEEPALIVE_MIN_TIME)")
	fs.Float64Var(&cfg.RateLimit, "rate-limit", envFloat("RATE_LIMIT", 1000), "requests per second per caller (authenticated identity, else client IP); beyond: RESOURCE_EXHAUSTED; 0: no limit (env COORDINATORD_RATE_LIMIT)")
	fs.IntVar(&cfg.RateBurst, "rate-burst", envInt("RATE_BURST", 2000), "burst allowed above -rate-limit (env COORDINATORD_RATE_BURST)")
	fs.Int64Var(&cfg.MaxWaitersPerLock, "max-waiters-per-lock", int64(envInt("MAX_WAITERS_PER_LOCK", 1000)), "waiters allowed in one lock's queue; beyond: RESOURCE_EXHAUSTED; 0: no limit (env COORDINATORD_MAX_WAITERS_PER_LOCK)")
	fs.Int64Var(&cfg.MaxLocksPerIdentity, "max-locks-per-identity", int64(envInt("MAX_LOCKS_PER_IDENTITY", 1000)), "locks one authenticated identity may hold or wait for at once, across all replicas; beyond: RESOURCE_EXHAUSTED; applies only with -auth-policy; 0: no limit (env COORDINATORD_MAX_LOCKS_PER_IDENTITY)")
	fs.Int64Var(&cfg.MaxMarksPerIdentity, "max-marks-per-identity", int64(envInt("MAX_MARKS_PER_IDENTITY", fence.DefaultMarkLimit)), "resource marks (ValidateToken with a resource) one identity may create, across all replicas; unauthenticated callers count as one identity; beyond: RESOURCE_EXHAUSTED; 0: no limit (env COORDINATORD_MAX_MARKS_PER_IDENTITY)")
	fs.DurationVar(&cfg.MarkRetention, "mark-retention", envDuration("MARK_RETENTION", 30*24*time.Hour), "a resource mark whose lock has had no holder or waiter for this long is deleted (safe: see FenceService in fence.proto); 0: keep marks forever (env COORDINATORD_MARK_RETENTION)")
	fs.DurationVar(&cfg.MaxWait, "max-wait", envDuration("MAX_WAIT", 15*time.Minute), "longest queue wait of an Acquire: an unset wait waits this long, a longer one is INVALID_ARGUMENT; 0: no limit (env COORDINATORD_MAX_WAIT)")
	fs.StringVar(&cfg.HealthListen, "health-listen", env("HEALTH_LISTEN", ""), "plaintext gRPC address serving only grpc.health.v1.Health, for Kubernetes gRPC probes (they cannot speak TLS); empty: off (env COORDINATORD_HEALTH_LISTEN)")
	fs.StringVar(&level, "log-level", env("LOG_LEVEL", "info"), "debug, info, warn or error (env COORDINATORD_LOG_LEVEL)")
	fs.StringVar(&format, "log-format", env("LOG_FORMAT", "json"), "json or text (env COORDINATORD_LOG_FORMAT)")
	if err := fs.Parse(args); err != nil {
		return cfg, nil, err
	}
	if fs.NArg() > 0 {
		return cfg, nil, fmt.Errorf("unexpected arguments %q; see -help", fs.Args())
	}
	for _, e := range strings.Split(endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			cfg.EtcdEndpoints = append(cfg.EtcdEndpoints, e)
		}
	}
	if (cfg.EtcdUsername == "") != (passwordFile == "") {
		return cfg, nil, errors.New("-etcd-username and -etcd-password-file go together")
	}
	if passwordFile != "" {
		b, err := os.ReadFile(passwordFile)
		if err != nil {
			return cfg, nil, fmt.Errorf("-etcd-password-file: %w", err)
		}
		cfg.EtcdPassword = strings.TrimRight(string(b), "\r\n")
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return cfg, nil, fmt.Errorf("-log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "json":
		cfg.Logger = slog.New(slog.NewJSONHandler(os.Stderr, opts))
	case "text":
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, opts))
	default:
		return cfg, nil, fmt.Errorf("-log-format %q: want json or text", format)
	}
	switch {
	case cfg.MaxTTL < time.Second:
		return cfg, nil, fmt.Errorf("-max-ttl %v: must be at least 1s", cfg.MaxTTL)
	case cfg.DefaultTTL < time.Second || cfg.DefaultTTL > cfg.MaxTTL:
		return cfg, nil, fmt.Errorf("-default-ttl %v: must be between 1s and -max-ttl (%v)", cfg.DefaultTTL, cfg.MaxTTL)
	case (cfg.TLSCert == "") != (cfg.TLSKey == ""):
		return cfg, nil, errors.New("-tls-cert and -tls-key go together")
	case cfg.TLSClientCA != "" && cfg.TLSCert == "":
		return cfg, nil, errors.New("-tls-client-ca needs -tls-cert and -tls-key")
	case cfg.AuthTokens != "" && cfg.AuthPolicy == "":
		return cfg, nil, errors.New("-auth-tokens needs -auth-policy")
	case cfg.MaxRecvMsgSize < 0 || cfg.RateLimit < 0 || cfg.RateBurst < 0 || cfg.MaxWaitersPerLock < 0 || cfg.MaxLocksPerIdentity < 0 || cfg.MaxWait < 0 || cfg.KeepaliveMinTime < 0:
		return cfg, nil, errors.New("-max-recv-msg-size, -rate-limit, -rate-burst, -max-waiters-per-lock, -max-locks-per-identity, -max-wait and -keepalive-min-time must not be negative")
	case cfg.MaxMarksPerIdentity < 0 || cfg.MarkRetention < 0:
		return cfg, nil, errors.New("-max-marks-per-identity and -mark-retention must not be negative")
	case cfg.AuthReloadInterval <= 0:
		return cfg, nil, fmt.Errorf("-auth-reload-interval %v: must be positive", cfg.AuthReloadInterval)
	case cfg.MaxHold <= 0:
		return cfg, nil, fmt.Errorf("-max-hold %v: must be positive", cfg.MaxHold)
	case cfg.MaxLockDelay < 0:
		return cfg, nil, fmt.Errorf("-max-lock-delay %v: must not be negative", cfg.MaxLockDelay)
	case cfg.ShutdownTimeout <= 0:
		return cfg, nil, fmt.Errorf("-shutdown-timeout %v: must be positive", cfg.ShutdownTimeout)
	}
	return cfg, cfg.Logger, nil
}
