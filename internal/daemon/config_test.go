package daemon_test

import (
	"strings"
	"testing"
	"time"

	"github.com/coordinatord/coordinatord/internal/daemon"
)

// valid is a Config that Validate accepts: what the flags' defaults give.
func valid() daemon.Config {
	return daemon.Config{DefaultTTL: 15 * time.Second, MaxTTL: 5 * time.Minute, MaxHold: time.Hour,
		MaxLockDelay: time.Minute, ShutdownTimeout: 10 * time.Second, AuthReloadInterval: 5 * time.Second}
}

// Validate is the one place a Config is checked: each bad value is refused
// with an error naming its flag (cmd/coordinatord exits 2 with it), before
// anything starts.
func TestConfigValidateNamesTheFlag(t *testing.T) {
	if err := valid().Validate(); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
	for _, tc := range []struct {
		flag   string
		change func(*daemon.Config)
	}{
		{"-max-ttl", func(c *daemon.Config) { c.MaxTTL = 0 }},
		{"-default-ttl", func(c *daemon.Config) { c.DefaultTTL = 10 * time.Minute }},
		{"-default-ttl", func(c *daemon.Config) { c.DefaultTTL = 0 }},
		{"-tls-cert", func(c *daemon.Config) { c.TLSCert = "server.crt" }},
		{"-tls-client-ca", func(c *daemon.Config) { c.TLSClientCA = "ca.crt" }},
		{"-tls-identity-from-cn", func(c *daemon.Config) { c.TLSIdentityFromCN = true }},
		{"-auth-tokens", func(c *daemon.Config) { c.AuthTokens = "tokens" }},
		{"-auth-reload-interval", func(c *daemon.Config) { c.AuthReloadInterval = 0 }},
		{"-etcd-username", func(c *daemon.Config) { c.EtcdUsername = "coord" }},
		{"-etcd-password-file", func(c *daemon.Config) { c.EtcdPassword = "secret" }},
		{"-rate-limit", func(c *daemon.Config) { c.RateLimit = -1 }},
		{"-max-wait", func(c *daemon.Config) { c.MaxWait = -time.Second }},
		{"-max-connections", func(c *daemon.Config) { c.MaxConnections = -1 }},
		{"-max-connection-idle", func(c *daemon.Config) { c.MaxConnectionIdle = -time.Second }},
		{"-max-marks-per-identity", func(c *daemon.Config) { c.MaxMarksPerIdentity = -1 }},
		{"-etcd-quota-backend-bytes", func(c *daemon.Config) { c.EtcdQuotaBackendBytes = -1 }},
		{"-etcd-auto-compaction-mode", func(c *daemon.Config) { c.EtcdAutoCompactionMode = "hourly" }},
		{"-etcd-auto-compaction-mode/-retention", func(c *daemon.Config) {
			c.EtcdAutoCompactionMode, c.EtcdAutoCompactionRetention = "revision", "5m"
		}},
		{"-max-hold", func(c *daemon.Config) { c.MaxHold = 0 }},
		{"-max-lock-delay", func(c *daemon.Config) { c.MaxLockDelay = -time.Second }},
		{"-shutdown-timeout", func(c *daemon.Config) { c.ShutdownTimeout = 0 }},
		{"-counter-store-timeout", func(c *daemon.Config) { c.CounterStoreTimeout = -time.Second }},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			cfg := valid()
			tc.change(&cfg)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.flag) {
				t.Fatalf("Validate: %v, want an error naming %s", err, tc.flag)
			}
		})
	}
}

// A Config built by hand gets the flags' defaults for the fields whose zero
// Validate refuses; a zero from the command line (Validate without
// WithDefaults) stays refused.
func TestConfigWithDefaults(t *testing.T) {
	cfg := daemon.Config{DefaultTTL: 15 * time.Second, MaxTTL: 5 * time.Minute}
	if err := cfg.Validate(); err == nil {
		t.Fatal("zero -max-hold, -shutdown-timeout and -auth-reload-interval accepted")
	}
	got := cfg.WithDefaults()
	if got.MaxHold != daemon.DefaultMaxHold || got.ShutdownTimeout != daemon.DefaultShutdownTimeout || got.AuthReloadInterval != daemon.DefaultAuthReloadInterval {
		t.Fatalf("WithDefaults: max hold %v, shutdown timeout %v, auth reload %v", got.MaxHold, got.ShutdownTimeout, got.AuthReloadInterval)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("with defaults: %v", err)
	}
}
