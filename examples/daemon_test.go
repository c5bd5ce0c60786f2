// Package examples_test runs the example clients in other languages and the
// grpcurl walkthrough (docs/WALKTHROUGH.md) against a real coordinatord process (embedded
// etcd, loopback port picked by the kernel).
package examples_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// repoRoot is the repository root; tests run in examples/.
const repoRoot = ".."

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "coordinatord-bin")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "coordinatord")
	out, err := exec.Command("go", "build", "-o", binary, "../cmd/coordinatord").CombinedOutput()
	if err != nil {
		panic("go build: " + err.Error() + "\n" + string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(
			goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		); err != nil {
			println("goleak:", err.Error())
			code = 1
		}
	}
	os.Exit(code)
}

// required reports whether a missing runtime must fail the test instead of
// skipping it: .ci/run sets COORDTEST_EXAMPLES_REQUIRED=1 after installing
// the runtimes, so that in CI these tests never skip (not COORDINATORD_*:
// the daemon warns about unknown COORDINATORD_* variables).
func required() bool { return os.Getenv("COORDTEST_EXAMPLES_REQUIRED") == "1" }

// skipOrFail skips with msg, or fails in CI (see required).
func skipOrFail(t *testing.T, msg string) {
	t.Helper()
	if required() {
		t.Fatal(msg + " (COORDTEST_EXAMPLES_REQUIRED=1: not skipping)")
	}
	t.Skip(msg)
}

// testCore is the core the daemons run on: COORDINATORD_TEST_CORE=shard
// runs them on the shard-owner core, else the queue core. The daemon does
// not see the variable (it would warn about it, see required).
const testCore = "COORDINATORD_TEST_CORE"

func sharded() bool { return os.Getenv(testCore) == "shard" }

// coreFlags put a daemon on the tests' core: the shard core with a 2 s
// member lease, as internal/server's suite runs it.
func coreFlags() []string {
	if !sharded() {
		return nil
	}
	return []string{"--core", "shard", "--shard-lease-ttl", "2s"}
}

// daemonEnv is this process's environment without testCore.
func daemonEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, testCore+"=") })
}

// startDaemon runs coordinatord with its own embedded etcd in a temporary data
// directory, on a loopback port picked by the kernel, on the tests' core, and
// returns its address once it serves (on the shard core, every shard).
// The daemon is stopped with SIGTERM (then killed) when the test ends.
func startDaemon(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(binary, append(coreFlags(), "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(t.TempDir(), "data"))...)
	cmd.Env = daemonEnv()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var line struct{ Msg, Addr, Level string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "coordinatord serving" {
				addr <- line.Addr
			} else if line.Level == "ERROR" {
				t.Logf("coordinatord: %s", sc.Text())
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("coordinatord exit after SIGINT: %v, want status 0", err)
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			t.Logf("coordinatord killed: %v", <-done)
			t.Error("coordinatord still running 20s after SIGINT")
		}
	})
	select {
	case a := <-addr:
		if sharded() {
			awaitShards(t, lockClient(t, a))
		}
		return a
	case err := <-done:
		t.Fatalf("coordinatord exited before serving: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("coordinatord not serving after 60s")
	}
	return ""
}

// awaitShards waits until the daemon of lc serves every shard of the shard
// core: List answers only then (SHARD_NOT_SERVED while a shard loads).
func awaitShards(t *testing.T, lc coordinatorv1.LockServiceClient) {
	t.Helper()
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

// lockClient is a Go client of the daemon at addr, for assertions.
func lockClient(t *testing.T, addr string) coordinatorv1.LockServiceClient {
	t.Helper()
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return coordinatorv1.NewLockServiceClient(c)
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
