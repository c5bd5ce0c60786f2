//go:build unix

package pausedemo_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// ttl is the workers' lease TTL: the smallest etcd grants with its default
// election timeout (1s * 1.5, rounded up to a whole second).
const ttl = 2 * time.Second

var bin string // directory of the built programs

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pausedemo")
	if err != nil {
		panic(err)
	}
	bin = dir
	code := 0
	if out, err := exec.Command("go", "build", "-o", dir+string(filepath.Separator),
		"github.com/coordinatord/coordinatord/cmd/coordinatord",
		"github.com/coordinatord/coordinatord/examples/pausedemo/storage",
		"github.com/coordinatord/coordinatord/examples/pausedemo/worker").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		code = 1
	} else {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running program whose stdout (JSON lines) is collected.
type proc struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	events chan map[string]any
	exited chan struct{}
}

func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(filepath.Join(bin, strings.Fields(name)[0]), args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, name: name, cmd: cmd, events: make(chan map[string]any, 1000), exited: make(chan struct{})}
	logs := make(chan struct{})
	go func() { // stderr: the programs' logs, shown with -v
		defer close(logs)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			t.Logf("%s: %s", name, sc.Text())
		}
	}()
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev map[string]any
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				t.Logf("%s event: %s", name, sc.Text())
				p.events <- ev
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		<-logs
		_ = cmd.Wait()
		close(p.events)
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// next returns the next stdout event, failing the test after d.
func (p *proc) next(d time.Duration) map[string]any {
	p.t.Helper()
	select {
	case ev, ok := <-p.events:
		if !ok {
			p.t.Fatalf("%s exited (%v) while an event was expected", p.name, p.cmd.ProcessState)
		}
		return ev
	case <-time.After(d):
		p.t.Fatalf("%s: no event within %v", p.name, d)
	}
	return nil
}

// await returns the next event of the given kind, skipping others (which
// it also returns, in order).
func (p *proc) await(kind string, d time.Duration) (map[string]any, []map[string]any) {
	p.t.Helper()
	var skipped []map[string]any
	deadline := time.Now().Add(d)
	for {
		ev := p.next(time.Until(deadline))
		if ev["event"] == kind {
			return ev, skipped
		}
		skipped = append(skipped, ev)
	}
}

func (p *proc) signal(s syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(s); err != nil {
		p.t.Fatalf("%s: signal %v: %v", p.name, s, err)
	}
}

// waitExit waits for the process and returns its remaining events.
func (p *proc) waitExit(d time.Duration) []map[string]any {
	p.t.Helper()
	var rest []map[string]any
	deadline := time.After(d)
	for {
		select {
		case ev, ok := <-p.events:
			if !ok {
				if !p.cmd.ProcessState.Success() {
					p.t.Fatalf("%s exited with %v", p.name, p.cmd.ProcessState)
				}
				return rest
			}
			rest = append(rest, ev)
		case <-deadline:
			p.t.Fatalf("%s still running after %v", p.name, d)
		}
	}
}

func parseTime(t *testing.T, v any) time.Time {
	t.Helper()
	s, _ := v.(string)
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("time %q: %v", s, err)
	}
	return ts
}

func num(ev map[string]any, k string) int64 {
	f, _ := ev[k].(float64)
	return int64(f)
}

// testCore is the core the coordinator runs on: COORDINATORD_TEST_CORE=shard
// runs it on the shard-owner core, else the queue core. The daemon does not
// see the variable: it would warn about it (an unknown COORDINATORD_*
// variable).
const testCore = "COORDINATORD_TEST_CORE"

func sharded() bool { return os.Getenv(testCore) == "shard" }

// coreFlags put the coordinator on the tests' core: the shard core with a
// 2 s member lease, as internal/server's suite runs it.
func coreFlags() []string {
	if !sharded() {
		return nil
	}
	return []string{"--core", "shard", "--shard-lease-ttl", "2s"}
}

// startCoordinator starts coordinatord with an embedded etcd on the tests'
// core and returns its address, read from its "coordinatord serving" log
// line, once it serves (on the shard core, every shard).
func startCoordinator(t *testing.T) string {
	cmd := exec.Command(filepath.Join(bin, "coordinatord"), append(coreFlags(), "--listen", "127.0.0.1:0", "--data-dir", t.TempDir(), "--log-format", "json")...)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, testCore+"=") })
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == "coordinatord serving" {
				addr <- line["addr"].(string)
			}
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	select {
	case a := <-addr:
		if sharded() {
			awaitShards(t, a)
		}
		return a
	case <-done:
		t.Fatal("coordinatord exited before serving")
	case <-time.After(60 * time.Second):
		t.Fatal("coordinatord not serving after 60s")
	}
	return ""
}

// awaitShards waits until the coordinator at addr serves every shard of
// the shard core: List answers only then (SHARD_NOT_SERVED while a shard
// loads).
func awaitShards(t *testing.T, addr string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	lc := coordinatorv1.NewLockServiceClient(conn)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := lc.List(ctx, &coordinatorv1.ListRequest{})
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("coordinatord serves no List 30s after start (not every shard served): %v", err)
		}
	}
}

type write struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Token  int64  `json:"token"`
	Status int    `json:"status"`
	Reason string `json:"reason"`
}

type storeLog struct {
	Accepted []write `json:"accepted"`
	Refused  []write `json:"refused"`
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

// TestPauseDemo: worker A holds the lock and writes; A is frozen with
// SIGSTOP past its TTL; worker B acquires the lock and writes; A resumes.
// A's SDK must report the loss before A writes again, A's late write must
// be refused, B's writes must stand, and the store must never have
// accepted a token lower than one it had accepted before.
func TestPauseDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs three programs")
	}
	coord := startCoordinator(t)
	storage := start(t, "storage", "-listen", "127.0.0.1:0", "-coordinator", coord)
	base := "http://" + storage.next(30 * time.Second)["addr"].(string)
	worker := func(name string, args ...string) *proc {
		return start(t, "worker "+name, append([]string{"-coordinator", coord, "-storage", base, "-name", name, "-ttl", ttl.String()}, args...)...)
	}

	// A acquires and writes every 100ms until it notices it lost the lock.
	a := worker("A", "-interval", "100ms", "-write-after-loss")
	acqA := a.next(30 * time.Second)
	if acqA["event"] != "acquired" {
		t.Fatalf("A's first event: %v", acqA)
	}
	tokenA := num(acqA, "token")
	for range 2 {
		if ev, _ := a.await("wrote", 10*time.Second); num(ev, "status") != http.StatusOK {
			t.Fatalf("A's write while holding the lock: %v", ev)
		}
	}

	// Freeze A: no heartbeats, no writes, no clock checks.
	a.signal(syscall.SIGSTOP)
	frozen := time.Now()

	// B waits for the lock; it is granted once A's lease has expired in etcd.
	b := worker("B", "-interval", "100ms", "-writes", "3", "-hold")
	acqB := b.next(30 * time.Second)
	if acqB["event"] != "acquired" {
		t.Fatalf("B's first event: %v", acqB)
	}
	tokenB := num(acqB, "token")
	if tokenB <= tokenA {
		t.Fatalf("B's token %d not above A's %d", tokenB, tokenA)
	}
	for range 3 {
		if ev, _ := b.await("wrote", 10*time.Second); num(ev, "status") != http.StatusOK {
			t.Fatalf("B's write: %v", ev)
		}
	}
	t.Logf("A frozen for %v; B (token %d) acquired and wrote; resuming A (token %d)", time.Since(frozen).Round(time.Millisecond), tokenB, tokenA)

	// Keep A frozen for at least its TTL, then wake it up. (B may be
	// granted a little earlier: A's lease started at its last renewal,
	// before the freeze.)
	if d := ttl - time.Since(frozen); d > 0 {
		time.Sleep(d)
	}
	a.signal(syscall.SIGCONT)
	rest := a.waitExit(30 * time.Second)
	lost, late := -1, -1
	for i, ev := range rest {
		switch ev["event"] {
		case "lost":
			lost = i
			if e, _ := ev["err"].(string); !strings.Contains(e, "expired") && !strings.Contains(e, "lost") {
				t.Errorf("A's loss reported as %q", e)
			}
			// A's SDK considered the lock safe only until a time before
			// B's grant: never two holders that both think they hold it.
			if su, at := parseTime(t, ev["safe_until"]), parseTime(t, acqB["at"]); !su.Before(at) {
				t.Errorf("A was told its lock was safe until %v, B acquired at %v", su, at)
			}
		case "late_write":
			late = i
			if num(ev, "status") != http.StatusConflict {
				t.Errorf("A's write after the loss: status %d, want 409", num(ev, "status"))
			}
		case "wrote":
			// A write event read after SIGCONT: either one sent before the
			// freeze (accepted only if the store saw it before B's writes,
			// checked against the store's log below), or one already past
			// its Err check when A froze, which the store must refuse.
			if lost != -1 {
				t.Errorf("A wrote after its SDK reported the loss: %v", ev)
			}
			t.Logf("A's write event after SIGCONT: %v", ev)
		}
	}
	if lost == -1 {
		t.Fatalf("A's SDK never reported the loss; A's events after SIGCONT: %v", rest)
	}
	if late == -1 || late < lost {
		t.Fatalf("no late write after the loss report; A's events after SIGCONT: %v", rest)
	}

	// The store's view.
	var hist storeLog
	getJSON(t, base+"/log", &hist)
	var highest int64
	firstB := -1
	for i, w := range hist.Accepted {
		if w.Token < highest {
			t.Errorf("store accepted token %d after token %d", w.Token, highest)
		}
		highest = max(highest, w.Token)
		if w.Token == tokenB && firstB == -1 {
			firstB = i
		}
		if w.Token == tokenA && firstB != -1 {
			t.Errorf("store accepted A's write %q after B's", w.Value)
		}
		if w.Token != tokenA && w.Token != tokenB {
			t.Errorf("store accepted an unknown token %d", w.Token)
		}
	}
	if firstB == -1 {
		t.Fatal("store has no write of B")
	}
	refusedA := false
	for _, w := range hist.Refused {
		if w.Token == tokenA && w.Status == http.StatusConflict {
			refusedA = true
		}
	}
	if !refusedA {
		t.Fatalf("store never refused A's token: %+v", hist.Refused)
	}
	var obj struct {
		Value string `json:"value"`
		Token int64  `json:"token"`
	}
	getJSON(t, base+"/objects/report", &obj)
	if obj.Token != tokenB || obj.Value != "B-3" {
		t.Fatalf("final object %+v, want B's last write (B-3, token %d)", obj, tokenB)
	}

	// B gives the lock up cleanly.
	b.signal(syscall.SIGTERM)
	if ev, _ := b.await("released", 10*time.Second); ev == nil {
		t.Fatal("B did not release")
	}
}
