package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/coordinatord/coordinatord/client"
)

// Duration flags go through parseDuration: the flag package's own
// (DurationVar) answers "--ttl 10" with "parse error", which does not say
// that a unit is missing. Their usage names the value `duration`, which
// -help shows after the flag (the flag package shows "value" for a flag
// type of its caller's otherwise).

// parseDuration is time.ParseDuration with an error that says what to
// write instead.
func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err == nil {
		return d, nil
	}
	if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
		return 0, fmt.Errorf("missing unit in duration %q: write %ss for seconds (units: ms, s, m, h)", s, s)
	}
	return 0, fmt.Errorf("%q is not a duration: write it as 30s, 1m30s or 500ms", s)
}

// durationValue is a duration flag read by parseDuration.
type durationValue time.Duration

// durationVar defines a duration flag, as fs.DurationVar does.
func durationVar(fs *flag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var((*durationValue)(p), name, usage)
}

func (d *durationValue) String() string {
	if d == nil {
		return ""
	}
	return time.Duration(*d).String()
}

func (d *durationValue) Set(s string) error {
	v, err := parseDuration(s)
	if err != nil {
		return err
	}
	*d = durationValue(v)
	return nil
}

// optDuration is a duration flag that knows whether it was set.
type optDuration struct {
	d   time.Duration
	set bool
}

func (o *optDuration) String() string {
	if o == nil || !o.set {
		return ""
	}
	return o.d.String()
}

func (o *optDuration) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	o.d, o.set = d, true
	return nil
}

// lockFlags are the flags of acquire and exec.
type lockFlags struct {
	ttl       time.Duration
	wait      optDuration
	owner     string
	lockDelay time.Duration
	maxHold   time.Duration
}

func (l *lockFlags) register(fs *flag.FlagSet) {
	durationVar(fs, &l.ttl, "ttl", 0, "the lease's TTL, a `duration` of whole seconds (default: the server's, 15s out of the box)")
	fs.Var(&l.wait, "wait", "the `duration` to wait in the queue; 0s: try once (default: until Ctrl-C, at most the server's -max-wait)")
	fs.StringVar(&l.owner, "owner", defaultOwner(), "who holds the lock, shown by describe and list")
	durationVar(fs, &l.lockDelay, "lock-delay", 0, "keep the lock from everyone for this `duration` if this grant ends without a release (expiry, force-release)")
	durationVar(fs, &l.maxHold, "max-hold", 0, "refuse renewals past acquisition + this `duration` (default: the server's -max-hold)")
}

// shapeFlags are --limit and --shared, of acquire and exec: a semaphore's
// permit or a read-write lock's reader instead of a mutex.
type shapeFlags struct {
	limit  int
	shared bool
}

// register adds the flags; permit and reader end their help (what the
// command does with a permit, and as a reader).
func (s *shapeFlags) register(fs *flag.FlagSet, permit, reader string) {
	fs.IntVar(&s.limit, "limit", 0, "NAME is a semaphore of this many permits: "+permit)
	fs.BoolVar(&s.shared, "shared", false, "NAME is a read-write lock: "+reader)
}

// check refuses --limit N with --shared (a usage error, exitUsage); -1
// when the command goes on.
func (s *shapeFlags) check(e *env) int {
	if s.limit > 1 && s.shared {
		fmt.Fprintf(e.stderr, "%s: --limit %d with --shared: a semaphore's permits are all alike; use one or the other\n", e.name, s.limit)
		return exitUsage
	}
	return -1
}

// semaphore reports whether the flags ask for a semaphore's permit.
func (s *shapeFlags) semaphore() bool { return s.limit > 1 }

// options are the flags as the SDK's acquire options. A --limit out of
// int32's range is sent clamped, for the server to refuse by name.
func (s *shapeFlags) options() []client.AcquireOption {
	var opts []client.AcquireOption
	if s.limit != 0 {
		opts = append(opts, client.WithLimit(int32(min(max(s.limit, -1), 1<<30))))
	}
	if s.shared {
		opts = append(opts, client.WithShared())
	}
	return opts
}

// options are the flags as the SDK's acquire options (unset flags: the
// server's defaults).
func (l *lockFlags) options() []client.AcquireOption {
	opts := []client.AcquireOption{client.WithOwner(l.owner)}
	if l.ttl != 0 {
		opts = append(opts, client.WithTTL(l.ttl))
	}
	if l.lockDelay != 0 {
		opts = append(opts, client.WithLockDelay(l.lockDelay))
	}
	if l.maxHold != 0 {
		opts = append(opts, client.WithMaxHold(l.maxHold))
	}
	if l.wait.set {
		opts = append(opts, client.WithWait(l.wait.d))
	}
	return opts
}

func defaultOwner() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("coordctl@%s pid %d", host, os.Getpid())
}

// signalContext is cancelled by SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

func parseToken(e *env, s string) (int64, int) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		fmt.Fprintf(e.stderr, "%s: TOKEN %q: want a positive integer\n", e.name, s)
		return 0, exitUsage
	}
	return n, -1
}

// nameToken is the NAME TOKEN of validate and force-release.
type nameToken struct {
	name     string
	token    int64
	tokenArg string // TOKEN as given, as validate's table shows it
}

func (n *nameToken) parse(e *env, pos []string) int {
	n.name, n.tokenArg = pos[0], pos[1]
	var code int
	n.token, code = parseToken(e, pos[1])
	return code
}

// optional is pos[0], or "" when there is none.
func optional(pos []string) string {
	if len(pos) == 0 {
		return ""
	}
	return pos[0]
}
