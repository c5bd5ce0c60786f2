package daemon_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coordinatord/coordinatord/internal/daemon"
)

// The shard core's forwarding flags: a member secret file that is missing,
// empty, short or not printable is refused before anything starts, and so
// are a relay without the shard core (it would have nothing to forward
// to), an -advertise that is no host:port, and a relay with authorization
// but no member secret (the members would refuse every identity it
// forwards). Each error names its flag.
func TestConfigValidateForwarding(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := file("good", "  0123456789abcdef0123456789abcdef\n")
	shardCore := func(c *daemon.Config) { c.Core = daemon.CoreShard }
	for _, tc := range []struct {
		name   string
		change func(*daemon.Config)
		flag   string // "": accepted
	}{
		{"a good secret", func(c *daemon.Config) { shardCore(c); c.MemberSecretFile = good }, ""},
		{"an empty secret file", func(c *daemon.Config) { shardCore(c); c.MemberSecretFile = file("empty", "") }, "-member-secret-file"},
		{"a secret file of whitespace", func(c *daemon.Config) { shardCore(c); c.MemberSecretFile = file("blank", " \n\t\n") }, "-member-secret-file"},
		{"a short secret", func(c *daemon.Config) { shardCore(c); c.MemberSecretFile = file("short", "0123456789abcde\n") }, "-member-secret-file"},
		{"a secret with a space inside", func(c *daemon.Config) { shardCore(c); c.MemberSecretFile = file("space", "0123456789 abcdef0123") }, "-member-secret-file"},
		{"a missing secret file", func(c *daemon.Config) { shardCore(c); c.MemberSecretFile = filepath.Join(dir, "nope") }, "-member-secret-file"},
		{"a secret on the queue core", func(c *daemon.Config) { c.MemberSecretFile = good }, "-member-secret-file"},
		{"a relay on the queue core", func(c *daemon.Config) { c.Core, c.Role = daemon.CoreQueue, daemon.RoleRelay }, "-role"},
		{"a relay on the default core", func(c *daemon.Config) { c.Role = daemon.RoleRelay }, "-role"},
		{"a relay on the shard core", func(c *daemon.Config) { shardCore(c); c.Role = daemon.RoleRelay }, ""},
		{"an unknown role", func(c *daemon.Config) { shardCore(c); c.Role = "observer" }, "-role"},
		{"a relay with authorization and no secret", func(c *daemon.Config) {
			shardCore(c)
			c.Role, c.AuthPolicy = daemon.RoleRelay, "policy.json"
		}, "-member-secret-file"},
		{"a relay with authorization and a secret", func(c *daemon.Config) {
			shardCore(c)
			c.Role, c.AuthPolicy, c.MemberSecretFile = daemon.RoleRelay, "policy.json", good
		}, ""},
		{"an advertised address", func(c *daemon.Config) { shardCore(c); c.Advertise = "10.0.3.7:7070" }, ""},
		{"an advertised address without a port", func(c *daemon.Config) { shardCore(c); c.Advertise = "10.0.3.7" }, "-advertise"},
		{"an advertised address without a host", func(c *daemon.Config) { shardCore(c); c.Advertise = ":7070" }, "-advertise"},
		{"an advertised address on the queue core", func(c *daemon.Config) { c.Advertise = "10.0.3.7:7070" }, "-advertise"},
		{"a peer server name with TLS", func(c *daemon.Config) {
			shardCore(c)
			c.TLSCert, c.TLSKey, c.PeerServerName = "server.crt", "server.key", "coordinatord-peer"
		}, ""},
		{"a peer server name without TLS", func(c *daemon.Config) { shardCore(c); c.PeerServerName = "coordinatord-peer" }, "-peer-server-name"},
		{"a peer server name on the queue core", func(c *daemon.Config) {
			c.TLSCert, c.TLSKey, c.PeerServerName = "server.crt", "server.key", "coordinatord-peer"
		}, "-peer-server-name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := valid()
			tc.change(&cfg)
			err := cfg.Validate()
			switch {
			case tc.flag == "" && err != nil:
				t.Fatalf("Validate: %v, want it accepted", err)
			case tc.flag != "" && (err == nil || !strings.Contains(err.Error(), tc.flag)):
				t.Fatalf("Validate: %v, want an error naming %s", err, tc.flag)
			}
			if err != nil && strings.Contains(err.Error(), "0123456789") {
				t.Fatalf("the error shows the secret: %v", err)
			}
		})
	}
}
