package examples_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// lang is how to run one language's example scripts.
type lang struct {
	name string
	// run returns the argv that runs script (without extension) of this language.
	run func(script string) []string
}

// python finds a python3 that can import grpc (Debian's python3-grpcio), or
// skips; the scripts import the committed stubs and the coordinatord package
// from examples/python.
func python(t *testing.T) lang {
	t.Helper()
	py := pythonWith(t, "grpc")
	return lang{name: "python", run: func(script string) []string {
		return []string{py, filepath.Join("python", script+".py")}
	}}
}

// pythonWith finds a python3 that can import every module, or skips (fails
// under COORDTEST_EXAMPLES_REQUIRED=1).
func pythonWith(t *testing.T, modules ...string) string {
	t.Helper()
	var candidates []string
	if p := os.Getenv("COORDINATORD_PYTHON"); p != "" {
		candidates = append(candidates, p)
	}
	// Debian's interpreter first: a python3 earlier on PATH (pyenv, venv)
	// does not see Debian's packages.
	candidates = append(candidates, "/usr/bin/python3")
	if p, err := exec.LookPath("python3"); err == nil {
		candidates = append(candidates, p)
	}
	imports := "import " + strings.Join(modules, ", ")
	for _, py := range candidates {
		if exec.Command(py, "-c", imports).Run() == nil {
			return py
		}
	}
	skipOrFail(t, fmt.Sprintf("no python3 that can %q among %v: apt-get install python3-grpcio python3-grpc-tools python3-pytest", imports, candidates))
	return ""
}

// node finds node and the example's installed dependencies, compiles the
// TypeScript sources (once per test binary), or skips.
func node(t *testing.T) lang {
	t.Helper()
	n, err := exec.LookPath("node")
	if err != nil {
		skipOrFail(t, "node not found on PATH: install Node.js 18 or later")
	}
	for _, dep := range []string{"@grpc/grpc-js", "typescript"} {
		if _, err := os.Stat(filepath.Join("node", "node_modules", dep, "package.json")); err != nil {
			skipOrFail(t, "examples/node/node_modules is missing "+dep+": run (cd examples/node && npm ci)")
		}
	}
	if err := compileNode(n); err != nil {
		t.Fatal(err)
	}
	return lang{name: "node", run: func(script string) []string {
		return []string{n, filepath.Join("node", "dist", script+".js")}
	}}
}

var (
	compileOnce sync.Once
	compileErr  error
)

// compileNode compiles examples/node/src into examples/node/dist with the
// pinned TypeScript (npx tsc, without npx's network look-up), strict type
// checking included: a type error fails every Node test.
func compileNode(nodeBin string) error {
	compileOnce.Do(func() {
		start := time.Now()
		cmd := exec.Command(nodeBin, filepath.Join("node_modules", "typescript", "bin", "tsc"), "-p", ".")
		cmd.Dir = "node"
		if out, err := cmd.CombinedOutput(); err != nil {
			compileErr = fmt.Errorf("tsc -p examples/node: %w\n%s", err, out)
		}
		compileTook = time.Since(start)
	})
	return compileErr
}

var compileTook time.Duration

// event is one output line of an example: `kind key=value ...`.
type event struct {
	kind   string
	fields map[string]string
}

var fieldRE = regexp.MustCompile(`(\w+)=(\S*)`)

func parseEvent(line string) event {
	kind, rest, _ := strings.Cut(line, " ")
	e := event{kind: kind, fields: map[string]string{}}
	for _, m := range fieldRE.FindAllStringSubmatch(rest, -1) {
		v := m[2]
		if v == "True" || v == "False" { // Python's spelling of Node's true/false
			v = strings.ToLower(v)
		}
		e.fields[m[1]] = v
	}
	return e
}

func (e event) int(t *testing.T, key string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(e.fields[key], 10, 64)
	if err != nil {
		t.Fatalf("%s: field %s=%q is not an integer", e, key, e.fields[key])
	}
	return n
}

func (e event) String() string {
	keys := make([]string, 0, len(e.fields))
	for k := range e.fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString(e.kind)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%s", k, e.fields[k])
	}
	return b.String()
}

// client is one running example process.
type client struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr bytes.Buffer
	lines  chan event // every stdout line, in order
	done   chan error

	mu  sync.Mutex
	all []event
}

// startClient runs argv in examples/ with a deadline of one minute.
func startClient(t *testing.T, argv ...string) *client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.WaitDelay = 5 * time.Second
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1")
	c := &client{t: t, name: filepath.Base(argv[1]), cmd: cmd, lines: make(chan event, 100), done: make(chan error, 1)}
	cmd.Stderr = &c.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			e := parseEvent(sc.Text())
			c.mu.Lock()
			c.all = append(c.all, e)
			c.mu.Unlock()
			c.lines <- e
		}
		close(c.lines)
		c.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		for range c.lines {
		}
		t.Logf("%s printed:\n%s", c.name, strings.Join(c.printed(), "\n"))
	})
	return c
}

func (c *client) printed() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, e := range c.all {
		out = append(out, e.String())
	}
	return out
}

// next returns the next event, which must be of kind. A failed renewal that
// the client retries (keepalive-error) is skipped: on a loaded machine a
// KeepAlive can miss its deadline without the grant being lost.
func (c *client) next(kind string) event {
	c.t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case e, ok := <-c.lines:
			if !ok {
				c.t.Fatalf("%s exited before printing %q: %v\nstderr: %s", c.name, kind, <-c.done, c.stderr.String())
			}
			if e.kind == "keepalive-error" && kind != e.kind {
				continue
			}
			if e.kind != kind {
				c.t.Fatalf("%s printed %q, want a %q line\nstderr: %s", c.name, e, kind, c.stderr.String())
			}
			return e
		case <-timeout:
			c.t.Fatalf("%s printed no %q line within 30s", c.name, kind)
		}
	}
}

// exit waits for the process to exit and fails unless it printed nothing more
// and exited 0.
func (c *client) exit() {
	c.t.Helper()
	for e := range c.lines {
		if e.kind != "keepalive-error" {
			c.t.Fatalf("%s printed an unexpected %q", c.name, e)
		}
	}
	if err := <-c.done; err != nil {
		c.t.Fatalf("%s: %v\nstderr: %s", c.name, err, c.stderr.String())
	}
}

// languages finds each language's runtime (or skips) inside its subtest.
var languages = []struct {
	name string
	find func(*testing.T) lang
}{{"python", python}, {"node", node}}

// TestClients runs each language's examples against one daemon, then the
// cross-language hand-off.
func TestClients(t *testing.T) {
	addr := startDaemon(t)
	lc := lockClient(t, addr)

	for _, ln := range languages {
		t.Run(ln.name+"/fenced_write", func(t *testing.T) {
			t.Parallel()
			l := ln.find(t)
			name := "examples/" + l.name + "/fenced-write"
			// The hold (4s) outlives the TTL (3s): only the background
			// KeepAlive keeps the grant current until the final validation.
			c := startClient(t, append(l.run("fenced_write"), "--addr", addr, "--name", name, "--ttl", "3", "--hold", "4")...)
			acq := c.next("acquired")
			token := acq.int(t, "token")
			if token <= 0 || acq.fields["ttl"] != "3s" {
				t.Fatalf("acquired %v: want a positive token and ttl 3s", acq)
			}
			if w := c.next("wrote"); w.int(t, "token") != token {
				t.Fatalf("%v: want the write with token %d", w, token)
			}
			v := c.next("validated")
			if v.fields["valid"] != "true" || v.fields["reason"] != "REASON_CURRENT" || v.int(t, "current") != token {
				t.Fatalf("after holding past the TTL: %v; want valid, REASON_CURRENT, current %d (KeepAlive did not keep the grant)", v, token)
			}
			c.next("wrote")
			if r := c.next("released"); r.fields["released"] != "true" {
				t.Fatalf("%v: want released=true", r)
			}
			c.exit()
			d, err := lc.Describe(ctxT(t, 10*time.Second), &coordinatorv1.DescribeRequest{Name: name})
			if err != nil || d.Holder != nil {
				t.Fatalf("Describe after release = %v, %v; want no holder", d, err)
			}
		})

		t.Run(ln.name+"/stale_token", func(t *testing.T) {
			t.Parallel()
			l := ln.find(t)
			name := "examples/" + l.name + "/stale"
			c := startClient(t, append(l.run("stale_token"), "--addr", addr, "--name", name)...)
			a := c.next("acquired").int(t, "token")
			c.next("wrote")
			c.next("paused")
			b := c.next("acquired").int(t, "token")
			if b <= a {
				t.Fatalf("B's token %d not greater than A's %d", b, a)
			}
			c.next("wrote")
			v := c.next("validated")
			if v.fields["who"] != "a" || v.int(t, "token") != a || v.fields["valid"] != "false" ||
				v.fields["reason"] != "REASON_SUPERSEDED" || v.int(t, "current") != b {
				t.Fatalf("%v; want A's token %d invalid, REASON_SUPERSEDED, current %d", v, a, b)
			}
			if r := c.next("refused"); r.int(t, "token") != a || r.fields["reason"] != "REASON_SUPERSEDED" {
				t.Fatalf("%v; want A's write refused as REASON_SUPERSEDED", r)
			}
			if k := c.next("keepalive"); k.fields["code"] != "NOT_FOUND" || k.fields["reason"] != "NOT_HELD" {
				t.Fatalf("%v; want A's KeepAlive NOT_FOUND, reason NOT_HELD", k)
			}
			if r := c.next("released"); r.fields["who"] != "a" || r.fields["released"] != "false" {
				t.Fatalf("%v; want A's release false", r)
			}
			if r := c.next("released"); r.fields["who"] != "b" || r.fields["released"] != "true" {
				t.Fatalf("%v; want B's release true", r)
			}
			if r := c.next("register"); r.int(t, "high_water") != b {
				t.Fatalf("%v; want the register's high-water mark at B's token %d", r, b)
			}
			c.exit()
		})

		// Issue 19.4: the example reads the ErrorInfo of a refusal: a
		// try-lock of a held lock is ABORTED with reason LOCK_HELD and the
		// holder's token under the lowerCamel key holderToken.
		t.Run(ln.name+"/not_acquired", func(t *testing.T) {
			t.Parallel()
			l := ln.find(t)
			name := "examples/" + l.name + "/not-acquired"
			g, err := lc.Acquire(ctxT(t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: name, Ttl: durationpb.New(time.Minute)})
			if err != nil {
				t.Fatal(err)
			}
			c := startClient(t, append(l.run("fenced_write"), "--addr", addr, "--name", name, "--wait", "0")...)
			e := c.next("not-acquired")
			if e.fields["code"] != "ABORTED" || e.fields["reason"] != "LOCK_HELD" || e.int(t, "holder") != g.Token {
				t.Fatalf("%v; want ABORTED, reason LOCK_HELD, holder %d", e, g.Token)
			}
			for range c.lines {
			}
			var exit *exec.ExitError
			if err := <-c.done; !errors.As(err, &exit) || exit.ExitCode() != 2 {
				t.Fatalf("exit %v, want 2 (not acquired)", err)
			}
		})
	}

	// Python holds; Node waits (Acquire without wait, bounded by a deadline)
	// and gets the next, greater token once Python releases.
	t.Run("handoff_python_to_node", func(t *testing.T) {
		t.Parallel()
		py, js := python(t), node(t)
		const name = "examples/handoff"
		holder := startClient(t, append(py.run("fenced_write"), "--addr", addr, "--name", name, "--owner", "python-holder", "--ttl", "3", "--hold", "stdin")...)
		pyToken := holder.next("acquired").int(t, "token")
		holder.next("wrote")

		waiter := startClient(t, append(js.run("fenced_write"), "--addr", addr, "--name", name, "--owner", "node-waiter", "--ttl", "5", "--wait", "none", "--deadline", "40")...)
		deadline := time.Now().Add(30 * time.Second)
		for {
			d, err := lc.Describe(ctxT(t, 10*time.Second), &coordinatorv1.DescribeRequest{Name: name})
			if err != nil {
				t.Fatal(err)
			}
			if d.GetHolder().GetToken() != pyToken {
				t.Fatalf("Describe = %v; want Python's grant %d still holding", d, pyToken)
			}
			if slices.ContainsFunc(d.Waiters, func(w *coordinatorv1.Waiter) bool { return w.Owner == "node-waiter" }) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Node never showed up as a waiter: %v", d)
			}
			time.Sleep(50 * time.Millisecond)
		}
		// Hold past Python's TTL (3s): the grant lives on KeepAlive alone, and
		// Node must still be waiting.
		time.Sleep(4 * time.Second)
		select {
		case e := <-waiter.lines:
			t.Fatalf("Node printed %v while Python held the lock", e)
		default:
		}

		if err := holder.stdin.Close(); err != nil { // Python validates, writes and releases
			t.Fatal(err)
		}
		if v := holder.next("validated"); v.fields["reason"] != "REASON_CURRENT" {
			t.Fatalf("Python at release time: %v; want REASON_CURRENT", v)
		}
		holder.next("wrote")
		if r := holder.next("released"); r.fields["released"] != "true" {
			t.Fatalf("%v; want released=true", r)
		}
		holder.exit()

		acq := waiter.next("acquired")
		jsToken := acq.int(t, "token")
		if jsToken <= pyToken {
			t.Fatalf("Node's token %d not greater than Python's %d", jsToken, pyToken)
		}
		waiter.next("wrote")
		if v := waiter.next("validated"); v.fields["reason"] != "REASON_CURRENT" || v.int(t, "current") != jsToken {
			t.Fatalf("Node: %v; want REASON_CURRENT with its token %d", v, jsToken)
		}
		waiter.next("wrote")
		if r := waiter.next("released"); r.fields["released"] != "true" {
			t.Fatalf("%v; want released=true", r)
		}
		waiter.exit()

		// Python's old token is now fenced off.
		v, err := lc.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: name, Token: pyToken})
		if err != nil || v.Valid {
			t.Fatalf("ValidateToken(Python's token) = %v, %v; want invalid", v, err)
		}
	})
}
