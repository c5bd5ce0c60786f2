package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof" // the children serve /debug/pprof on loopback
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coordinatord/coordinatord/internal/daemon"
)

// The benchmark runs three processes so that each one's CPU time and memory
// can be read on its own: this one (the load generator: every client of
// every system), an etcd child and a coordinatord child. Both children are
// this binary re-executed with a hidden first argument; each prints one
// "READY <addr> <pprof addr>" line and stops when its stdin closes.
const (
	coordPrefix     = "/coordinatord/" // the coordinatord child's etcd key prefix
	roleEtcd        = "child-etcd"
	roleCoordinator = "child-coordinator"
)

// runChild runs a child role and returns the exit status.
func runChild(role string, args []string) int {
	fs := flag.NewFlagSet(role, flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "etcd data directory")
	etcdURL := fs.String("etcd", "", "etcd client URL")
	core := fs.String("core", "queue", "coordinatord's lock core")
	listen := fs.String("listen", "127.0.0.1:0", "coordinatord's gRPC address")
	advertise := fs.String("advertise", "", "shard core: the address the other members forward to")
	secretFile := fs.String("member-secret-file", "", "shard core: the members' shared secret")
	shardTTL := fs.Duration("shard-lease-ttl", 0, "shard core: the member lease's TTL (0: the daemon's default)")
	quietCalls := fs.Bool("quiet-calls", false, "do not log each failed call (the failover scenario's members: thousands of expected UNAVAILABLE answers)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The parent closes our stdin to stop us (or dies, which closes it too).
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()

	pprofLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, role, err)
		return 1
	}
	go func() { _ = http.Serve(pprofLis, nil) }()

	switch role {
	case roleEtcd, roleEtcdEmbedded:
		if err := os.MkdirAll(*dataDir, 0o700); err != nil {
			fmt.Fprintln(os.Stderr, role, err)
			return 1
		}
		e, err := startEtcd(ctx, role, *dataDir)
		if err != nil {
			fmt.Fprintln(os.Stderr, role, err)
			return 1
		}
		fmt.Printf("READY %s %s\n", e.Endpoints()[0], pprofLis.Addr())
		<-ctx.Done()
		e.Close()
		return 0
	case roleCoordinator:
		var h slog.Handler = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})
		if *quietCalls {
			h = dropCalls{h}
		}
		log := slog.New(h)
		err := daemon.Run(ctx, daemon.Config{
			Listen:           *listen,
			EtcdEndpoints:    []string{*etcdURL},
			KeyPrefix:        coordPrefix,
			DefaultTTL:       15 * time.Second,
			MaxTTL:           time.Hour, // the held-lock scenario holds locks for the whole run
			ShutdownTimeout:  5 * time.Second,
			Core:             *core,
			Advertise:        *advertise,
			MemberSecretFile: *secretFile,
			ShardLeaseTTL:    *shardTTL,
			Logger:           log,
			OnListen:         func(a net.Addr) { fmt.Printf("READY %s %s\n", a, pprofLis.Addr()) },
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, role, err)
			return 1
		}
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown role", role)
	return 2
}

// dropCalls drops the gRPC logging interceptor's record of each call
// ("finished call"); every other record passes.
type dropCalls struct{ slog.Handler }

func (d dropCalls) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "finished call" {
		return nil
	}
	return d.Handler.Handle(ctx, r)
}

func (d dropCalls) WithAttrs(as []slog.Attr) slog.Handler { return dropCalls{d.Handler.WithAttrs(as)} }

func (d dropCalls) WithGroup(name string) slog.Handler { return dropCalls{d.Handler.WithGroup(name)} }

// child is a running child process.
type child struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	addr    string        // etcd client URL or gRPC address
	pprof   string        // host:port of its /debug/pprof
	exited  chan struct{} // closed when the process has exited (then waitErr is set)
	waitErr error
}

func startChild(role string, args ...string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, append([]string{role}, args...)...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, stdin: stdin, exited: make(chan struct{})}
	ready := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "READY" {
				ready <- f[1:]
			}
		}
		c.waitErr = cmd.Wait()
		close(c.exited)
	}()
	select {
	case f := <-ready:
		c.addr, c.pprof = f[0], f[1]
		return c, nil
	case <-c.exited:
		return nil, fmt.Errorf("%s exited before it was ready: %w", role, c.waitErr)
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("%s not ready after 60s", role)
	}
}

// stopLogged stops the child and says on stderr if it did not exit
// cleanly; the run's own outcome stands (the measurements are done).
func stopLogged(role string, c *child) {
	if err := c.stop(); err != nil {
		fmt.Fprintf(os.Stderr, "coordbench: stop %s: %v\n", role, err)
	}
}

// stop closes the child's stdin and waits for it to exit (killing it after
// 30s). A child that has already exited (stopped or killed) is left alone:
// its exit status is returned again.
func (c *child) stop() error {
	_ = c.stdin.Close()
	select {
	case <-c.exited:
		return c.waitErr
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
		return errors.New("child did not stop within 30s; killed")
	}
}

// kill sends the child SIGKILL (kill -9: no drain, no hand-over, its etcd
// lease abandoned) and waits until it has exited.
func (c *child) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.exited
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times; 100 on every
// Linux this runs on.
const clockTicks = 100

// cpuTime is the user+system CPU time the process has used.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses and may
	// contain spaces: state is field 3, utime 14, stime 15.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	return time.Duration(u+st) * time.Second / clockTicks, nil
}

// rss is the resident set size of the process in bytes (VmRSS).
func rss(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb * 1024, err
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// fetchProfile takes a CPU profile of a child for d and writes it to path.
func fetchProfile(pprofAddr string, d time.Duration, path string) error {
	secs := max(int(d/time.Second), 1)
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", pprofAddr, secs))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile: %s", resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// machineBusy is the CPU time all CPUs of the machine have spent busy
// (user, nice, system, irq, softirq, steal), from /proc/stat.
func machineBusy() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, errors.New("unexpected /proc/stat")
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, errors.New("unexpected /proc/stat")
		}
		busy += v
	}
	return time.Duration(busy) * time.Second / clockTicks, nil
}

// loadAvg is the first three fields of /proc/loadavg.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
