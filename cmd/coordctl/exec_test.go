package main_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestExecEnvironmentAndExitCode(t *testing.T) {
	// The child sees the lock and its token, and the token is current while
	// it runs; coordctl exits with the child's code and releases the lock.
	r := must(t, 42, "exec", "cli/exec", "--ttl", "5s", "--", "sh", "-c",
		`echo "lock=$COORDINATOR_LOCK token=$COORDINATOR_TOKEN until=$COORDINATOR_SAFE_UNTIL"; "$COORDCTL_BIN" validate "$COORDINATOR_LOCK" "$COORDINATOR_TOKEN" >/dev/null && echo valid; exit 42`)
	var lock, until string
	var token int64
	first, _, _ := strings.Cut(r.stdout, "\n")
	if _, err := fmt.Sscanf(strings.NewReplacer("=", " ").Replace(first), "lock %s token %d until %s", &lock, &token, &until); err != nil || lock != "cli/exec" || token <= 0 {
		t.Fatalf("child's environment: %q (%v)", first, err)
	}
	if _, err := time.Parse(time.RFC3339Nano, until); err != nil {
		t.Fatalf("COORDINATOR_SAFE_UNTIL %q: %v", until, err)
	}
	if !strings.Contains(r.stdout, "valid\n") {
		t.Fatalf("the token was not valid while the child ran:\n%s\n%s", r.stdout, r.stderr)
	}
	if m := decode(t, must(t, 0, "-o", "json", "describe", "cli/exec")); m["held"] != false {
		t.Fatalf("the lock is still held after exec: %v", m)
	}
	// Without "--": NAME, then the command.
	must(t, 0, "exec", "--ttl", "5s", "cli/exec", "true")
	must(t, 127, "exec", "cli/exec", "--", "/nonexistent/command")
	// Held by someone else: not acquired, and the command never runs.
	a := acquire(t, "cli/exec")
	r = must(t, exitNotAcquired, "exec", "cli/exec", "--wait", "0s", "--", "echo", "ran")
	if strings.Contains(r.stdout, "ran") {
		t.Fatal("the command ran without the lock")
	}
	must(t, 0, "release", "cli/exec", a.token, a.handle)
}

func TestExecForwardsSignals(t *testing.T) {
	cmd := coordctlCmd(t, "exec", "cli/signal", "--", "sh", "-c", `trap 'echo got-term; exit 9' TERM; echo ready; while :; do sleep 0.05; done`)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the child", func() bool { return strings.Contains(out.String(), "ready") })
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 9 || !strings.Contains(out.String(), "got-term") {
		t.Fatalf("after SIGTERM to coordctl: %v, want exit 9 from the child's trap; output:\n%s", err, out.String())
	}
	if m := decode(t, must(t, 0, "-o", "json", "describe", "cli/signal")); m["held"] != false {
		t.Fatalf("the lock is still held: %v", m)
	}
}

func TestExecNeverOverlaps(t *testing.T) {
	// Four coordctl exec at once on one name; each child appends its start
	// and end (nanoseconds) to one file, with a pause in between.
	file := filepath.Join(t.TempDir(), "log")
	const n = 4
	errs := make(chan error, n)
	for i := range n {
		cmd := coordctlCmd(t, "exec", "cli/overlap", "--ttl", "10s", "--", "sh", "-c",
			fmt.Sprintf(`echo "start %d $(date +%%s%%N)" >> %s; sleep 0.3; echo "end %d $(date +%%s%%N)" >> %s`, i, file, i, file))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { errs <- cmd.Wait() }()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("coordctl exec: %v", err)
		}
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2*n {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), 2*n, b)
	}
	var prevEnd int64
	seen := map[string]bool{}
	for i := 0; i < len(lines); i += 2 {
		var sw, ew, sid, eid string
		var start, end int64
		if _, err := fmt.Sscan(lines[i], &sw, &sid, &start); err != nil {
			t.Fatalf("line %q: %v", lines[i], err)
		}
		if _, err := fmt.Sscan(lines[i+1], &ew, &eid, &end); err != nil {
			t.Fatalf("line %q: %v", lines[i+1], err)
		}
		if sw != "start" || ew != "end" || sid != eid || seen[sid] || start < prevEnd || end < start {
			t.Fatalf("runs overlap (or the log is garbled) at line %d:\n%s", i+1, b)
		}
		seen[sid] = true
		prevEnd = end
	}
}

// pidAlive tells whether the process pid exists (and is not a zombie of ours).
func pidAlive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

// startLostExec starts coordctl exec with a 2s TTL and a child that writes
// its pid to a file and then runs until killed (ignoring SIGTERM if
// ignoreTerm). It returns the command, its combined output and the child's
// pid, once the child runs.
func startLostExec(t *testing.T, name string, ignoreTerm bool, grace string) (*exec.Cmd, *syncBuffer, int) {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "pid")
	script := `echo $$ > ` + pidFile + `; exec sleep 60`
	if ignoreTerm {
		script = `trap '' TERM; echo $$ > ` + pidFile + `; while :; do sleep 0.05; done`
	}
	cmd := coordctlCmd(t, "exec", name, "--ttl", "2s", "--grace", grace, "--", "sh", "-c", script)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if pid > 0 {
			_ = syscall.Kill(-pid, syscall.SIGKILL) // the child's process group, if the test failed
		}
	})
	waitFor(t, "the child's pid", func() bool {
		b, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return pid > 0
	})
	return cmd, &out, pid
}

// wantLost waits for coordctl to exit with the lost-lock code and checks
// that the child is gone.
func wantLost(t *testing.T, cmd *exec.Cmd, out *syncBuffer, pid int) {
	t.Helper()
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var err error
	select {
	case err = <-waited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Logf("coordctl exec killed: %v", <-waited)
		t.Fatalf("coordctl exec still runs 30s after its lock was lost; output:\n%s", out.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitLost {
		t.Fatalf("coordctl exec: %v, want exit %d; output:\n%s", err, exitLost, out.String())
	}
	if pidAlive(pid) {
		t.Fatalf("the child %d still runs after coordctl exited", pid)
	}
	if !strings.Contains(out.String(), "was lost") {
		t.Fatalf("no lost-lock message:\n%s", out.String())
	}
}

func holderToken(t *testing.T, name string) string {
	t.Helper()
	var tok string
	waitFor(t, name+" to be held", func() bool {
		m := decode(t, must(t, 0, "-o", "json", "describe", name))
		if h, ok := m["holder"].(map[string]any); ok {
			tok = fmt.Sprint(h["token"])
		}
		return tok != ""
	})
	return tok
}

func TestExecLockLostByForceRelease(t *testing.T) {
	t.Run("SIGTERM", func(t *testing.T) {
		cmd, out, pid := startLostExec(t, "cli/lost-term", false, "10s")
		must(t, 0, "force-release", "cli/lost-term", holderToken(t, "cli/lost-term"))
		wantLost(t, cmd, out, pid)
		if strings.Contains(out.String(), "SIGKILL\n") {
			t.Fatalf("SIGKILL although the child obeyed SIGTERM:\n%s", out.String())
		}
	})
	t.Run("SIGKILL after grace", func(t *testing.T) {
		cmd, out, pid := startLostExec(t, "cli/lost-kill", true, "500ms")
		must(t, 0, "force-release", "cli/lost-kill", holderToken(t, "cli/lost-kill"))
		wantLost(t, cmd, out, pid)
		if !strings.Contains(out.String(), "SIGKILL\n") {
			t.Fatalf("the child ignoring SIGTERM was not sent SIGKILL:\n%s", out.String())
		}
	})
}

func TestExecLockLostWhilePaused(t *testing.T) {
	// coordctl is frozen past its 2s TTL: its lease expires and someone else
	// gets the lock. When coordctl resumes, it must stop its child at once
	// (safe_until has passed) and exit with the lost-lock code.
	cmd, out, pid := startLostExec(t, "cli/paused", false, "10s")
	holderToken(t, "cli/paused")
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	b := acquire(t, "cli/paused", "--wait", "30s", "--owner", "successor") // granted once the lease expired
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	wantLost(t, cmd, out, pid)
	if !strings.Contains(out.String(), "expired") && !strings.Contains(out.String(), "gone") {
		t.Fatalf("lost-lock message:\n%s", out.String())
	}
	must(t, 0, "validate", "cli/paused", b.token) // the successor still holds it
	must(t, 0, "release", "cli/paused", b.token, b.handle)
}

func TestExecSemaphoreAndShared(t *testing.T) {
	// A semaphore of 2: a second exec runs beside the first, on the other
	// slot; a third is refused.
	r := must(t, 0, "exec", "cli/sem", "--limit", "2", "--", "sh", "-c",
		`"$COORDCTL_BIN" exec cli/sem --limit 2 --wait 0s -- sh -c '"$COORDCTL_BIN" exec cli/sem --limit 2 --wait 0s -- true; echo third=$?; echo inner=$COORDINATOR_SLOT'; echo outer=$COORDINATOR_SLOT`)
	if !strings.Contains(r.stdout, "inner=1\n") || !strings.Contains(r.stdout, "outer=0\n") ||
		!strings.Contains(r.stdout, "third="+strconv.Itoa(exitNotAcquired)+"\n") {
		t.Fatalf("exec --limit 2, nested three deep:\n%s\n%s", r.stdout, r.stderr)
	}
	// A read-write lock: a second reader runs beside the first, a writer
	// does not.
	r = must(t, 0, "exec", "cli/rw", "--shared", "--", "sh", "-c",
		`"$COORDCTL_BIN" exec cli/rw --shared --wait 0s -- echo reader; "$COORDCTL_BIN" exec cli/rw --wait 0s -- echo writer; echo writer=$?`)
	if !strings.Contains(r.stdout, "reader\n") || strings.Contains(r.stdout, "writer\n") ||
		!strings.Contains(r.stdout, "writer="+strconv.Itoa(exitNotAcquired)+"\n") {
		t.Fatalf("exec --shared, nested:\n%s\n%s", r.stdout, r.stderr)
	}
	must(t, exitUsage, "exec", "cli/x", "--limit", "2", "--shared", "--", "true")
}

// TestAcquireSemaphoreAndReader: acquire --limit N takes a semaphore's
// permit and shows its slot (table and JSON, slot 0 too), --shared a
// reader's hold, shown as such; a third permit of 2 is not acquired, a
// writer not while a reader holds, and --limit with --shared is a usage
// error.
func TestAcquireSemaphoreAndReader(t *testing.T) {
	a := decode(t, must(t, 0, "-o", "json", "acquire", "cli/acq-sem", "--limit", "2", "--ttl", "1m"))
	r := must(t, 0, "acquire", "cli/acq-sem", "--limit", "2", "--ttl", "1m")
	row := tableRow(t, r.stdout, "cli/acq-sem")
	if !strings.Contains(r.stdout, "SLOT") || len(row) != 7 {
		t.Fatalf("acquire --limit table: %q, want a SLOT column", r.stdout)
	}
	slots := map[string]bool{fmt.Sprint(a["slot"]): true, row[6]: true}
	if !slots["0"] || !slots["1"] {
		t.Fatalf("two permits of 2 hold slots %v, want 0 and 1", slots)
	}
	must(t, exitNotAcquired, "acquire", "cli/acq-sem", "--limit", "2", "--wait", "0s")
	must(t, 0, "release", "cli/acq-sem", a["token"].(string), a["handle"].(string))
	must(t, 0, "release", "cli/acq-sem", row[1], row[2])

	rd := decode(t, must(t, 0, "-o", "json", "acquire", "cli/acq-rw", "--shared"))
	if rd["mode"] != "LOCK_MODE_SHARED" {
		t.Fatalf("acquire --shared: %v, want mode LOCK_MODE_SHARED", rd)
	}
	if r := must(t, 0, "acquire", "cli/acq-rw", "--shared", "--wait", "0s"); !strings.Contains(r.stdout, "MODE") || !strings.Contains(r.stdout, "shared") {
		t.Fatalf("a second reader's table: %q, want MODE shared", r.stdout)
	}
	must(t, exitNotAcquired, "acquire", "cli/acq-rw", "--wait", "0s")
	must(t, exitUsage, "acquire", "cli/x", "--limit", "2", "--shared")
}
