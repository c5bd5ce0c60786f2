package main_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// SIGHUP without -auth-policy is a logged no-op: the daemon keeps serving
// (it used to die of the signal's default action, exit 129, without a
// graceful stop) and still stops cleanly on SIGTERM.
func TestSIGHUPWithoutPolicyKeepsServing(t *testing.T) {
	p := startDaemon(t, "--data-dir", t.TempDir())
	conn := p.conn(t)
	health := func() error {
		h, err := healthpb.NewHealthClient(conn).Check(ctxT(t), &healthpb.HealthCheckRequest{})
		if err == nil && h.Status != healthpb.HealthCheckResponse_SERVING {
			err = errors.New(h.Status.String())
		}
		return err
	}
	if err := health(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for !p.sawLog("SIGHUP: nothing to reload") {
		select {
		case err := <-p.done:
			t.Fatalf("the daemon exited on SIGHUP: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no log line for the SIGHUP")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := health(); err != nil {
		t.Fatalf("health after SIGHUP: %v", err)
	}
	p.stop(t)
}

// A malformed COORDINATORD_* value refuses to start exactly as the same
// flag does (exit 2, the variable named), where it used to become the
// default silently; a valid value is used; the command line overrides it.
func TestMalformedEnvRefusesToStartLikeTheFlag(t *testing.T) {
	for _, tc := range []struct {
		env  string
		flag []string
	}{
		{"COORDINATORD_MAX_TTL=5", []string{"--max-ttl", "5"}},
		{"COORDINATORD_DEFAULT_TTL=10m", []string{"--default-ttl", "10m"}}, // parses, but above -max-ttl
		{"COORDINATORD_RATE_LIMIT=fast", []string{"--rate-limit", "fast"}},
		{"COORDINATORD_MAX_CONCURRENT_STREAMS=-1", []string{"--max-concurrent-streams", "-1"}},
		{"COORDINATORD_MAX_WAITERS_PER_LOCK=ten", []string{"--max-waiters-per-lock", "ten"}},
		{"COORDINATORD_TLS_IDENTITY_FROM_CN=maybe", []string{"--tls-identity-from-cn=maybe"}},
		{"COORDINATORD_MAX_WATCH_STREAMS_PER_CALLER=-5", []string{"--max-watch-streams-per-caller", "-5"}},
		{"COORDINATORD_LOG_FORMAT=xml", []string{"--log-format", "xml"}},
	} {
		t.Run(tc.env, func(t *testing.T) {
			// Should it start after all, it stops within 20s, off the
			// default port and data directory.
			safe := []string{"--listen", "127.0.0.1:0", "--data-dir", t.TempDir()}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for i, c := range []*exec.Cmd{exec.CommandContext(ctx, binary, append(safe, tc.flag...)...), exec.CommandContext(ctx, binary, safe...)} {
				what := "flag " + strings.Join(tc.flag, " ")
				if i == 1 {
					c.Env, what = append(os.Environ(), tc.env), tc.env
				}
				out, err := c.CombinedOutput()
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 2 {
					t.Fatalf("%s: exit %v, want 2 (refused to start); output %s", what, err, out)
				}
				if name, _, _ := strings.Cut(tc.env, "="); i == 1 && !strings.Contains(string(out), name) && !strings.Contains(string(out), "-"+strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(name, "COORDINATORD_"), "_", "-"))) {
					t.Errorf("%s: the refusal names neither the variable nor its flag: %s", what, out)
				}
			}
		})
	}
	t.Run("a valid value is used and the flag overrides it", func(t *testing.T) {
		out, err := exec.Command("env", "COORDINATORD_LOG_FORMAT=xml", binary, "--log-format", "json", "--max-ttl", "bad").CombinedOutput()
		if !strings.Contains(string(out), "-max-ttl") {
			t.Fatalf("the flag's own error, not the variable's, expected: %v %s", err, out)
		}
	})
}

// Unknown COORDINATORD_* variables are warned about at start, by name and
// never by value (it may be a secret); the daemon still starts.
func TestUnknownEnvIsWarnedAboutByName(t *testing.T) {
	const secret = "s3cret-value-do-not-log"
	t.Setenv("COORDINATORD_MAX_TTLL", secret)
	t.Setenv("COORDINATORD_ETCD_PASSWORD", secret)
	t.Setenv("COORDINATORD_LOG_LEVEL", "debug")
	p := startDaemon(t, "--data-dir", t.TempDir())
	warned := map[string]bool{}
	deadline := time.After(10 * time.Second)
	for len(warned) < 2 {
		select {
		case l := <-p.logs:
			for k, v := range l {
				if s, ok := v.(string); ok && strings.Contains(s, secret) {
					t.Fatalf("log line %v carries the value of %s", l, k)
				}
			}
			if msg, _ := l["msg"].(string); strings.Contains(msg, "unknown environment variable") {
				v, _ := l["variable"].(string)
				warned[v] = true
			}
		case <-deadline:
			t.Fatalf("warned about %v, want COORDINATORD_MAX_TTLL and COORDINATORD_ETCD_PASSWORD", warned)
		}
	}
	if !warned["COORDINATORD_MAX_TTLL"] || !warned["COORDINATORD_ETCD_PASSWORD"] {
		t.Fatalf("warned about %v", warned)
	}
	p.stop(t)
}

// -max-connection-idle sends GOAWAY to a connection without calls: the
// client's connection leaves READY by itself.
func TestMaxConnectionIdleFlag(t *testing.T) {
	p := startDaemon(t, "--data-dir", t.TempDir(), "--max-connection-idle", "300ms")
	conn := p.conn(t)
	if _, err := healthpb.NewHealthClient(conn).Check(ctxT(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	for s := conn.GetState(); s == connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			t.Fatal("the idle connection was still READY after 20s")
		}
	}
	p.stop(t)
}
