package main

import (
	"flag"
	"fmt"
	"strconv"

	"github.com/coordinatord/coordinatord/client"
)

// sessionHelp is how the session commands say where the session's secret
// handle comes from. It is never an argument: ps would show it.
const sessionHelp = `SESSION, the session's secret handle (session open prints it, once), comes from one of:
  $COORDCTL_SESSION     the environment (recommended: only the same user and root can read it)
  --session-file FILE   a file holding it, - for standard input; surrounding whitespace is ignored
--session-file wins over $COORDCTL_SESSION. It is never an argument: ps would show it to
every local user. Whoever has it can renew, close and acquire through the session.
`

// sessionSource is where the session commands (and acquire --session) take
// the session's handle from.
func sessionSource() handleSource {
	return handleSource{flag: "session-file", env: "COORDCTL_SESSION", what: "SESSION"}
}

// sessionLine is the command line of session keepalive and session close.
type sessionLine struct {
	src    handleSource
	handle string
}

func (s *sessionLine) register(fs *flag.FlagSet) {
	s.src = sessionSource()
	s.src.register(fs)
}

// resolve finds the handle; the exit code is -1 when the command goes on.
func (s *sessionLine) resolve(e *env, synopsis string) int {
	s.src.stdin = e.stdin
	h, err := s.src.resolve("", false)
	if err != nil {
		fmt.Fprintf(e.stderr, "%s: %v\nUsage: %s %s\n", e.name, err, e.name, synopsis)
		return exitUsage
	}
	s.handle = h
	return -1
}

// sessionFlags are acquire's --session and --session-file.
type sessionFlags struct {
	use bool
	sessionLine
}

func (s *sessionFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&s.use, "session", false, "acquire through the session of $COORDCTL_SESSION or --session-file: on its lease (--ttl and --lock-delay do not apply); no handle is printed")
	s.sessionLine.register(fs)
}

// wanted reports whether the lock is to be acquired through a session.
func (s *sessionFlags) wanted() bool { return s.use || s.src.file != "" }

// sessionOpenLine is the command line of session open.
type sessionOpenLine struct {
	ttl   optDuration
	owner string
}

func runSessionOpen(x *call[sessionOpenLine]) (*client.Session, error) {
	ctx, cancel := x.bounded()
	defer cancel()
	var opts []client.SessionOption
	if x.f.ttl.set {
		opts = append(opts, client.WithSessionTTL(x.f.ttl.d))
	}
	return x.c.OpenSession(ctx, append(opts, client.WithSessionOwner(x.f.owner))...)
}

// printSession shows an opened session, its handle included: the one time
// coordctl prints it.
func printSession(x *call[sessionOpenLine], s *client.Session) int {
	if x.output == "json" {
		x.printJSON(struct {
			Handle    string  `json:"handle"`
			LeaseID   string  `json:"leaseId"`
			TTL       string  `json:"ttl"`
			ExpiresAt *string `json:"expiresAt"`
			SafeUntil *string `json:"safeUntil"`
		}{s.Handle, i64(s.LeaseID), dur(s.TTL), ts(s.ExpiresAt), ts(s.SafeUntil)})
	} else {
		x.table([]string{"HANDLE", "TTL", "EXPIRES_AT", "SAFE_UNTIL"},
			[]string{s.Handle, s.TTL.String(), cell(s.ExpiresAt), cell(s.SafeUntil)})
	}
	return exitOK
}

// sessionRenewal is what session keepalive answers.
type sessionRenewal struct {
	client.Renewal
	holders []client.Holder
}

func runSessionKeepAlive(x *call[sessionLine]) (sessionRenewal, error) {
	ctx, cancel := x.bounded()
	defer cancel()
	r, hs, err := x.c.ResumeSession(x.f.handle).KeepAlive(ctx)
	return sessionRenewal{r, hs}, err
}

// printSessionRenewal shows the renewed lease and the locks held through
// it (never the handle).
func printSessionRenewal(x *call[sessionLine], r sessionRenewal) int {
	if x.output == "json" {
		x.printJSON(struct {
			TTL       string    `json:"ttl"`
			ExpiresAt *string   `json:"expiresAt"`
			SafeUntil *string   `json:"safeUntil"`
			Holders   []*holder `json:"holders"`
		}{dur(r.TTL), ts(r.ExpiresAt), ts(r.SafeUntil), toHolders(r.holders)})
		return exitOK
	}
	x.table([]string{"TTL", "EXPIRES_AT", "SAFE_UNTIL", "LOCKS"},
		[]string{r.TTL.String(), cell(r.ExpiresAt), cell(r.SafeUntil), strconv.Itoa(len(r.holders))})
	if len(r.holders) > 0 {
		fmt.Fprintln(x.stdout)
		x.holderTable(r.holders)
	}
	return exitOK
}

// sessionEnd is what session close answers.
type sessionEnd struct {
	closed   bool
	released []client.Holder
}

func runSessionClose(x *call[sessionLine]) (sessionEnd, error) {
	ctx, cancel := x.bounded()
	defer cancel()
	closed, hs, err := x.c.ResumeSession(x.f.handle).Close(ctx)
	return sessionEnd{closed, hs}, err
}

// printSessionEnd shows whether the session was closed and the locks it
// released; closed=false (already gone) exits with 4, as release does.
func printSessionEnd(x *call[sessionLine], s sessionEnd) int {
	if x.output == "json" {
		x.printJSON(struct {
			Closed   bool      `json:"closed"`
			Released []*holder `json:"released"`
		}{s.closed, toHolders(s.released)})
	} else {
		x.table([]string{"CLOSED", "RELEASED"}, []string{strconv.FormatBool(s.closed), strconv.Itoa(len(s.released))})
		if len(s.released) > 0 {
			fmt.Fprintln(x.stdout)
			x.holderTable(s.released)
		}
	}
	if !s.closed {
		return exitNotValid
	}
	return exitOK
}
