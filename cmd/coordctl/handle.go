package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/coordinatord/coordinatord/client"
)

// handleHelp is how the commands that take a grant's secret handle say
// where it may come from, the recommended sources first.
const handleHelp = `HANDLE, the grant's secret, comes from one of:
  $COORDCTL_HANDLE     the environment (recommended: only the same user and root can read it)
  --handle-file FILE   a file holding it, - for standard input (recommended); surrounding
                       whitespace is ignored
  HANDLE               the last argument: works, but ps shows it to every local user and the
                       shell's history keeps it
--handle-file and HANDLE together are a usage error (exit 2); either one wins over
$COORDCTL_HANDLE, as a flag wins over its variable.
`

// maxHandleFile bounds what --handle-file reads: a handle is ~40 bytes, and
// a file (or a pipe) of another kind must not be read whole.
const maxHandleFile = 4096

// handleSource is where release and keepalive take the handle from (and
// the session commands the session's: sessionSource).
type handleSource struct {
	file  string // --handle-file: a path, or "-" for standard input
	stdin io.Reader
	// flag, env and what name the flag, the variable and the secret in
	// messages ("": handle-file, COORDCTL_HANDLE, HANDLE).
	flag, env, what string
}

func (h *handleSource) names() (flagName, envName, what string) {
	if h.flag == "" {
		return "handle-file", "COORDCTL_HANDLE", "HANDLE"
	}
	return h.flag, h.env, h.what
}

func (h *handleSource) register(fs *flag.FlagSet) {
	f, _, what := h.names()
	fs.StringVar(&h.file, f, "", "read "+what+" from this file (- : standard input) instead of an argument, which ps shows to every local user")
}

// resolve returns the handle: from --handle-file, else the HANDLE argument
// (arg, when hasArg), else $COORDCTL_HANDLE. Both explicit sources at once,
// none at all, or an empty or unreadable file are usage errors.
func (h *handleSource) resolve(arg string, hasArg bool) (string, error) {
	f, env, what := h.names()
	switch {
	case h.file != "" && hasArg:
		return "", fmt.Errorf("%s given twice, as an argument and with --%s: give one (prefer --%s or $%s: an argument shows in ps)", what, f, f, env)
	case h.file != "":
		return h.read()
	case hasArg:
		return arg, nil
	}
	if v := strings.TrimSpace(os.Getenv(env)); v != "" {
		return v, nil
	}
	return "", fmt.Errorf("no %s: set $%s or pass --%s FILE (- : standard input)", what, env, f)
}

// read reads --handle-file.
func (h *handleSource) read() (string, error) {
	r, name := h.stdin, "standard input"
	flagName, _, _ := h.names()
	if h.file != "-" {
		f, err := os.Open(h.file)
		if err != nil {
			return "", fmt.Errorf("--%s: %w", flagName, err)
		}
		defer f.Close()
		r, name = f, h.file
	}
	b, err := io.ReadAll(io.LimitReader(r, maxHandleFile+1))
	switch {
	case err != nil:
		return "", fmt.Errorf("--%s %s: %w", flagName, name, err)
	case len(b) > maxHandleFile:
		return "", fmt.Errorf("--%s %s: more than %d bytes: not a handle", flagName, name, maxHandleFile)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("--%s %s is empty", flagName, name)
	}
	return v, nil
}

// grantSynopsis is the synopsis of release and keepalive.
const grantSynopsis = "NAME TOKEN [HANDLE] [--handle-file FILE]"

// grantLine is the command line of release and keepalive: NAME TOKEN
// [HANDLE], and where else the handle may come from.
type grantLine struct {
	hs  handleSource
	ref client.GrantRef
}

func (g *grantLine) register(fs *flag.FlagSet) { g.hs.register(fs) }

// parse reads NAME and TOKEN and finds the handle; the exit code is -1
// when the command goes on.
func (g *grantLine) parse(e *env, pos []string) int {
	token, code := parseToken(e, pos[1])
	if code >= 0 {
		return code
	}
	arg := ""
	if len(pos) == 3 {
		arg = pos[2]
	}
	g.hs.stdin = e.stdin
	handle, err := g.hs.resolve(arg, len(pos) == 3)
	if err != nil {
		fmt.Fprintf(e.stderr, "%s: %v\nUsage: %s %s\n", e.name, err, e.name, grantSynopsis)
		return exitUsage
	}
	g.ref = client.GrantRef{Name: pos[0], Token: token, Handle: handle}
	return -1
}
