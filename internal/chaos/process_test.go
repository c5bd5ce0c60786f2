package chaos_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/chaos"
)

// startDaemon builds cmd/coordinatord and runs it as a client of the
// cluster (with extra flags); it returns the process and its gRPC address.
func startDaemon(t *testing.T, endpoints []string, extra ...string) (*exec.Cmd, string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "coordinatord")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/coordinatord/coordinatord/cmd/coordinatord").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	args := append([]string{"--listen", "127.0.0.1:0", "--etcd-endpoints", strings.Join(endpoints, ","), "--key-prefix", chaos.KeyPrefix}, extra...)
	cmd := exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	addr := make(chan string, 1)
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
		_, _ = io.Copy(io.Discard, stderr)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-done
		_ = cmd.Wait()
	})
	select {
	case a := <-addr:
		return cmd, a
	case <-done:
		t.Fatal("coordinatord exited before serving")
	case <-time.After(60 * time.Second):
		t.Fatal("coordinatord not serving after 60s")
	}
	return nil, ""
}

// TestSIGSTOPReplicaProcess freezes a coordinatord process (the replica,
// not a client) for longer than the TTL while it serves a holder. The lock
// passes on through the other replica; when the process resumes, whatever
// it had in flight and whatever the old holder sends through it is refused.
func TestSIGSTOPReplicaProcess(t *testing.T) {
	scenario(t, false)
	e := newEnv(t, 1)
	cmd, addr := startDaemon(t, e.Cluster.ClientURLs())
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	lcs := []coordinatorv1.LockServiceClient{coordinatorv1.NewLockServiceClient(conn), e.Replicas[0].Client()}
	r := run{d: scale(14 * time.Second), names: []string{"a"}, pauseOneIn: 4, wantStale: true}
	w := &chaos.Workload{Replicas: lcs, Names: r.names, ClientsPerName: 3, PauseOneIn: r.pauseOneIn, Compacted: e.Compactor.Compacted}
	ctx, cancel := context.WithTimeout(context.Background(), r.d)
	defer cancel()
	bg := make(chan struct{})
	go func() { defer close(bg); w.Run(ctx) }()

	work := context.Background()
	holder, other := w.Client(1000, "s"), w.Client(1001, "s")
	holder.Use(0)
	other.Use(1)
	other.Wait = 15 * time.Second
	g, ok := holder.Acquire(work)
	if !ok || !holder.Write(work, g.GetToken(), false) {
		t.Fatal("holder could not acquire and write through the process")
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The signal takes effect asynchronously: a renewal sent before the
	// process is really stopped may be answered at once (a renewal takes
	// about a millisecond), which is not what this test is about.
	eventually(t, 5*time.Second, "the process is stopped", func() bool { return processState(cmd.Process.Pid) == 'T' })
	stopped := time.Now()
	// A renewal sent to the frozen process: it cannot answer in time.
	inflight := make(chan chaos.Outcome, 1)
	go func() { inflight <- holder.KeepAlive(work, g) }()
	g2, out := other.AcquireID(work, chaos.RequestID(), 1)
	if out != chaos.OK || g2.GetToken() <= g.GetToken() {
		t.Fatalf("through the other replica: %v token %d after %d", out, g2.GetToken(), g.GetToken())
	}
	if !other.Write(work, g2.GetToken(), false) {
		t.Fatal("new holder's write refused")
	}
	time.Sleep(time.Until(stopped.Add(2*w.TTL + time.Second)))
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if o := <-inflight; o == chaos.OK {
		t.Fatal("a renewal sent to the frozen replica succeeded after the lease had passed on")
	}
	holder.Use(0)
	eventually(t, 30*time.Second, "the resumed process answers", func() bool {
		_, err := lcs[0].ValidateToken(work, &coordinatorv1.ValidateTokenRequest{Name: "s", Token: g.GetToken()})
		return err == nil
	})
	holder.Use(0)
	if holder.Write(work, g.GetToken(), true) {
		t.Fatal("stale write through the resumed process accepted")
	}
	holder.Use(0)
	if holder.KeepAlive(work, g) == chaos.OK {
		t.Fatal("the resumed process renewed a superseded grant")
	}
	other.Release(work, chaos.Release, g2.GetToken(), g2.GetHandle())
	<-ctx.Done()
	<-bg
	check(t, w, true)
}

// processState is the state letter of /proc/<pid>/stat ('T': stopped), or 0.
func processState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ...: comm may hold spaces, so look after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// TestRetryElsewhereWhileWaiterReplicaFrozen is the lease promise under a
// replica pause (issue 13, row 17): client C waits on replica A (a
// coordinatord process) with a request id and a short deadline; A freezes;
// C's call ends with DEADLINE_EXCEEDED and C retries with the same id on
// replica B, which resumes the same queue entry and grants it. When A
// thaws, its clean-up of the abandoned wait must not end that grant: C's
// token stays valid and nobody else is granted the lock until C's
// safe_until (CheckSafeUntil, run by check, judges the history).
func TestRetryElsewhereWhileWaiterReplicaFrozen(t *testing.T) {
	scenario(t, false)
	e := newEnv(t, 1)
	cmd, addr := startDaemon(t, e.Cluster.ClientURLs())
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const a, b = 0, 1
	w := &chaos.Workload{Replicas: []coordinatorv1.LockServiceClient{coordinatorv1.NewLockServiceClient(conn), e.Replicas[0].Client()}}
	ctx := context.Background()
	blocker, c, d := w.Client(1000, "f"), w.Client(1001, "f"), w.Client(1002, "f")
	blocker.Use(b)
	blocker.TTL = 10 * time.Second
	gb, ok := blocker.Acquire(ctx)
	if !ok {
		t.Fatal("blocker not granted")
	}

	// C waits on A, with a deadline far shorter than its wait.
	c.Use(a)
	c.TTL, c.Wait, c.Timeout = 8*time.Second, 20*time.Second, 1500*time.Millisecond
	rid := chaos.RequestID()
	first := make(chan chaos.Outcome, 1)
	go func() {
		_, out := c.AcquireID(ctx, rid, 1)
		first <- out
	}()
	var entry int64 // C's queue entry: its create revision is the token it will get
	eventually(t, 10*time.Second, "C is queued through A", func() bool {
		r, err := e.Etcd.Get(ctx, chaos.KeyPrefix+"locks/f/", clientv3.WithLastCreate()...)
		if err != nil || r.Count != 2 {
			return false
		}
		entry = r.Kvs[0].CreateRevision
		return true
	})
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			_ = cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	defer thaw()
	eventually(t, 5*time.Second, "A is stopped", func() bool { return processState(cmd.Process.Pid) == 'T' })
	if out := <-first; out != chaos.Ambiguous {
		t.Fatalf("C's wait through the frozen replica: %v, want DEADLINE_EXCEEDED", out)
	}

	// C retries with the same id on B, which resumes the entry and grants
	// it once the blocker is gone.
	if blocker.Release(ctx, chaos.Release, gb.GetToken(), gb.GetHandle()) != chaos.OK {
		t.Fatal("blocker's release failed")
	}
	c.Use(b)
	c.Wait, c.Timeout = 5*time.Second, 0
	g, out := c.AcquireID(ctx, rid, 1)
	if out != chaos.OK || g.GetToken() != entry {
		t.Fatalf("C's retry on B: %v token %d, want the grant of its queue entry %d", out, g.GetToken(), entry)
	}
	safeUntil := g.GetSafeUntil().AsTime()
	t.Logf("C granted token %d through B, safe until %v from now", g.GetToken(), time.Until(safeUntil).Round(time.Millisecond))

	// A thaws: its abandoned wait is cleaned up.
	thaw()
	eventually(t, 10*time.Second, "the thawed replica answers", func() bool {
		_, err := w.Replicas[a].ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: "f", Token: g.GetToken()})
		return err == nil
	})
	time.Sleep(500 * time.Millisecond) // A's clean-up has run by now

	// Until C's safe_until, C holds the lock: valid, and nobody else gets it.
	c.Use(b)
	if ok, err := c.Validate(ctx, "f", g.GetToken()); !ok || err != nil {
		t.Errorf("C's token is not valid %v before its safe_until (err %v)", time.Until(safeUntil).Round(time.Millisecond), err)
	}
	d.Use(b)
	d.Wait = 500 * time.Millisecond
	if gd, ok := d.Acquire(ctx); ok {
		t.Errorf("D granted token %d %v before C's safe_until", gd.GetToken(), time.Until(safeUntil).Round(time.Millisecond))
		d.Release(ctx, chaos.Release, gd.GetToken(), gd.GetHandle())
	}
	if time.Now().After(safeUntil) {
		t.Fatal("void run: the checks ran after C's safe_until (machine too slow)")
	}
	c.Release(ctx, chaos.Release, g.GetToken(), g.GetHandle())
	check(t, w, false)
}
