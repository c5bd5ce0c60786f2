package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordinatord/coordinatord/client"
	"github.com/coordinatord/coordinatord/internal/version"
)

// commands is coordctl's table: every command, in the order of the help.
// Each entry says how its command line reads and which SDK calls it makes
// (run), then how it shows the answer (print, in print.go and below).
var commands = []command{
	{name: "acquire", spec: spec[acquireLine, client.Grant]{
		synopsis: "NAME [--ttl D] [--wait D] [--owner S] [--lock-delay D] [--max-hold D] [--limit N | --shared] [--session]", extraHelp: sessionHelp,
		examples: "  coordctl acquire reports/nightly --ttl 30s --owner host-a\n  coordctl -o json acquire reports/nightly --wait 0s\n  coordctl acquire db/migrations --limit 2\n  COORDCTL_SESSION=$SESSION coordctl acquire reports/nightly --session\n",
		minArgs:  1, maxArgs: 1,
		flags: func(fs *flag.FlagSet, f *acquireLine) {
			f.lock.register(fs)
			f.shape.register(fs, "hold one (its SLOT is printed; tokens rise per slot)", "hold it as one of its readers (without it: as its writer)")
			f.session.register(fs)
		},
		args: func(e *env, pos []string, f *acquireLine) int {
			f.name = pos[0]
			if code := f.shape.check(e); code != -1 {
				return code
			}
			if !f.session.wanted() {
				return -1
			}
			return f.session.resolve(e, "NAME --session [--session-file FILE]")
		},
		run:   runAcquire,
		print: printGrant,
	}},
	{name: "release", spec: spec[grantLine, bool]{
		synopsis: grantSynopsis, extraHelp: handleHelp,
		examples: "  coordctl release reports/nightly 2 --handle-file nightly.handle\n  COORDCTL_HANDLE=$HANDLE coordctl release reports/nightly 2\n  printf '%s' \"$HANDLE\" | coordctl release reports/nightly 2 --handle-file -\n",
		minArgs:  2, maxArgs: 3,
		flags: func(fs *flag.FlagSet, f *grantLine) { f.register(fs) },
		args:  func(e *env, pos []string, f *grantLine) int { return f.parse(e, pos) },
		run: func(x *call[grantLine]) (bool, error) {
			ctx, cancel := x.bounded()
			defer cancel()
			return x.c.Release(ctx, x.f.ref)
		},
		print: func(x *call[grantLine], released bool) int {
			return x.printReleased(x.f.ref.Name, x.f.ref.Token, released)
		},
	}},
	{name: "keepalive", spec: spec[grantLine, client.Renewal]{
		synopsis: grantSynopsis, extraHelp: handleHelp,
		examples: "  coordctl keepalive reports/nightly 2 --handle-file nightly.handle\n  COORDCTL_HANDLE=$HANDLE coordctl keepalive reports/nightly 2\n",
		minArgs:  2, maxArgs: 3,
		flags: func(fs *flag.FlagSet, f *grantLine) { f.register(fs) },
		args:  func(e *env, pos []string, f *grantLine) int { return f.parse(e, pos) },
		run: func(x *call[grantLine]) (client.Renewal, error) {
			ctx, cancel := x.bounded()
			defer cancel()
			return x.c.KeepAlive(ctx, x.f.ref)
		},
		print: printRenewal,
	}},
	{name: "validate", spec: spec[validateLine, client.Verdict]{
		synopsis: "NAME TOKEN [--resource R]",
		examples: "  coordctl validate reports/nightly 2\n  coordctl -o json validate reports/nightly 2 --resource s3/reports\n",
		minArgs:  2, maxArgs: 2,
		flags: func(fs *flag.FlagSet, f *validateLine) {
			fs.StringVar(&f.resource, "resource", "", "protected resource: also check (and raise) its high-water mark")
		},
		args: func(e *env, pos []string, f *validateLine) int { return f.parse(e, pos) },
		run: func(x *call[validateLine]) (client.Verdict, error) {
			ctx, cancel := x.bounded()
			defer cancel()
			return x.c.ValidateToken(ctx, x.f.name, x.f.token, x.f.resource)
		},
		print: printVerdict,
	}},
	{name: "describe", spec: spec[string, client.Description]{
		synopsis: "NAME",
		examples: "  coordctl describe reports/nightly\n",
		minArgs:  1, maxArgs: 1,
		args: func(_ *env, pos []string, name *string) int { *name = pos[0]; return -1 },
		run: func(x *call[string]) (client.Description, error) {
			ctx, cancel := x.bounded()
			defer cancel()
			return x.c.Describe(ctx, *x.f)
		},
		print: printDescription,
	}},
	{name: "list", spec: spec[string, []client.Holder]{
		synopsis: "[PREFIX]",
		examples: "  coordctl list\n  coordctl -o json list reports/\n",
		minArgs:  0, maxArgs: 1,
		args:  func(_ *env, pos []string, prefix *string) int { *prefix = optional(pos); return -1 },
		run:   func(x *call[string]) ([]client.Holder, error) { return listHolders(x, *x.f) },
		print: printHolders,
	}},
	{name: "watch", spec: spec[watchLine, watchStream]{
		synopsis: "NAME [--count N] [--start-revision REV]",
		examples: "  coordctl watch reports/nightly\n  coordctl -o json watch reports/nightly --start-revision 42\n",
		minArgs:  1, maxArgs: 1,
		flags: func(fs *flag.FlagSet, f *watchLine) {
			fs.IntVar(&f.count, "count", 0, "stop after this many events, the current state included (0: until Ctrl-C)")
			fs.Int64Var(&f.from, "start-revision", 0, "resume from this revision (the last one seen + 1); 0: start with the current state")
		},
		args:  func(_ *env, pos []string, f *watchLine) int { f.name = pos[0]; return -1 },
		run:   runWatch,
		print: printWatch,
	}},
	{name: "force-release", spec: spec[nameToken, bool]{
		synopsis: "NAME TOKEN",
		examples: "  coordctl force-release reports/nightly 2\n",
		minArgs:  2, maxArgs: 2,
		args: func(e *env, pos []string, f *nameToken) int { return f.parse(e, pos) },
		run: func(x *call[nameToken]) (bool, error) {
			ctx, cancel := x.bounded()
			defer cancel()
			return x.c.ForceRelease(ctx, x.f.name, x.f.token)
		},
		print: func(x *call[nameToken], released bool) int { return x.printReleased(x.f.name, x.f.token, released) },
	}},
	{name: "exec", spec: spec[execLine, int]{
		synopsis: execSynopsis,
		examples: "  coordctl exec jobs/backup --ttl 10s -- ./backup.sh\n  coordctl exec jobs/backup --wait 0s --grace 30s -- sh -c 'backup --fence-token \"$COORDINATOR_TOKEN\"'\n",
		minArgs:  1, trailing: true,
		flags: func(fs *flag.FlagSet, f *execLine) { f.register(fs) },
		args:  func(e *env, pos []string, f *execLine) int { return f.parse(e, pos) },
		run:   runExec,
		print: func(_ *call[execLine], code int) int { return code },
	}},
	{name: "session open", spec: spec[sessionOpenLine, *client.Session]{
		synopsis: "[--ttl D] [--owner S]", extraHelp: sessionHelp,
		examples: "  SESSION=$(coordctl -o json session open --ttl 30s | jq -r .handle)\n",
		minArgs:  0, maxArgs: 0,
		flags: func(fs *flag.FlagSet, f *sessionOpenLine) {
			fs.Var(&f.ttl, "ttl", "the session lease's TTL, a `duration` of whole seconds (default: the server's)")
			fs.StringVar(&f.owner, "owner", defaultOwner(), "who holds the session's locks, shown by describe and list")
		},
		run: runSessionOpen, print: printSession,
	}},
	{name: "session keepalive", spec: spec[sessionLine, sessionRenewal]{
		synopsis: "[--session-file FILE]", extraHelp: sessionHelp,
		examples: "  COORDCTL_SESSION=$SESSION coordctl session keepalive\n  coordctl session keepalive --session-file session.handle\n",
		minArgs:  0, maxArgs: 0,
		flags: func(fs *flag.FlagSet, f *sessionLine) { f.register(fs) },
		args:  func(e *env, _ []string, f *sessionLine) int { return f.resolve(e, "[--session-file FILE]") },
		run:   runSessionKeepAlive, print: printSessionRenewal,
	}},
	{name: "session close", spec: spec[sessionLine, sessionEnd]{
		synopsis: "[--session-file FILE]", extraHelp: sessionHelp,
		examples: "  COORDCTL_SESSION=$SESSION coordctl session close\n",
		minArgs:  0, maxArgs: 0,
		flags: func(fs *flag.FlagSet, f *sessionLine) { f.register(fs) },
		args:  func(e *env, _ []string, f *sessionLine) int { return f.resolve(e, "[--session-file FILE]") },
		run:   runSessionClose, print: printSessionEnd,
	}},
	{name: "marks list", spec: spec[string, []client.Mark]{
		synopsis: "[PREFIX]",
		examples: "  coordctl marks list s3/\n  coordctl -o json marks list\n",
		minArgs:  0, maxArgs: 1,
		args:  func(_ *env, pos []string, prefix *string) int { *prefix = optional(pos); return -1 },
		run:   listMarks,
		print: printMarks[string],
	}},
	{name: "marks get", spec: spec[markLine, client.Mark]{
		synopsis: "RESOURCE [--slot K]",
		examples: "  coordctl marks get s3/reports\n  coordctl marks get s3/reports --slot 1\n",
		minArgs:  1, maxArgs: 1,
		flags: func(fs *flag.FlagSet, f *markLine) { f.register(fs) },
		args:  func(_ *env, pos []string, f *markLine) int { f.resource = pos[0]; return -1 },
		run: func(x *call[markLine]) (client.Mark, error) {
			ctx, cancel := x.bounded()
			defer cancel()
			return x.c.GetMark(ctx, x.f.resource, x.f.options()...)
		},
		print: printMark[markLine],
	}},
	{name: "marks delete", spec: spec[markLine, client.Mark]{
		synopsis: "RESOURCE [--slot K]",
		examples: "  coordctl marks delete s3/retired-bucket\n",
		minArgs:  1, maxArgs: 1,
		flags: func(fs *flag.FlagSet, f *markLine) { f.register(fs) },
		args:  func(_ *env, pos []string, f *markLine) int { f.resource = pos[0]; return -1 },
		run: func(x *call[markLine]) (client.Mark, error) {
			ctx, cancel := x.bounded()
			defer cancel()
			return x.c.DeleteMark(ctx, x.f.resource, x.f.options()...)
		},
		print: printMark[markLine],
	}},
	{name: "marks rebind", spec: spec[markLine, client.Mark]{
		synopsis: "RESOURCE LOCK [--slot K]",
		examples: "  coordctl marks rebind s3/reports jobs/reports-v2\n",
		minArgs:  2, maxArgs: 2,
		flags: func(fs *flag.FlagSet, f *markLine) { f.register(fs) },
		args:  func(_ *env, pos []string, f *markLine) int { f.resource, f.lock = pos[0], pos[1]; return -1 },
		run: func(x *call[markLine]) (client.Mark, error) {
			ctx, cancel := x.bounded()
			defer cancel()
			return x.c.RebindMark(ctx, x.f.resource, x.f.lock, x.f.options()...)
		},
		print: printMark[markLine],
	}},
	{name: "epoch", spec: spec[struct{}, client.Epoch]{
		synopsis: "[-o json]", extraHelp: epochHelp,
		examples: "  coordctl epoch\n  coordctl -o json epoch\n",
		minArgs:  0, maxArgs: 0,
		run:   runEpoch,
		print: printEpoch,
	}},
	{name: "restore-plan", spec: spec[restorePlanLine, restorePlan]{
		synopsis: "SNAPSHOT [--last-revision N] [--margin N]", extraHelp: restorePlanHelp,
		examples: "  coordctl restore-plan backup.db --last-revision 1843221\n  coordctl -o json restore-plan backup.db\n",
		minArgs:  1, maxArgs: 1,
		local: true,
		flags: restorePlanFlags,
		args:  func(_ *env, pos []string, f *restorePlanLine) int { f.snapshot = pos[0]; return -1 },
		run:   runRestorePlan,
		print: printRestorePlan,
	}},
	{name: "hit", spec: spec[hitLine, client.HitResult]{
		synopsis: "NAME --limit N --window D [--hits K] [--token-bucket] [--fail-open] [--request-id ID]",
		examples: "  coordctl hit api/customer-42 --limit 100 --window 1m\n  coordctl -o json hit emails/user-7 --limit 3 --window 1h --hits 0\n",
		minArgs:  1, maxArgs: 1,
		flags: func(fs *flag.FlagSet, f *hitLine) { f.register(fs) },
		args:  func(_ *env, pos []string, f *hitLine) int { f.name = pos[0]; return -1 },
		run:   runHit,
		print: printHit,
	}},
	{name: "counter get", spec: spec[string, client.CounterState]{
		synopsis: "NAME",
		examples: "  coordctl counter get api/customer-42\n",
		minArgs:  1, maxArgs: 1,
		args: func(_ *env, pos []string, n *string) int { *n = pos[0]; return -1 },
		run: func(x *call[string]) (client.CounterState, error) {
			ctx, cancel := x.bounded()
			defer cancel()
			return x.c.Counter(ctx, *x.f)
		},
		print: printCounter,
	}},
	{name: "counter reset", spec: spec[string, bool]{
		synopsis: "NAME",
		examples: "  coordctl counter reset api/customer-42\n",
		minArgs:  1, maxArgs: 1,
		args: func(_ *env, pos []string, n *string) int { *n = pos[0]; return -1 },
		run: func(x *call[string]) (bool, error) {
			ctx, cancel := x.bounded()
			defer cancel()
			return x.c.ResetCounter(ctx, *x.f)
		},
		print: printCounterReset,
	}},
	// The API has no call that names the server's build, so version is
	// coordctl's own; the server's is its coordinatord_build_info metric.
	{name: "version", spec: spec[struct{}, version.Info]{
		synopsis: "[-o json]",
		examples: "  coordctl version\n  coordctl -o json version\n",
		minArgs:  0, maxArgs: 0,
		local: true,
		run:   func(*call[struct{}]) (version.Info, error) { return version.Get(), nil },
		print: printVersion,
	}},
	// The completion script's source of lock names (not in the help).
	{name: "__names", hidden: true, spec: spec[string, []client.Holder]{
		synopsis: "[PREFIX]",
		minArgs:  0, maxArgs: 1,
		args:  func(_ *env, pos []string, prefix *string) int { *prefix = optional(pos); return -1 },
		run:   func(x *call[string]) ([]client.Holder, error) { return listHolders(x, *x.f) },
		print: printNames,
	}},
}

// lookup finds the command named by args ("list", or a group's "marks
// get"), nil if there is none.
func lookup(args []string) *command {
	if len(args) == 0 {
		return nil
	}
	name := strings.Join(args, " ")
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

// isGroup reports whether word starts command names of two words
// (session, marks).
func isGroup(word string) bool {
	for _, c := range commands {
		if g, _, ok := strings.Cut(c.name, " "); ok && g == word {
			return true
		}
	}
	return false
}

// acquireLine is the command line of acquire.
type acquireLine struct {
	name    string
	lock    lockFlags
	shape   shapeFlags
	session sessionFlags
}

// runAcquire acquires the lock once, with nothing to renew it: the grant
// is printed for a script to keep alive or release. Without --wait it waits
// until Ctrl-C, after --timeout for the connection; with --wait, for
// --wait + --timeout. The SDK sends one request id with every retry, so a
// retry never makes a second grant.
func runAcquire(x *call[acquireLine]) (client.Grant, error) {
	ctx := x.interruptible()
	if x.f.lock.wait.set {
		var cancel context.CancelFunc
		ctx, cancel = x.boundedBy(ctx, max(x.f.lock.wait.d, 0))
		defer cancel()
	} else if err := x.waitReady(ctx, x.cc); err != nil {
		return client.Grant{}, err
	}
	var g client.Grant
	var err error
	opts := append(x.f.lock.options(), x.f.shape.options()...)
	if x.f.session.wanted() {
		g, err = x.c.ResumeSession(x.f.session.handle).Acquire(ctx, x.f.name, opts...)
	} else {
		g, err = x.c.AcquireGrant(ctx, x.f.name, opts...)
	}
	if held := (*client.HeldError)(nil); errors.As(err, &held) {
		err = held.Unwrap() // the server's ABORTED, as acquire has always shown it
	}
	return g, err
}

// validateLine is the command line of validate.
type validateLine struct {
	nameToken
	resource string
}

// listHolders returns the held locks whose names start with prefix, every
// page of them, each page bounded by --timeout.
func listHolders[F any](x *call[F], prefix string) ([]client.Holder, error) {
	return allPages(x, x.c.Pages(prefix, client.WithPageSize(1000)))
}

// pager is what the SDK's pagers (Pager, MarkPager) have in common.
type pager[T any] interface {
	More() bool
	Next(ctx context.Context) ([]T, error)
}

// allPages reads every page of p, each bounded by --timeout.
func allPages[T, F any](x *call[F], p pager[T]) ([]T, error) {
	all := []T{}
	for p.More() {
		ctx, cancel := x.bounded()
		page, err := p.Next(ctx)
		cancel()
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
	}
	return all, nil
}

// watchLine is the command line of watch.
type watchLine struct {
	name  string
	count int
	from  int64
}

// watchStream is an open watch, until Ctrl-C.
type watchStream struct {
	ctx context.Context
	w   *client.Watcher
}

func runWatch(x *call[watchLine]) (watchStream, error) {
	ctx := x.interruptible()
	w, err := x.c.Watch(ctx, x.f.name, client.WithStartRevision(x.f.from))
	if err != nil {
		return watchStream{}, err
	}
	x.after = append(x.after, w.Close)
	return watchStream{ctx, w}, nil
}

// printWatch prints each event as it comes, until --count events or
// Ctrl-C.
func printWatch(x *call[watchLine], s watchStream) int {
	if x.output == "table" {
		fmt.Fprintf(x.stdout, "%-10s  %-15s  %-10s  %s\n", "REVISION", "EVENT", "TOKEN", "OWNER")
	}
	for n := 0; x.f.count == 0 || n < x.f.count; n++ {
		ev, err := s.w.Next()
		if err != nil {
			if s.ctx.Err() != nil { // Ctrl-C
				return exitOK
			}
			if errors.Is(err, client.ErrWatchEnded) {
				err = status.Error(codes.Unavailable, "the watch stream ended: the coordinator is shutting down; watch again with --start-revision")
			}
			return x.fail(err)
		}
		x.printEvent(x.f.name, ev)
	}
	return exitOK
}

// printNames prints the names for the completion script, each followed by
// a NUL byte, the one byte no shell word can hold (a name holding one is
// left out: no command line could pass it).
func printNames(x *call[string], holders []client.Holder) int {
	var b strings.Builder
	for _, h := range holders {
		if !strings.Contains(h.Name, "\x00") {
			b.WriteString(h.Name + "\x00")
		}
	}
	fmt.Fprint(x.stdout, b.String())
	return exitOK
}
