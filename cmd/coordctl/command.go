package main

import (
	"context"
	"flag"
	"slices"
	"time"

	"google.golang.org/grpc"

	"github.com/coordinatord/coordinatord/client"
)

// command is one entry of coordctl's table (commands.go).
type command struct {
	name string
	// hidden commands are left out of "coordctl help NAME" (__names).
	hidden bool
	spec   runner
}

// runner is a spec with its types erased, so that one table holds them all.
type runner interface {
	main(e *env, args []string) int
	synopsisText() string
}

// spec is what a command is: its synopsis and help, its arguments and
// flags, its call through the SDK and how it prints the answer. Every
// command goes through the same steps (main): parse the flags and the
// arguments, check them (args), connect, run, print. F holds the parsed
// command line, R the answer.
type spec[F, R any] struct {
	synopsis  string
	extraHelp string // printed by -help after the flags
	examples  string // printed by -help, each line "  coordctl ..."
	// minArgs and maxArgs bound the positional arguments (maxArgs < 0: no
	// limit).
	minArgs, maxArgs int
	// trailing: a COMMAND and its arguments end the line, after "--" or,
	// without it, after the minArgs arguments (exec).
	trailing bool
	// flags registers the command's own flags into f (nil: none).
	flags func(fs *flag.FlagSet, f *F)
	// args checks the positional arguments and stores them in f; it prints
	// what is wrong and returns an exit code, -1 when the command goes on.
	args func(e *env, pos []string, f *F) int
	// run makes the command's calls through the SDK.
	run func(x *call[F]) (R, error)
	// print shows run's answer and returns the exit code (nil: exitOK).
	print func(x *call[F], r R) int
	// local: the command asks no coordinator (version); main neither
	// connects nor builds a client, and run's call has neither.
	local bool
}

// call is one invocation of a command: the parsed command line and the
// connection (none for a local command), for run and print.
type call[F any] struct {
	*env
	f     *F
	cc    *grpc.ClientConn // for waitReady
	c     *client.Client
	after []func() // run when the command ends, last first
}

func (s spec[F, R]) synopsisText() string { return s.synopsis }

func (s spec[F, R]) main(e *env, args []string) int {
	fs := e.flagSet(e.name)
	f := new(F)
	if s.flags != nil {
		s.flags(fs, f)
	}
	e.setUsage(fs, s.synopsis, s.extraHelp, s.examples)
	pos, code := s.parse(e, fs, args)
	if code >= 0 {
		return code
	}
	if s.args != nil {
		if code := s.args(e, pos, f); code >= 0 {
			return code
		}
	}
	x := &call[F]{env: e, f: f}
	if !s.local {
		conn, code := e.connect()
		if code >= 0 {
			return code
		}
		defer conn.Close()
		x.cc, x.c = conn, client.New(conn)
		defer x.c.Close()
	}
	defer x.cleanup()
	r, err := s.run(x)
	if err != nil {
		return e.fail(err)
	}
	if s.print == nil {
		return exitOK
	}
	return s.print(x, r)
}

// parse reads the flags, allowed anywhere among the positional arguments
// until "--"; for a trailing COMMAND, the flags before NAME or before "--".
func (s spec[F, R]) parse(e *env, fs *flag.FlagSet, args []string) ([]string, int) {
	if !s.trailing {
		return e.parse(fs, args, s.minArgs, s.maxArgs, s.synopsis)
	}
	if i := slices.Index(args, "--"); i >= 0 {
		pos, code := e.parse(fs, args[:i], s.minArgs, s.minArgs, s.synopsis)
		if code >= 0 {
			return nil, code
		}
		return append(pos, args[i+1:]...), -1
	}
	if code := e.parseFlags(fs, args); code >= 0 {
		return nil, code
	}
	return fs.Args(), e.checkArgs(fs.Args(), s.minArgs, -1, s.synopsis)
}

// bounded is a context for one call: --timeout, retries included.
func (x *call[F]) bounded() (context.Context, context.CancelFunc) {
	return x.boundedBy(context.Background(), 0)
}

// boundedBy is ctx bounded by --timeout + extra.
func (x *call[F]) boundedBy(ctx context.Context, extra time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, x.conn.timeout+extra)
}

// interruptible is a context that SIGINT or SIGTERM cancel, until the
// command ends.
func (x *call[F]) interruptible() context.Context {
	ctx, stop := signalContext()
	x.after = append(x.after, stop)
	return ctx
}

func (x *call[F]) cleanup() {
	for _, f := range slices.Backward(x.after) {
		f()
	}
}
