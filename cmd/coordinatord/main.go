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
	"strings"
	"syscall"
	"time"

	"github.com/coordinatord/coordinatord/internal/daemon"
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

func parse(args []string) (daemon.Config, *slog.Logger, error) {
	fs := flag.NewFlagSet("coordinatord", flag.ContinueOnError)
	var (
		cfg       daemon.Config
		endpoints string
		level     string
		format    string
	)
	fs.StringVar(&cfg.Listen, "listen", env("LISTEN", "127.0.0.1:7070"), "gRPC listen address (env COORDINATORD_LISTEN)")
	fs.StringVar(&endpoints, "etcd-endpoints", env("ETCD_ENDPOINTS", ""), "comma-separated etcd client URLs; empty starts an embedded single-member etcd (env COORDINATORD_ETCD_ENDPOINTS)")
	fs.StringVar(&cfg.KeyPrefix, "key-prefix", env("KEY_PREFIX", "/coordinatord/"), "etcd key prefix of every key written (env COORDINATORD_KEY_PREFIX)")
	fs.StringVar(&cfg.DataDir, "data-dir", env("DATA_DIR", "coordinatord-data"), "data directory of the embedded etcd (env COORDINATORD_DATA_DIR)")
	fs.DurationVar(&cfg.DefaultTTL, "default-ttl", envDuration("DEFAULT_TTL", 15*time.Second), "lease TTL when a request asks for none (env COORDINATORD_DEFAULT_TTL)")
	fs.DurationVar(&cfg.MaxTTL, "max-ttl", envDuration("MAX_TTL", 5*time.Minute), "largest lease TTL a request may ask for (env COORDINATORD_MAX_TTL)")
	fs.DurationVar(&cfg.MaxHold, "max-hold", envDuration("MAX_HOLD", time.Hour), "longest a grant may be renewed; requests may ask for less (env COORDINATORD_MAX_HOLD)")
	fs.DurationVar(&cfg.MaxLockDelay, "max-lock-delay", envDuration("MAX_LOCK_DELAY", time.Minute), "largest lock-delay a request may ask for (env COORDINATORD_MAX_LOCK_DELAY)")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", envDuration("SHUTDOWN_TIMEOUT", 10*time.Second), "bound on the graceful stop (env COORDINATORD_SHUTDOWN_TIMEOUT)")
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
	case cfg.MaxHold <= 0:
		return cfg, nil, fmt.Errorf("-max-hold %v: must be positive", cfg.MaxHold)
	case cfg.MaxLockDelay < 0:
		return cfg, nil, fmt.Errorf("-max-lock-delay %v: must not be negative", cfg.MaxLockDelay)
	case cfg.ShutdownTimeout <= 0:
		return cfg, nil, fmt.Errorf("-shutdown-timeout %v: must be positive", cfg.ShutdownTimeout)
	}
	return cfg, cfg.Logger, nil
}
