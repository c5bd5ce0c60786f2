package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/coordinatord/coordinatord/client"
)

const execSynopsis = "NAME [--ttl D] [--wait D] [--owner S] [--lock-delay D] [--max-hold D] [--grace D] -- COMMAND [ARGS...]"

// releaseTimeout bounds the release after COMMAND exits.
const releaseTimeout = 5 * time.Second

func cmdExec(e *env, args []string) int {
	fs := e.flagSet(e.name)
	var lf lockFlags
	lf.register(fs)
	grace := fs.Duration("grace", 5*time.Second, "after the lock is lost: how long COMMAND has to exit after SIGTERM before SIGKILL")
	var pos, argv []string
	if i := slices.Index(args, "--"); i >= 0 {
		var code int
		if pos, code = e.parse(fs, args[:i], 1, 1, execSynopsis); code >= 0 {
			return code
		}
		argv = args[i+1:]
	} else { // without "--": flags, NAME, then COMMAND and its arguments
		e.setUsage(fs, execSynopsis)
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return exitOK
			}
			return exitUsage
		}
		if code := e.checkArgs(fs.Args(), 1, -1, execSynopsis); code >= 0 {
			return code
		}
		pos, argv = fs.Args()[:1], fs.Args()[1:]
	}
	if len(argv) == 0 {
		fmt.Fprintf(e.stderr, "%s: no COMMAND\nUsage: %s %s\n", e.name, e.name, execSynopsis)
		return exitUsage
	}
	if *grace < 0 {
		fmt.Fprintf(e.stderr, "%s: --grace %v: want a duration >= 0\n", e.name, *grace)
		return exitUsage
	}
	conn, code := e.connect()
	if code >= 0 {
		return code
	}
	defer conn.Close()
	c := client.New(conn)
	defer c.Close()

	// Acquire, until Ctrl-C (or --wait + --timeout).
	opts := []client.AcquireOption{client.WithOwner(lf.owner)}
	if lf.ttl != 0 {
		opts = append(opts, client.WithTTL(lf.ttl))
	}
	if lf.lockDelay != 0 {
		opts = append(opts, client.WithLockDelay(lf.lockDelay))
	}
	if lf.maxHold != 0 {
		opts = append(opts, client.WithMaxHold(lf.maxHold))
	}
	ctx, stopSignals := signalContext()
	actx, cancel := context.WithCancel(ctx)
	if lf.wait.set {
		opts = append(opts, client.WithWait(lf.wait.d))
		cancel()
		actx, cancel = context.WithTimeout(ctx, max(lf.wait.d, 0)+e.conn.timeout)
	}
	if err := e.waitReady(actx, conn); err != nil {
		cancel()
		stopSignals()
		return e.fail(err)
	}
	lock, err := c.Acquire(actx, pos[0], opts...)
	cancel()
	if err != nil {
		stopSignals()
		return e.fail(err)
	}

	// From here on, SIGINT, SIGTERM and SIGHUP go to COMMAND. Catch them
	// before the acquisition's handler lets go, so none is missed.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	interrupted := ctx.Err() != nil // a signal between the grant and signal.Notify
	stopSignals()
	if interrupted {
		e.release(lock)
		fmt.Fprintf(e.stderr, "%s: interrupted before COMMAND started; the lock was released\n", e.name)
		return exitError
	}
	if err := lock.Err(); err != nil { // a long confirmation, a pause: lost before COMMAND starts
		fmt.Fprintf(e.stderr, "%s: the lock %q was lost before COMMAND started: %v\n", e.name, lock.Name(), field(err.Error()))
		return exitLost
	}

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(),
		"COORDINATOR_LOCK="+lock.Name(),
		"COORDINATOR_TOKEN="+strconv.FormatInt(lock.Token(), 10),
		"COORDINATOR_SAFE_UNTIL="+lock.SafeUntil().UTC().Format(time.RFC3339Nano),
	)
	cmd.Stdout, cmd.Stderr = e.stdout, e.stderr
	if fi, err := os.Stdin.Stat(); err == nil && fi.Mode()&os.ModeCharDevice == 0 {
		cmd.Stdin = os.Stdin // a pipe or a file; a terminal would stop the process group (SIGTTIN)
	}
	// Its own process group: a lost lock stops every process COMMAND started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		e.release(lock)
		fmt.Fprintf(e.stderr, "%s: %v\n", e.name, err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return 127
		}
		return 126
	}
	pgid := cmd.Process.Pid
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()

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
				e.reapGroup(pgid, killTimer)
				return exitLost
			}
			if lock.Err() != nil { // lost in the same instant: the command may have worked unprotected
				fmt.Fprintf(e.stderr, "%s: the lock %q was lost as COMMAND exited: %v\n", e.name, lock.Name(), field(lock.Err().Error()))
				return exitLost
			}
			e.release(lock)
			return childExitCode(err)
		case s := <-sigs:
			_ = syscall.Kill(-pgid, s.(syscall.Signal))
		case <-lost:
			lostErr = lock.Err()
			lost = nil
			fmt.Fprintf(e.stderr, "%s: the lock %q (token %d) was lost: %v; sending SIGTERM to COMMAND, SIGKILL in %v\n",
				e.name, lock.Name(), lock.Token(), field(lostErr.Error()), *grace)
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			killTimer = time.After(*grace)
		case <-killTimer:
			fmt.Fprintf(e.stderr, "%s: COMMAND still running %v after SIGTERM: SIGKILL\n", e.name, *grace)
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
