package client_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"
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

func (d *daemon) start(bin string) error {
	d.cmd = exec.Command(bin, "-listen", "127.0.0.1:0", "-data-dir", filepath.Join(d.dir, "data"), "-log-format", "json")
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
		return nil
	case err := <-d.done:
		d.done <- err
		return fmt.Errorf("coordinatord exited before serving: %w", err)
	case <-time.After(60 * time.Second):
		return errors.New("coordinatord not serving after 60s")
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
