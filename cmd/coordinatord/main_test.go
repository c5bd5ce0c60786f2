package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "coordinatord-bin")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "coordinatord")
	// Built as make build does: the version set by the linker.
	out, err := exec.Command("go", "build", "-ldflags", "-X "+versionVar+"="+testVersion, "-o", binary, ".").CombinedOutput()
	if err != nil {
		panic("go build: " + err.Error() + "\n" + string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running daemon process.
type proc struct {
	cmd  *exec.Cmd
	addr string
	logs chan map[string]any // every JSON log line
	done chan error
}

// testCore is the core the daemons run on: COORDINATORD_TEST_CORE=shard
// runs them on the shard-owner core, else the queue core. The daemons do
// not see the variable: they would warn about it (an unknown COORDINATORD_*
// variable).
const testCore = "COORDINATORD_TEST_CORE"

func sharded() bool { return os.Getenv(testCore) == "shard" }

// daemonEnv is this process's environment without testCore.
func daemonEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, testCore+"=") })
}

// coreFlags put a daemon on the tests' core: on the shard core, with a 2 s
// member lease (as internal/server's suite) and a metrics listener, where
// startDaemon sees when every shard is served (args given after these
// override them).
func coreFlags() []string {
	if !sharded() {
		return nil
	}
	return []string{"--core", "shard", "--shard-lease-ttl", "2s", "--metrics-listen", "127.0.0.1:0"}
}

// startDaemon starts the daemon with args on the tests' core and returns
// once it serves: on the shard core, once it serves every shard.
func startDaemon(t *testing.T, args ...string) *proc {
	t.Helper()
	args = append(coreFlags(), args...)
	cmd := exec.Command(binary, append([]string{"--listen", "127.0.0.1:0", "--log-level", "debug"}, args...)...)
	cmd.Env = daemonEnv()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, logs: make(chan map[string]any, 1000), done: make(chan error, 1)}
	addr, metrics := make(chan string, 1), make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				t.Logf("non-JSON log line: %s", sc.Text())
				continue
			}
			switch line["msg"] {
			case "coordinatord serving":
				addr <- line["addr"].(string)
			case "metrics serving":
				metrics <- line["addr"].(string)
			}
			select {
			case p.logs <- line:
			default:
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			t.Logf("coordinatord killed at cleanup: %v", <-p.done)
		}
	})
	select {
	case p.addr = <-addr:
	case err := <-p.done:
		t.Fatalf("daemon exited before serving: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("daemon not serving after 60s")
	}
	if sharded() {
		select {
		case a := <-metrics:
			awaitShards(t, a)
		case <-time.After(10 * time.Second):
			t.Fatal("no metrics listener logged by the daemon on the shard core")
		}
	}
	return p
}

// awaitShards waits until the daemon whose metrics listen on addr serves
// every shard of the shard core (coordinatord_shards_serving equals
// coordinatord_shards): before, a call on a shard still loading answers
// SHARD_NOT_SERVED.
func awaitShards(t *testing.T, addr string) {
	t.Helper()
	gauge := func(body, name string) string {
		for line := range strings.Lines(body) {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				return strings.TrimSpace(v)
			}
		}
		return ""
	}
	var serving string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		shards := gauge(string(b), "coordinatord_shards")
		if serving = gauge(string(b), "coordinatord_shards_serving"); shards != "" && serving == shards {
			return
		}
	}
	t.Fatalf("the daemon serves %s shards 30s after start, not all", serving)
}

func (p *proc) conn(t *testing.T) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		if err != nil {
			p.logErrors(t)
			t.Fatalf("daemon exit after SIGTERM: %v, want status 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("daemon still running 30s after SIGTERM")
	}
}

// logErrors logs the daemon's warning and error lines not yet read, so a
// failed stop says why.
func (p *proc) logErrors(t *testing.T) {
	t.Helper()
	for {
		select {
		case l := <-p.logs:
			if lv, _ := l["level"].(string); lv == "WARN" || lv == "ERROR" {
				t.Logf("daemon log: %v", l)
			}
		default:
			return
		}
	}
}

func (p *proc) sawLog(msg string) bool {
	for {
		select {
		case l := <-p.logs:
			if s, _ := l["msg"].(string); strings.Contains(s, msg) {
				return true
			}
		default:
			return false
		}
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestDaemonEmbeddedServesAndStopsOnSIGTERM(t *testing.T) {
	dataDir := t.TempDir()
	p := startDaemon(t, "--data-dir", dataDir)
	conn := p.conn(t)

	h, err := healthpb.NewHealthClient(conn).Check(ctxT(t), &healthpb.HealthCheckRequest{})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v; want SERVING", h, err)
	}

	rs, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	rr, err := rs.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var services []string
	for _, s := range rr.GetListServicesResponse().GetService() {
		services = append(services, s.Name)
	}
	for _, want := range []string{"coordinator.v1.LockService", "grpc.health.v1.Health"} {
		if !slices.Contains(services, want) {
			t.Fatalf("reflection lists %v, missing %s", services, want)
		}
	}
	_ = rs.CloseSend()

	lc := coordinatorv1.NewLockServiceClient(conn)
	g, err := lc.Acquire(ctxT(t), &coordinatorv1.AcquireRequest{Name: "proc", Ttl: durationpb.New(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	waiter := make(chan error, 1)
	go func() {
		_, err := lc.Acquire(context.Background(), &coordinatorv1.AcquireRequest{Name: "proc"})
		waiter <- err
	}()
	for d, _ := lc.Describe(ctxT(t), &coordinatorv1.DescribeRequest{Name: "proc"}); len(d.GetWaiters()) == 0; d, _ = lc.Describe(ctxT(t), &coordinatorv1.DescribeRequest{Name: "proc"}) {
		time.Sleep(10 * time.Millisecond)
	}

	p.stop(t)
	if err := <-waiter; status.Code(err) != codes.Unavailable {
		t.Fatalf("waiter at SIGTERM: %v, want UNAVAILABLE", err)
	}
	if !p.sawLog("SINGLE-NODE MODE") {
		t.Error("no loud single-node-mode log line")
	}

	// Same data dir: the grant survived (its lease has time left), the waiter
	// left nothing behind, and the next token is greater.
	p2 := startDaemon(t, "--data-dir", dataDir)
	lc2 := coordinatorv1.NewLockServiceClient(p2.conn(t))
	d, err := lc2.Describe(ctxT(t), &coordinatorv1.DescribeRequest{Name: "proc"})
	if err != nil {
		t.Fatal(err)
	}
	if d.GetHolder().GetToken() != g.Token || len(d.GetWaiters()) != 0 {
		t.Fatalf("after restart Describe = %v; want holder %d and no waiters", d, g.Token)
	}
	rel, err := lc2.Release(ctxT(t), &coordinatorv1.ReleaseRequest{Name: "proc", Token: g.Token, Handle: g.Handle})
	if err != nil || !rel.Released {
		t.Fatalf("release after restart = %v, %v", rel, err)
	}
	g2, err := lc2.Acquire(ctxT(t), &coordinatorv1.AcquireRequest{Name: "proc", Wait: durationpb.New(0)})
	if err != nil {
		t.Fatal(err)
	}
	if g2.Token <= g.Token {
		t.Fatalf("token after daemon restart %d not above %d", g2.Token, g.Token)
	}
	p2.stop(t)
}

func TestDaemonWithExternalEtcd(t *testing.T) {
	e, err := embedetcd.Start(context.Background(), t.TempDir(), embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	p := startDaemon(t, "--etcd-endpoints", strings.Join(e.Endpoints(), ","), "--key-prefix", "/tenant-a/")
	lc := coordinatorv1.NewLockServiceClient(p.conn(t))
	g, err := lc.Acquire(ctxT(t), &coordinatorv1.AcquireRequest{Name: "ext"})
	if err != nil {
		t.Fatal(err)
	}
	if g.Ttl.AsDuration() != 15*time.Second {
		t.Fatalf("default TTL %v, want 15s", g.Ttl.AsDuration())
	}
	if p.sawLog("SINGLE-NODE MODE") {
		t.Error("single-node mode logged although endpoints were given")
	}
	p.stop(t)
}

func TestHelpExitsZero(t *testing.T) {
	out, err := exec.Command(binary, "-help").CombinedOutput()
	if err != nil {
		t.Fatalf("-help: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "-etcd-endpoints") {
		t.Fatalf("-help output lacks the flags: %s", out)
	}
}

func TestBadFlagsExitWithUsageError(t *testing.T) {
	for _, args := range [][]string{
		{"--default-ttl", "10m"},
		{"--max-ttl", "0s"},
		{"--log-format", "xml"},
		{"extra-arg"},
		{"--tls-cert", "server.crt"},
		{"--tls-client-ca", "ca.crt"},
		{"--auth-tokens", "tokens"},
		{"--auth-reload-interval", "0s"},
		{"--etcd-username", "coord"},
		{"--etcd-username", "coord", "--etcd-password-file", "/nonexistent/password"},
		{"--max-concurrent-streams", "-1"},
		{"--rate-limit", "-1"},
		{"--max-wait", "-1s"},
		{"--etcd-auto-compaction-mode", "hourly"},
		{"--etcd-auto-compaction-retention", "soon"},
		{"--etcd-auto-compaction-mode", "revision", "--etcd-auto-compaction-retention", "5m"},
		{"--etcd-quota-backend-bytes", "-1"},
		{"--tls-identity-from-cn"},
		{"--max-connections", "-1"},
		{"--max-connection-idle", "-1s"},
		{"--max-hold-streams-per-caller", "x"},
	} {
		out, err := exec.Command(binary, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Fatalf("%v: exit %v, want 2; output %s", args, err, out)
		}
	}
}
