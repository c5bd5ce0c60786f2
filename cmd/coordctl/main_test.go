package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/coordinatord/coordinatord/internal/testcoord"
)

// coordctl is the binary under test, built by TestMain; addr is the address
// of the in-process coordinator (embedded etcd, real gRPC) it talks to.
var (
	coordctl string
	addr     string
)

// Exit codes, as main.go documents them.
const (
	exitUsage       = 2
	exitNotAcquired = 3
	exitNotValid    = 4
	exitUnavailable = 5
	exitDenied      = 6
	exitLost        = 7
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "coordctl-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	coordctl = filepath.Join(dir, "coordctl")
	// Built as make build does: the version set by the linker.
	ldflags := "-X github.com/coordinatord/coordinatord/internal/version.Version=" + testVersion
	if out, err := exec.Command("go", "build", "-ldflags", ldflags, "-o", coordctl, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build coordctl: %v\n%s", err, out)
		return 1
	}
	coord, err := testcoord.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start coordinator:", err)
		return 1
	}
	addr = coord.Addr
	code := m.Run()
	coord.Stop()
	if code == 0 {
		if err := goleak.Find(
			goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
			goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/logutil.(*MergeLogger).outputLoop"),
		); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	return code
}

// result is one coordctl run.
type result struct {
	stdout, stderr string
	code           int
}

// coordctlCmd prepares coordctl with args, talking to the test coordinator
// through $COORDCTL_ADDR, killed if the test outlives 60s.
func coordctlCmd(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, coordctl, args...)
	cmd.Env = append(os.Environ(), "COORDCTL_ADDR="+addr, "COORDCTL_BIN="+coordctl)
	cmd.WaitDelay = 5 * time.Second // a child left running must not hold the output pipes forever
	return cmd
}

// run runs coordctl to completion.
func run(t *testing.T, args ...string) result {
	t.Helper()
	cmd := coordctlCmd(t, args...)
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

// must runs coordctl and fails the test unless it exits with code.
func must(t *testing.T, code int, args ...string) result {
	t.Helper()
	r := run(t, args...)
	if r.code != code {
		t.Fatalf("coordctl %q: exit %d, want %d\nstdout: %s\nstderr: %s", args, r.code, code, r.stdout, r.stderr)
	}
	return r
}

// decode parses coordctl's JSON output into a map.
func decode(t *testing.T, r result) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &m); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, r.stdout)
	}
	return m
}

// tableRow returns the row of a table whose first column is first, as fields.
func tableRow(t *testing.T, out, first string) []string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "NAME") {
		t.Fatalf("not a table with a NAME header:\n%s", out)
	}
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) > 0 && f[0] == first {
			return f
		}
	}
	t.Fatalf("no row %q in:\n%s", first, out)
	return nil
}

type grant struct {
	token  string
	handle string
}

func acquire(t *testing.T, name string, args ...string) grant {
	t.Helper()
	m := decode(t, must(t, 0, append([]string{"-o", "json", "acquire", name}, args...)...))
	tok, _ := m["token"].(string) // protojson: an int64 is a string
	h, _ := m["handle"].(string)
	if n, err := strconv.ParseInt(tok, 10, 64); err != nil || n <= 0 || h == "" {
		t.Fatalf("acquire %s: token %v, handle %q", name, m["token"], h)
	}
	return grant{tok, h}
}

func TestAcquireKeepAliveValidateRelease(t *testing.T) {
	// Table output of acquire: token, handle, TTL, expiry.
	r := must(t, 0, "acquire", "cli/a", "--ttl", "30s", "--owner", "alice")
	row := tableRow(t, r.stdout, "cli/a")
	if len(row) != 6 || row[3] != "30s" {
		t.Fatalf("acquire table row %q: want NAME TOKEN HANDLE TTL EXPIRES_AT SAFE_UNTIL with TTL 30s", row)
	}
	a := grant{row[1], row[2]}
	for _, col := range row[4:] {
		if _, err := time.Parse(time.RFC3339, col); err != nil {
			t.Fatalf("acquire table: %q is not a time: %v", col, err)
		}
	}

	// Held: a try-lock is not acquired (3), with the holder on stderr.
	r = must(t, exitNotAcquired, "acquire", "cli/a", "--wait", "0s")
	if !strings.Contains(r.stderr, "ABORTED") || !strings.Contains(r.stderr, "(reason LOCK_HELD)") {
		t.Fatalf("stderr %q: want the ABORTED status and its reason LOCK_HELD", r.stderr)
	}
	// A bounded wait on a held lock: not acquired either, once it elapses.
	must(t, exitNotAcquired, "acquire", "cli/a", "--wait", "1s")

	// keepalive renews (table and JSON); a wrong handle is not valid (4).
	row = tableRow(t, must(t, 0, "keepalive", "cli/a", a.token, a.handle).stdout, "cli/a")
	if row[1] != a.token || row[2] != "30s" {
		t.Fatalf("keepalive row %q", row)
	}
	if m := decode(t, must(t, 0, "keepalive", "cli/a", a.token, a.handle, "-o", "json")); m["ttl"] != "30s" || m["safeUntil"] == nil {
		t.Fatalf("keepalive JSON %v", m)
	}
	b := acquire(t, "cli/b")
	must(t, exitNotValid, "keepalive", "cli/a", a.token, b.handle)

	// validate: current (0), then with a resource.
	row = tableRow(t, must(t, 0, "validate", "cli/a", a.token).stdout, "cli/a")
	if row[2] != "true" || row[3] != "current" || row[4] != a.token {
		t.Fatalf("validate row %q", row)
	}
	if m := decode(t, must(t, 0, "-o", "json", "validate", "cli/a", a.token, "--resource", "res/1")); m["valid"] != true || m["reason"] != "REASON_CURRENT" {
		t.Fatalf("validate JSON %v", m)
	}

	// describe and list show the holder, never the handle.
	r = must(t, 0, "describe", "cli/a")
	row = tableRow(t, r.stdout, "cli/a")
	if row[1] != "held" || row[2] != a.token || row[3] != "alice" || strings.Contains(r.stdout, a.handle) {
		t.Fatalf("describe:\n%s", r.stdout)
	}
	m := decode(t, must(t, 0, "describe", "cli/a", "-o", "json"))
	if h, _ := m["holder"].(map[string]any); m["held"] != true || h["owner"] != "alice" || h["token"] != a.token {
		t.Fatalf("describe JSON %v", m)
	}
	r = must(t, 0, "list", "cli/")
	if tableRow(t, r.stdout, "cli/a")[1] != a.token || tableRow(t, r.stdout, "cli/b")[1] != b.token {
		t.Fatalf("list:\n%s", r.stdout)
	}
	m = decode(t, must(t, 0, "list", "cli/b", "-o", "json"))
	if hs, _ := m["holders"].([]any); len(hs) != 1 {
		t.Fatalf("list cli/b JSON: %v, want one holder", m)
	}

	// release: released (0), then again: nothing changed (4).
	row = tableRow(t, must(t, 0, "release", "cli/a", a.token, a.handle).stdout, "cli/a")
	if row[2] != "true" {
		t.Fatalf("release row %q", row)
	}
	if m := decode(t, must(t, exitNotValid, "-o", "json", "release", "cli/a", a.token, a.handle)); m["released"] != false {
		t.Fatalf("second release JSON %v", m)
	}
	m = decode(t, must(t, 0, "describe", "cli/a", "-o", "json"))
	if m["held"] != false || m["holder"] != nil {
		t.Fatalf("describe after release: %v", m)
	}

	// The old token is no longer valid (4); a newer holder's token fences it
	// on the resource for good.
	if m := decode(t, must(t, exitNotValid, "-o", "json", "validate", "cli/a", a.token)); m["valid"] != false || m["reason"] != "REASON_NOT_HELD" {
		t.Fatalf("validate after release: %v", m)
	}
	c := acquire(t, "cli/a")
	must(t, 0, "validate", "cli/a", c.token, "--resource", "res/1")
	if m := decode(t, must(t, exitNotValid, "-o", "json", "validate", "cli/a", a.token, "--resource", "res/1")); m["reason"] != "REASON_SUPERSEDED" && m["reason"] != "REASON_FENCED" {
		t.Fatalf("validate of a superseded token: %v", m)
	}
	must(t, 0, "release", "cli/a", c.token, c.handle)
	must(t, 0, "release", "cli/b", b.token, b.handle)
}

func TestForceRelease(t *testing.T) {
	a := acquire(t, "cli/force", "--owner", "stuck-job")
	r := must(t, 0, "force-release", "cli/force", a.token)
	if row := tableRow(t, r.stdout, "cli/force"); row[2] != "true" {
		t.Fatalf("force-release row %q", row)
	}
	if m := decode(t, must(t, exitNotValid, "force-release", "cli/force", a.token, "-o", "json")); m["released"] != false {
		t.Fatalf("second force-release: %v", m)
	}
	must(t, exitNotValid, "keepalive", "cli/force", a.token, a.handle) // the holder learns it is gone
	must(t, exitNotValid, "validate", "cli/force", a.token)
}

func TestUsageAndConnectionErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		env  []string
	}{
		{"no command", nil, exitUsage, nil},
		{"unknown command", []string{"frobnicate"}, exitUsage, nil},
		{"missing name", []string{"acquire"}, exitUsage, nil},
		{"extra argument", []string{"describe", "a", "b"}, exitUsage, nil},
		{"bad token", []string{"validate", "cli/x", "abc"}, exitUsage, nil},
		{"bad flag", []string{"acquire", "cli/x", "--ttl", "soon"}, exitUsage, nil},
		{"bad output", []string{"-o", "yaml", "list"}, exitUsage, nil},
		{"exec without command", []string{"exec", "cli/x", "--"}, exitUsage, nil},
		{"INVALID_ARGUMENT from the server", []string{"acquire", "cli/x", "--ttl", "-5s"}, exitUsage, nil},
		{"missing token file", []string{"list", "--token-file", "/nonexistent/token"}, exitUsage, nil},
		{"unavailable", []string{"--addr", "127.0.0.1:1", "--timeout", "1s", "describe", "cli/x"}, exitUnavailable, nil},
		{"acquire without --wait, unavailable", []string{"--addr", "127.0.0.1:1", "--timeout", "1s", "acquire", "cli/x"}, exitUnavailable, nil},
		{"exec without --wait, unavailable", []string{"--addr", "127.0.0.1:1", "--timeout", "1s", "exec", "cli/x", "--", "true"}, exitUnavailable, nil},
		{"unavailable from the environment", []string{"describe", "cli/x"}, exitUnavailable, []string{"COORDCTL_ADDR=127.0.0.1:1", "COORDCTL_TIMEOUT=1s"}},
		{"help", []string{"--help"}, 0, nil},
		{"command help", []string{"exec", "--help"}, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := coordctlCmd(t, tc.args...)
			cmd.Env = append(cmd.Env, tc.env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			}
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tc.code, stderr.String())
			}
			if code != 0 && stderr.Len() == 0 {
				t.Fatal("failed without a message on stderr")
			}
		})
	}
}

func TestHelpAndCompletion(t *testing.T) {
	r := must(t, 0, "help")
	for _, want := range []string{"Exit codes:", "Examples:", "coordctl exec", "COORDCTL_ADDR", "COORDINATOR_TOKEN"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("help lacks %q", want)
		}
	}
	for _, c := range []string{"acquire", "release", "keepalive", "validate", "describe", "list", "watch", "force-release", "exec"} {
		if r := must(t, 0, c, "--help"); !strings.Contains(r.stderr, "Usage: coordctl "+c) || !strings.Contains(r.stderr, "Examples:\n  coordctl ") {
			t.Errorf("%s --help:\n%s", c, r.stderr)
		}
	}
	r = must(t, 0, "completion", "bash")
	if !strings.Contains(r.stdout, "complete -o default -F _coordctl coordctl") {
		t.Fatalf("completion script:\n%s", r.stdout)
	}
	if _, err := exec.LookPath("bash"); err == nil {
		// The script parses, and completes commands and flags.
		script := r.stdout + `
COMP_WORDS=(coordctl ex); COMP_CWORD=1; _coordctl; echo "${COMPREPLY[@]}"
COMP_WORDS=(coordctl exec --gr); COMP_CWORD=2; _coordctl; echo "${COMPREPLY[@]}"
`
		out, err := exec.Command("bash", "-c", script).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "exec\n--grace") {
			t.Fatalf("bash completion: %v\n%s", err, out)
		}
	}
	must(t, exitUsage, "completion", "tcsh") // zsh and fish have scripts now
}

func TestEnvironmentSettings(t *testing.T) {
	a := acquire(t, "cli/env")
	cmd := coordctlCmd(t, "describe", "cli/env")
	cmd.Env = append(cmd.Env, "COORDCTL_OUTPUT=json")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(out) || !strings.Contains(string(out), `"token":"`+a.token+`"`) {
		t.Fatalf("COORDCTL_OUTPUT=json: %s", out)
	}
	// A flag wins over the environment.
	cmd = coordctlCmd(t, "--addr", addr, "describe", "cli/env")
	cmd.Env = append(cmd.Env, "COORDCTL_ADDR=127.0.0.1:1")
	if out, err := cmd.Output(); err != nil || !strings.Contains(string(out), "held") {
		t.Fatalf("--addr over COORDCTL_ADDR: %v\n%s", err, out)
	}
	must(t, 0, "release", "cli/env", a.token, a.handle)
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor polls cond every 20ms for up to 30s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestWatch(t *testing.T) {
	cmd := coordctlCmd(t, "-o", "json", "watch", "cli/watch", "--count", "5")
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the current state", func() bool { return strings.Contains(out.String(), `"kind":"KIND_CURRENT"`) })
	a := acquire(t, "cli/watch", "--owner", "w1")
	must(t, 0, "release", "cli/watch", a.token, a.handle)
	b := acquire(t, "cli/watch", "--owner", "w2")
	must(t, 0, "force-release", "cli/watch", b.token)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("watch --count 5: %v", err)
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var ev struct {
			Kind   string
			Holder *struct {
				Token string
				Owner string
			}
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		s := ev.Kind
		if ev.Holder != nil {
			s += " " + ev.Holder.Token
		}
		got = append(got, s)
	}
	want := []string{"KIND_CURRENT", "KIND_ACQUIRED " + a.token, "KIND_RELEASED " + a.token, "KIND_ACQUIRED " + b.token, "KIND_FORCE_RELEASED " + b.token}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("watch events %q, want %q", got, want)
	}

	// Table output: a header, then one line per event.
	c := acquire(t, "cli/watch", "--owner", "w3")
	r := must(t, 0, "watch", "cli/watch", "--count", "1")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "REVISION") || strings.Join(strings.Fields(lines[1])[1:], " ") != "current "+c.token+" w3" {
		t.Fatalf("watch table:\n%s", r.stdout)
	}
	must(t, 0, "release", "cli/watch", c.token, c.handle)
}
