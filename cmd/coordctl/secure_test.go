package main_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/coordinatord/coordinatord/internal/daemon"
	"github.com/coordinatord/coordinatord/internal/testpki"
)

// startSecureDaemon runs a coordinator (embedded etcd) with TLS and an
// authorization policy in this process and returns its address.
func startSecureDaemon(t *testing.T, cfg daemon.Config) string {
	t.Helper()
	addrs := make(chan string, 1)
	cfg.Listen = "127.0.0.1:0"
	cfg.OnListen = func(a net.Addr) { addrs <- a.String() }
	cfg.DataDir = t.TempDir()
	cfg.DefaultTTL, cfg.MaxTTL, cfg.ShutdownTimeout = 15*time.Second, time.Minute, 5*time.Second
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- daemon.Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Logf("daemon.Run after cancel: %v", err)
		}
	})
	select {
	case a := <-addrs:
		return a
	case err := <-done:
		t.Fatalf("daemon.Run ended before serving: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("daemon not serving after 60s")
	}
	return ""
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTLSAndBearerToken(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA("coordctl test CA")
	cert, key := ca.Localhost().Write(dir, "server")
	caFile := ca.WriteCA(dir, "ca")
	const secret = "s3cret-app-token"
	sum := sha256.Sum256([]byte(secret))
	policy := writeFile(t, dir, "policy.json", `{"admins": ["ops"], "identities": {"app": {"lock_prefixes": ["app/"]}}}`)
	tokens := writeFile(t, dir, "tokens", "app "+hex.EncodeToString(sum[:])+"\n")
	tokenFile := writeFile(t, dir, "token", secret+"\n")
	wrongToken := writeFile(t, dir, "wrong", "not-the-token")

	t.Run("server TLS, bearer token", func(t *testing.T) {
		a := startSecureDaemon(t, daemon.Config{TLSCert: cert, TLSKey: key, AuthPolicy: policy, AuthTokens: tokens})
		tls := []string{"--addr", a, "--tls-ca", caFile, "--timeout", "5s"}
		must(t, 0, append(tls, "--token-file", tokenFile, "acquire", "app/job")...)
		must(t, exitDenied, append(tls, "--token-file", tokenFile, "describe", "other/job")...) // PERMISSION_DENIED
		must(t, exitDenied, append(tls, "--token-file", tokenFile, "force-release", "app/job", "1")...)
		must(t, exitDenied, append(tls, "--token-file", wrongToken, "describe", "app/job")...) // UNAUTHENTICATED
		must(t, exitDenied, append(tls, "describe", "app/job")...)                             // no token
		// The same settings from the environment.
		cmd := coordctlCmd(t, "describe", "app/job")
		cmd.Env = append(cmd.Env, "COORDCTL_ADDR="+a, "COORDCTL_TLS_CA="+caFile, "COORDCTL_TOKEN_FILE="+tokenFile)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("settings from COORDCTL_*: %v\n%s", err, out)
		}
		// Plaintext against a TLS server, or TLS without the CA: no connection.
		must(t, exitUnavailable, "--addr", a, "--timeout", "2s", "--token-file", tokenFile, "describe", "app/job")
		must(t, exitUnavailable, "--addr", a, "--tls", "--timeout", "2s", "--token-file", tokenFile, "describe", "app/job")
	})

	t.Run("mutual TLS", func(t *testing.T) {
		a := startSecureDaemon(t, daemon.Config{TLSCert: cert, TLSKey: key, TLSClientCA: caFile, AuthPolicy: policy})
		opsCert, opsKey := ca.Issue(testpki.Leaf{DNS: []string{"ops"}}).Write(dir, "ops")
		appCert, appKey := ca.Issue(testpki.Leaf{DNS: []string{"app"}}).Write(dir, "app")
		ops := []string{"--addr", a, "--tls-ca", caFile, "--tls-cert", opsCert, "--tls-key", opsKey, "--timeout", "5s"}
		app := []string{"--addr", a, "--tls-ca", caFile, "--tls-cert", appCert, "--tls-key", appKey, "--timeout", "5s"}
		g := acquireWith(t, append(app, "acquire", "app/mtls")...)
		must(t, exitDenied, append(app, "force-release", "app/mtls", g.token)...) // admins only
		must(t, 0, append(ops, "force-release", "app/mtls", g.token)...)
		must(t, exitUnavailable, "--addr", a, "--tls-ca", caFile, "--timeout", "2s", "describe", "app/mtls") // no client certificate
		must(t, exitUsage, "--addr", a, "--tls-ca", caFile, "--tls-cert", appCert, "describe", "app/mtls")   // a certificate without its key
	})
}

// acquireWith runs coordctl -o json with args (an acquire) and returns the grant.
func acquireWith(t *testing.T, args ...string) grant {
	t.Helper()
	m := decode(t, must(t, 0, append([]string{"-o", "json"}, args...)...))
	tok, _ := m["token"].(string) // protojson: an int64 is a string
	h, _ := m["handle"].(string)
	if n, err := strconv.ParseInt(tok, 10, 64); err != nil || n <= 0 || h == "" {
		t.Fatalf("acquire: %v", m)
	}
	return grant{token: tok, handle: h}
}
