package main_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSessionCommands: open prints the handle (its one appearance); the
// other commands take it from $COORDCTL_SESSION or --session-file, never
// print it, and acquire --session puts a lock on the session's lease.
func TestSessionCommands(t *testing.T) {
	m := decode(t, must(t, 0, "-o", "json", "session", "open", "--ttl", "30s", "--owner", "batch"))
	h, _ := m["handle"].(string)
	if h == "" || m["ttl"] != "30s" || m["leaseId"] == nil || m["safeUntil"] == nil {
		t.Fatalf("session open: %v", m)
	}
	file := filepath.Join(t.TempDir(), "session")
	if err := os.WriteFile(file, []byte(h+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := "COORDCTL_SESSION=" + h
	lock := acquireIn(t, env, "cli/session-a")

	tests := []struct {
		name string
		env  string
		args []string
		code int
		want string // in stdout
	}{
		{"keepalive from the environment", env, []string{"-o", "json", "session", "keepalive"}, 0, `"token":"` + lock + `"`},
		{"keepalive from --session-file", "", []string{"session", "keepalive", "--session-file", file}, 0, "cli/session-a"},
		{"no session", "", []string{"session", "keepalive"}, exitUsage, ""},
		{"no argument taken", env, []string{"session", "keepalive", h}, exitUsage, ""},
		{"a second acquire of the same name", env, []string{"acquire", "cli/session-a", "--session", "--wait", "0s"}, exitNotValid, ""},
		{"close", env, []string{"-o", "json", "session", "close"}, 0, `"closed":true`},
		{"close again", env, []string{"-o", "json", "session", "close"}, exitNotValid, `"closed":false`},
		{"keepalive after close", env, []string{"session", "keepalive"}, exitNotValid, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runEnv(t, tt.env, tt.args...)
			if r.code != tt.code || !strings.Contains(r.stdout, tt.want) {
				t.Fatalf("exit %d, want %d; stdout %q, want %q in it; stderr %s", r.code, tt.code, r.stdout, tt.want, r.stderr)
			}
			if strings.Contains(r.stdout+r.stderr, h) {
				t.Errorf("the session handle was printed:\n%s%s", r.stdout, r.stderr)
			}
		})
	}
	if m := decode(t, must(t, 0, "-o", "json", "describe", "cli/session-a")); m["held"] != false {
		t.Errorf("session close left cli/session-a held: %v", m)
	}
}

// acquireIn acquires name through the session of env and returns its
// token; no handle is printed.
func acquireIn(t *testing.T, env, name string) string {
	t.Helper()
	r := runEnv(t, env, "-o", "json", "acquire", name, "--session")
	if r.code != 0 {
		t.Fatalf("acquire --session: exit %d: %s", r.code, r.stderr)
	}
	m := decode(t, r)
	if m["handle"] != nil || m["token"] == nil {
		t.Fatalf("acquire --session printed %v, want a token and no handle", m)
	}
	return m["token"].(string)
}

// runEnv runs coordctl to completion with one more environment variable
// (env "": none).
func runEnv(t *testing.T, env string, args ...string) result {
	t.Helper()
	cmd := coordctlCmd(t, args...)
	if env != "" {
		cmd.Env = append(cmd.Env, env)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("coordctl %q: %v", args, err)
	}
	return r
}
