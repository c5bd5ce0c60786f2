// Command coordctl is the operator and scripting CLI of coordinatord: it
// acquires, renews, releases, validates, describes, lists and watches locks,
// and runs a command while holding one (exec).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordinatord/coordinatord/client"
)

// Exit codes. exec exits with its command's code instead, except when it
// could not run it (the codes below) or when the lock was lost (exitLost).
const (
	exitOK          = 0
	exitError       = 1 // anything else (the message says what)
	exitUsage       = 2 // bad flags or arguments, or INVALID_ARGUMENT
	exitNotAcquired = 3 // ABORTED: the lock is held by someone else (after --wait)
	exitNotValid    = 4 // validate: not valid; keepalive: NOT_FOUND; release, force-release: released=false
	exitUnavailable = 5 // UNAVAILABLE or the --timeout elapsed: retry later
	exitDenied      = 6 // UNAUTHENTICATED or PERMISSION_DENIED
	exitLost        = 7 // exec: the lock was lost while the command ran; it was terminated
)

const exitCodesHelp = `Exit codes:
  0  ok
  1  other error (the message on stderr says what)
  2  usage error: bad flag or argument, or INVALID_ARGUMENT from the server
  3  not acquired: the lock is held by someone else (ABORTED, after --wait);
     hit: refused, the counter's limit is reached
  4  not valid: validate answered valid=false; keepalive NOT_FOUND (the grant
     is gone); release or force-release changed nothing (released=false)
  5  unavailable: the coordinator did not answer within --timeout (UNAVAILABLE,
     DEADLINE_EXCEEDED)
  6  denied: UNAUTHENTICATED or PERMISSION_DENIED
  7  exec only: the lock was lost while COMMAND ran; COMMAND was sent SIGTERM,
     then SIGKILL after --grace
  exec otherwise exits with COMMAND's exit code (128+N if killed by signal N).
`

const usageText = `coordctl: the command-line client of coordinatord.

Usage:
  coordctl [connection flags] COMMAND [flags] [arguments]
  coordctl --version

Commands:
  acquire NAME [--ttl D] [--wait D] [--owner S] [--lock-delay D]
                                 acquire a lock; print its token, handle and expiry.
                                 Nothing renews it: use keepalive, or exec.
  release NAME TOKEN [HANDLE]    release a grant
  keepalive NAME TOKEN [HANDLE]  renew a grant once, for another full TTL
                                 HANDLE, the grant's secret: best from $COORDCTL_HANDLE or
                                 --handle-file FILE (- : standard input); an argument works,
                                 but ps shows it to every local user and history keeps it
  validate NAME TOKEN [--resource R]
                                 is TOKEN the current holder's (and, with R, not below
                                 the resource's high-water mark, which a valid answer raises)?
  describe NAME                  the holder and the waiters of one lock
  list [PREFIX]                  held locks whose names start with PREFIX
  watch NAME [--count N]         stream a lock's changes until Ctrl-C (or N events)
  force-release NAME TOKEN       end the grant TOKEN of NAME (admins only)
  session open [--ttl D] [--owner S]
                                 open a session, one lease for many locks; print its secret
                                 handle (once: keep it in $COORDCTL_SESSION or a file)
  session keepalive              renew the session of $COORDCTL_SESSION or --session-file FILE
                                 (and every lock held through it); list those locks
  session close                  end the session; release every lock held through it
                                 (acquire NAME --session acquires through the session)
  marks list [PREFIX]            resources' high-water marks (the greatest token validated)
  marks get RESOURCE             one resource's mark and the lock that owns it
  marks delete RESOURCE          delete a resource's mark (admins only)
  marks rebind RESOURCE LOCK     give a resource's mark to another lock (admins only)
  hit NAME --limit N --window D [--hits K] [--token-bucket] [--fail-open]
                                 count K hits (default 1) on a rate-limit counter: allowed
                                 (exit 0) or refused (exit 3), the count, when it resets
  counter get NAME               a counter's count, limit and reset time, without counting
  counter reset NAME             delete a counter: its next hit starts a fresh window
  exec NAME [--ttl D] [--wait D] [--owner S] [--lock-delay D] [--grace D] -- COMMAND [ARGS...]
                                 run COMMAND while holding NAME (renewed in the background);
                                 release it when COMMAND exits; terminate COMMAND if it is lost
  epoch                          the token epoch and floor (admins only; raised by etcd restores)
  restore-plan SNAPSHOT          the etcdutl --bump-revision for restoring an etcd snapshot
  version                        coordctl's version: release, VCS revision, Go toolchain
                                 (coordctl --version prints the same)
  completion bash|zsh|fish       print a completion script for the shell
  help [COMMAND]                 this text, or a command's flags

Every flag may come before or after the command's arguments ("--flag" and "-flag" are the same).
` + connectionHelp + `
Output: tables by default; -o json ($COORDCTL_OUTPUT=json) prints one JSON object (watch: one
per line) for scripts, in protojson's encoding, as grpcurl prints the API's answers:
lowerCamelCase names, int64 values (tokens, revisions) as strings, durations as "30s",
times in RFC 3339 (UTC); zero values are printed too. Errors go to stderr.

exec runs COMMAND in its own process group with, in its environment:
  COORDINATOR_LOCK        the lock name
  COORDINATOR_TOKEN       the fencing token: pass it with every write to a protected resource
  COORDINATOR_SAFE_UNTIL  RFC 3339 time until which the lock was known to be held at start
                          (renewals move it forward; coordctl watches it for COMMAND)
SIGINT, SIGTERM and SIGHUP sent to coordctl are forwarded to COMMAND's process group. If the
lock is lost (the coordinator says so, or its safe-until time passes without a confirmed
renewal: before the lease can expire), COMMAND's process group gets SIGTERM at once and SIGKILL
after --grace, and coordctl exits with 7. COMMAND reads coordctl's standard input, unless that is
a terminal (then none: a background process group reading a terminal would be stopped).

` + exitCodesHelp + `
Examples:
  coordctl acquire reports/nightly --ttl 30s --owner host-a
  coordctl -o json acquire reports/nightly --wait 0s
  COORDCTL_HANDLE=$HANDLE coordctl keepalive reports/nightly 2
  coordctl release reports/nightly 2 --handle-file nightly.handle
  coordctl validate reports/nightly 2 --resource s3/reports
  coordctl list reports/
  coordctl watch reports/nightly
  SESSION=$(coordctl -o json session open --ttl 30s | jq -r .handle)
  coordctl marks list s3/
  coordctl exec reports/nightly --ttl 10s -- ./make-report.sh
  coordctl exec jobs/backup --wait 0s -- sh -c 'backup --fence-token "$COORDINATOR_TOKEN"'
  COORDCTL_ADDR=coord.example:7070 COORDCTL_TLS_CA=ca.pem coordctl describe jobs/backup
  coordctl version
  source <(coordctl completion bash)
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// env is what a command needs: the connection flags, the output format and
// where to write.
type env struct {
	conn   *connFlags
	output string
	stdin  io.Reader // --handle-file -
	stdout io.Writer
	stderr io.Writer
	name   string // the command's name, for messages
	// help prints the full help (-help); shortUsage, after a typo, the
	// synopsis and where the help is.
	help, shortUsage func()
}

func run(args []string, stdout, stderr io.Writer) int {
	e := &env{conn: newConnFlags(stderr), output: envOr("OUTPUT", "table"), stdin: os.Stdin, stdout: stdout, stderr: stderr, name: "coordctl"}
	fs := e.flagSet("coordctl")
	showVersion := fs.Bool("version", false, "print coordctl's version, as the version command does")
	e.setUsage(fs, "", "", "") // the short usage after a bad flag; -help prints usageText
	e.help = func() { fmt.Fprint(stderr, usageText) }
	if code := e.parseFlags(fs, args); code >= 0 {
		return code
	}
	if *showVersion { // what every CLI answers, whatever follows
		e.name = "coordctl version"
		return lookup([]string{"version"}).spec.main(e, nil)
	}
	rest := fs.Args()
	if len(rest) == 0 {
		e.shortUsage()
		return exitUsage
	}
	cmd, rest := rest[0], rest[1:]
	switch cmd {
	case "help":
		if c := lookup(rest); c != nil && !c.hidden {
			e.name = "coordctl " + c.name
			return c.spec.main(e, []string{"-help"})
		}
		if len(rest) == 1 && isGroup(rest[0]) {
			groupUsage(stdout, rest[0])
			return exitOK
		}
		fmt.Fprint(stdout, usageText)
		return exitOK
	case "completion":
		return cmdCompletion(e, rest)
	}
	if isGroup(cmd) {
		if len(rest) == 0 || lookup([]string{cmd, rest[0]}) == nil {
			if len(rest) > 0 {
				fmt.Fprintf(stderr, "coordctl %s: unknown command %q%s\n", cmd, rest[0], hint(didYouMean(rest[0], commandWords(cmd), "")))
			}
			groupUsage(stderr, cmd)
			return exitUsage
		}
		cmd, rest = cmd+" "+rest[0], rest[1:]
	}
	c := lookup([]string{cmd})
	if c == nil {
		fmt.Fprintf(stderr, "coordctl: unknown command %q%s\n", cmd, hint(didYouMean(cmd, commandWords(""), "")))
		e.shortUsage()
		return exitUsage
	}
	e.name = "coordctl " + cmd
	return c.spec.main(e, rest)
}

// groupUsage lists the commands of a group (session, marks), the short
// usage of "coordctl session" alone or with a typo.
func groupUsage(w io.Writer, group string) {
	fmt.Fprintln(w, "Usage:")
	for _, c := range commands {
		if strings.HasPrefix(c.name, group+" ") {
			fmt.Fprintf(w, "  coordctl %s %s\n", c.name, c.spec.synopsisText())
		}
	}
	fmt.Fprintf(w, "run 'coordctl help %s CMD' for a command's flags and examples\n", group)
}

// flagSet returns a FlagSet with the connection and output flags; every
// command adds its own.
func (e *env) flagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	e.conn.register(fs)
	fs.StringVar(&e.output, "o", e.output, "output format: table or json ($COORDCTL_OUTPUT)")
	return fs
}

// setUsage makes -help print the command's synopsis, flags, extra help,
// examples and exit codes, and a typo (a bad flag, a wrong number of
// arguments) its synopsis and where the help is: a mistake's message stays
// in view.
func (e *env) setUsage(fs *flag.FlagSet, synopsis, extraHelp, examples string) {
	fs.Usage = func() {} // parseFlags prints the one that applies
	e.shortUsage = func() {
		if e.name == "coordctl" {
			fmt.Fprint(e.stderr, "Usage: coordctl [connection flags] COMMAND [flags] [arguments]\nrun 'coordctl help' for the commands and flags\n")
			return
		}
		fmt.Fprintf(e.stderr, "Usage: %s %s\nrun 'coordctl help %s' for its flags and examples\n", e.name, synopsis, strings.TrimPrefix(e.name, "coordctl "))
	}
	e.help = func() {
		fmt.Fprintf(e.stderr, "Usage: %s %s\n\nFlags:\n", e.name, synopsis)
		fs.PrintDefaults()
		if extraHelp != "" {
			fmt.Fprint(e.stderr, "\n"+extraHelp)
		}
		if examples != "" {
			fmt.Fprint(e.stderr, "\nExamples:\n"+examples)
		}
		fmt.Fprint(e.stderr, "\n"+exitCodesHelp)
	}
}

// parse parses args with flags allowed anywhere among the positional
// arguments (until "--"), and checks the output format and the number of
// positional arguments (between min and max; max < 0: no limit). The exit
// code is -1 when the command goes on.
func (e *env) parse(fs *flag.FlagSet, args []string, minArgs, maxArgs int, synopsis string) ([]string, int) {
	var pos []string
	for {
		if code := e.parseFlags(fs, args); code >= 0 {
			return nil, code
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	return pos, e.checkArgs(pos, minArgs, maxArgs, synopsis)
}

// parseFlags parses the flags at the start of args; the exit code is -1
// when the command goes on (after -help it is exitOK).
func (e *env) parseFlags(fs *flag.FlagSet, args []string) int {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			e.help()
			return exitOK
		}
		if s := didYouMean(undefinedFlag(err), flagNames(fs), "--"); s != "" {
			fmt.Fprintf(e.stderr, "%s: %s\n", e.name, s) // after the flag package's message
		}
		e.shortUsage()
		return exitUsage
	}
	return -1
}

// checkArgs checks the output format and the number of positional
// arguments; -1 when they are fine.
func (e *env) checkArgs(pos []string, minArgs, maxArgs int, synopsis string) int {
	if e.output != "table" && e.output != "json" {
		fmt.Fprintf(e.stderr, "%s: -o %q: want table or json\n", e.name, e.output)
		return exitUsage
	}
	if len(pos) < minArgs || (maxArgs >= 0 && len(pos) > maxArgs) {
		fmt.Fprintf(e.stderr, "%s: wrong number of arguments\n", e.name)
		e.shortUsage()
		return exitUsage
	}
	return -1
}

// fail prints err and returns its exit code.
func (e *env) fail(err error) int {
	msg := err.Error()
	if st, ok := status.FromError(err); ok {
		msg = fmt.Sprintf("%s: %s", codeName(st.Code()), st.Message())
		if r := client.ReasonOf(err); r != "" {
			msg += " (reason " + r + ")" // what a script switches on: stable, unlike the message
		}
	}
	fmt.Fprintf(e.stderr, "%s: %s\n", e.name, field(msg)) // the server's words, shown as text
	return exitCode(err)
}

// exitCode maps an error to an exit code.
func exitCode(err error) int {
	if errors.Is(err, client.ErrLockHeld) || client.ReasonOf(err) == client.ReasonLockHeld {
		return exitNotAcquired
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return exitUnavailable
	}
	switch status.Code(err) {
	case codes.InvalidArgument:
		return exitUsage
	case codes.Aborted:
		return exitNotAcquired
	case codes.NotFound, codes.FailedPrecondition:
		return exitNotValid
	case codes.Unavailable, codes.DeadlineExceeded:
		return exitUnavailable
	case codes.Unauthenticated, codes.PermissionDenied:
		return exitDenied
	}
	return exitError
}

// codeName is a status code as the API documents it (NOT_FOUND).
func codeName(c codes.Code) string {
	s := c.String()
	var b strings.Builder
	for i, r := range s {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String())
}
