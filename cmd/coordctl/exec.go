package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/coordinatord/coordinatord/client"
)

const execSynopsis = "NAME [--ttl D] [--wait D] [--owner S] [--lock-delay D] [--max-hold D] [--limit N | --shared] [--grace D] -- COMMAND [ARGS...]"

// releaseTimeout bounds the release after COMMAND exits.
const releaseTimeout = 5 * time.Second

// execLine is the command line of exec.
type execLine struct {
	name  string
	argv  []string // COMMAND and its arguments
	lock  lockFlags
	grace time.Duration
	shape shapeFlags
}

func (l *execLine) register(fs *flag.FlagSet) {
	l.lock.register(fs)
	l.shape.register(fs, "run COMMAND while holding one (COORDINATOR_SLOT says which)", "run COMMAND as one of its readers (without it: as its writer)")
	durationVar(fs, &l.grace, "grace", 5*time.Second, "after the lock is lost: the `duration` COMMAND has to exit after SIGTERM before SIGKILL")
}

// parse takes NAME, then COMMAND and its arguments.
func (l *execLine) parse(e *env, pos []string) int {
	l.name, l.argv = pos[0], pos[1:]
	if len(l.argv) == 0 {
		fmt.Fprintf(e.stderr, "%s: no COMMAND\nUsage: %s %s\n", e.name, e.name, execSynopsis)
		return exitUsage
	}
	if l.grace < 0 {
		fmt.Fprintf(e.stderr, "%s: --grace %v: want a duration >= 0\n", e.name, l.grace)
		return exitUsage
	}
	return l.shape.check(e)
}

// options are the acquire options of the command line.
func (l *execLine) options() []client.AcquireOption {
	return append(l.lock.options(), l.shape.options()...)
}

// runExec runs COMMAND under the lock in three steps: acquire it, supervise
// COMMAND while the SDK renews the lock, release it when COMMAND exits. The
// answer is coordctl's exit code.
func runExec(x *call[execLine]) (int, error) {
	lock, sigs, err := acquireForExec(x)
	if err != nil {
		return 0, err
	}
	if lock == nil { // interrupted, or lost before COMMAND started
		return sigs.code, nil
	}
	defer signal.Stop(sigs.c)
	end := supervise(x, lock, sigs.c)
	if end.release {
		x.release(lock)
	}
	if end.startErr != nil {
		fmt.Fprintf(x.stderr, "%s: %v\n", x.name, end.startErr)
	}
	return end.code, nil
}

// ending is how supervise ended: coordctl's exit code, whether the lock is
// still held and must be released (COMMAND exited, or never started), and
// why COMMAND did not start.
type ending struct {
	code     int
	release  bool
	startErr error
}

// handover is what acquireForExec hands to supervise: the signals caught
// for COMMAND, or the exit code when COMMAND must not start.
type handover struct {
	c    chan os.Signal
	code int
}

// acquireForExec acquires the lock until Ctrl-C (or --wait + --timeout),
// then catches SIGINT, SIGTERM and SIGHUP for COMMAND before the
// acquisition's handler lets go, so that none is missed. A nil lock means
// COMMAND must not start; the handover's code says how coordctl exits.
func acquireForExec(x *call[execLine]) (*client.Lock, handover, error) {
	ctx, stopSignals := signalContext()
	defer stopSignals()
	actx, cancel := context.WithCancel(ctx)
	if x.f.lock.wait.set {
		cancel()
		actx, cancel = x.boundedBy(ctx, max(x.f.lock.wait.d, 0))
	}
	defer cancel()
	if err := x.waitReady(actx, x.cc); err != nil {
		return nil, handover{}, err
	}
	lock, err := x.c.Acquire(actx, x.f.name, x.f.options()...)
	if err != nil {
		return nil, handover{}, err
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	if ctx.Err() != nil { // a signal between the grant and signal.Notify
		signal.Stop(sigs)
		x.release(lock)
		fmt.Fprintf(x.stderr, "%s: interrupted before COMMAND started; the lock was released\n", x.name)
		return nil, handover{code: exitError}, nil
	}
	if err := lock.Err(); err != nil { // a long confirmation, a pause: lost before COMMAND starts
		signal.Stop(sigs)
		fmt.Fprintf(x.stderr, "%s: the lock %q was lost before COMMAND started: %v\n", x.name, lock.Name(), field(err.Error()))
		return nil, handover{code: exitLost}, nil
	}
	return lock, handover{c: sigs}, nil
}

// startCommand starts COMMAND in its own process group with the lock in
// its environment.
func startCommand(x *call[execLine], lock *client.Lock) (*exec.Cmd, error) {
	argv := x.f.argv
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(),
		"COORDINATOR_LOCK="+lock.Name(),
		"COORDINATOR_TOKEN="+strconv.FormatInt(lock.Token(), 10),
		"COORDINATOR_SLOT="+strconv.Itoa(int(lock.Slot())),
		"COORDINATOR_SAFE_UNTIL="+lock.SafeUntil().UTC().Format(time.RFC3339Nano),
	)
	cmd.Stdout, cmd.Stderr = x.stdout, x.stderr
	if fi, err := os.Stdin.Stat(); err == nil && fi.Mode()&os.ModeCharDevice == 0 {
		cmd.Stdin = os.Stdin // a pipe or a file; a terminal would stop the process group (SIGTTIN)
	}
	// Its own process group: a lost lock stops every process COMMAND started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, cmd.Start()
}

// supervise starts COMMAND, forwards sigs to its process group, and
// terminates the group if the lock is lost (SIGTERM, then SIGKILL after
// --grace), until COMMAND exits.
func supervise(x *call[execLine], lock *client.Lock, sigs <-chan os.Signal) ending {
	cmd, err := startCommand(x, lock)
	if err != nil {
		code := 126 // found, but not runnable
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = 127
		}
		return ending{code: code, release: true, startErr: err}
	}
	pgid := cmd.Process.Pid
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()

	grace := x.f.grace
	lost := lock.Done()
	var (
		killTimer <-chan time.Time
		lostErr   error
	)
	// Done checks the clock itself when called: poll it, so the loss is
	// seen at once after this process was paused (SIGSTOP) or starved.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-waited:
			if lostErr != nil {
				// COMMAND's leader is gone; give the rest of its group
				// what remains of the grace, then kill it.
				x.reapGroup(pgid, killTimer)
				return ending{code: exitLost}
			}
			if lock.Err() != nil { // lost in the same instant: the command may have worked unprotected
				fmt.Fprintf(x.stderr, "%s: the lock %q was lost as COMMAND exited: %v\n", x.name, lock.Name(), field(lock.Err().Error()))
				return ending{code: exitLost}
			}
			return ending{code: childExitCode(err), release: true}
		case s := <-sigs:
			_ = syscall.Kill(-pgid, s.(syscall.Signal))
		case <-lost:
			lostErr = lock.Err()
			lost = nil
			fmt.Fprintf(x.stderr, "%s: the lock %q (token %d) was lost: %v; sending SIGTERM to COMMAND, SIGKILL in %v\n",
				x.name, lock.Name(), lock.Token(), field(lostErr.Error()), grace)
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			killTimer = time.After(grace)
		case <-killTimer:
			fmt.Fprintf(x.stderr, "%s: COMMAND still running %v after SIGTERM: SIGKILL\n", x.name, grace)
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			killTimer = nil
		case <-tick.C:
			if lost != nil {
				lost = lock.Done()
			}
		}
	}
}

// reapGroup waits for COMMAND's process group to empty until killTimer
// fires, then kills what is left.
func (e *env) reapGroup(pgid int, killTimer <-chan time.Time) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for killTimer != nil {
		if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		select {
		case <-killTimer:
			killTimer = nil
		case <-tick.C:
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// release gives the lock up after COMMAND exits; a failure is reported
// (the lock then ends with its TTL) but does not change the exit code.
func (e *env) release(lock *client.Lock) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := lock.Release(ctx); err != nil {
		fmt.Fprintf(e.stderr, "%s: release %q: %v (the lock ends with its TTL)\n", e.name, lock.Name(), field(err.Error()))
	}
}

// childExitCode is COMMAND's exit code, or 128+N if signal N killed it.
func childExitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return exitError
}
