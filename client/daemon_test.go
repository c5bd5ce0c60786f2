package client_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// daemon is a coordinatord process with its own embedded etcd in a
// temporary directory, listening on a loopback port the kernel picked.
type daemon struct {
	dir  string
	addr string
	cmd  *exec.Cmd
	done chan error // the process's exit, once its stderr is drained
}

// repoRoot is the repository root: the tests run in client/.
const repoRoot = ".."

// startDaemon builds coordinatord from this repository (the root module,
// ../cmd/coordinatord) and starts it. It returns once the daemon serves.
func startDaemon() (*daemon, error) {
	dir, err := os.MkdirTemp("", "coordinatord-client-test")
	if err != nil {
		return nil, err
	}
	d := &daemon{dir: dir, done: make(chan error, 1)}
	bin := filepath.Join(dir, "coordinatord")
	build := exec.Command("go", "build", "-o", bin, "./cmd/coordinatord")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("go build ./cmd/coordinatord: %w\n%s", err, out)
	}
	if err := d.start(bin); err != nil {
		_ = d.stop()
		return nil, err
	}
	return d, nil
}

// testCore is the core the daemon runs on: COORDINATORD_TEST_CORE=shard
// runs it on the shard-owner core, else the queue core. The daemon does
// not see the variable: it would warn about it (an unknown COORDINATORD_*
// variable).
const testCore = "COORDINATORD_TEST_CORE"

// coreFlags put the daemon on the tests' core: on the shard core with a
// 2 s member lease, as the root module's server suite runs it.
func coreFlags() []string {
	if os.Getenv(testCore) != "shard" {
		return nil
	}
	return []string{"-core", "shard", "-shard-lease-ttl", "2s"}
}

// daemonEnv is this process's environment without testCore.
func daemonEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, testCore+"=") })
}

func (d *daemon) start(bin string) error {
	d.cmd = exec.Command(bin, append(coreFlags(), "-listen", "127.0.0.1:0", "-data-dir", filepath.Join(d.dir, "data"), "-log-format", "json")...)
	d.cmd.Env = daemonEnv()
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := d.cmd.Start(); err != nil {
		return err
	}
	addr := make(chan string, 1)
	go d.read(stderr, addr)
	select {
	case d.addr = <-addr:
		if coreFlags() != nil {
			return d.awaitShards()
		}
		return nil
	case err := <-d.done:
		d.done <- err
		return fmt.Errorf("coordinatord exited before serving: %w", err)
	case <-time.After(60 * time.Second):
		return errors.New("coordinatord not serving after 60s")
	}
}

// awaitShards waits until the daemon serves every shard of the shard
// core: List answers only then (SHARD_NOT_SERVED while a shard loads).
func (d *daemon) awaitShards() error {
	conn, err := grpc.NewClient(d.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	lc := coordinatorv1.NewLockServiceClient(conn)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := lc.List(ctx, &coordinatorv1.ListRequest{})
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("coordinatord serves no List 30s after start (not every shard served): %w", err)
		}
	}
}

// read scans the daemon's JSON log for its address, shows its errors, and
// reports the exit of the process once the log ends.
func (d *daemon) read(stderr io.Reader, addr chan<- string) {
	sc := bufio.NewScanner(stderr)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line struct{ Msg, Addr, Level string }
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}
		switch {
		case line.Msg == "coordinatord serving":
			addr <- line.Addr
		case line.Level == "ERROR":
			fmt.Fprintln(os.Stderr, "coordinatord:", sc.Text())
		}
	}
	_, _ = io.Copy(io.Discard, stderr)
	d.done <- d.cmd.Wait()
}

// stop ends the daemon with SIGINT (killed if still running 20s later) and
// removes its directory.
func (d *daemon) stop() error {
	defer os.RemoveAll(d.dir)
	if d.cmd == nil || d.cmd.Process == nil {
		return nil
	}
	_ = d.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-d.done:
		return err
	case <-time.After(20 * time.Second):
		_ = d.cmd.Process.Kill()
		return fmt.Errorf("coordinatord still running 20s after SIGINT, killed: %w", <-d.done)
	}
}
