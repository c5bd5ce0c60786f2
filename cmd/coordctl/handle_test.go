package main_test

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestHandleSources: release and keepalive take the handle from
// $COORDCTL_HANDLE or --handle-file (- : standard input), so it need not be
// in argv (ps, shell history); the argument still works. --handle-file and
// the argument together are a usage error; either wins over the variable.
func TestHandleSources(t *testing.T) {
	dir := t.TempDir()
	const wrong = "0123456789abcdef.AAAAAAAAAAAAAAAAAAAAAA" // well-formed, matches no grant
	big := strings.Repeat("h", 5000)
	for _, tc := range []struct {
		name  string
		args  func(g grant) []string // after NAME TOKEN
		env   func(g grant) []string
		stdin func(g grant) string
		code  int // of keepalive and of release
		msg   string
	}{
		{name: "argument", args: func(g grant) []string { return []string{g.handle} }},
		{name: "COORDCTL_HANDLE", env: func(g grant) []string { return []string{"COORDCTL_HANDLE=" + g.handle} }},
		{name: "--handle-file", args: func(g grant) []string {
			return []string{"--handle-file", writeFile(t, dir, "h-"+g.token, "\n "+g.handle+"\n")}
		}},
		{name: "--handle-file - (standard input)", args: func(grant) []string { return []string{"--handle-file", "-"} },
			stdin: func(g grant) string { return g.handle + "\n" }},
		{name: "a wrong COORDCTL_HANDLE is used, not ignored", env: func(grant) []string { return []string{"COORDCTL_HANDLE=" + wrong} },
			code: exitNotValid},
		{name: "the argument wins over COORDCTL_HANDLE", args: func(g grant) []string { return []string{g.handle} },
			env: func(grant) []string { return []string{"COORDCTL_HANDLE=" + wrong} }},
		{name: "--handle-file wins over COORDCTL_HANDLE", args: func(grant) []string { return []string{"--handle-file", "-"} },
			stdin: func(g grant) string { return g.handle },
			env:   func(grant) []string { return []string{"COORDCTL_HANDLE=" + wrong} }},
		{name: "the argument and --handle-file", args: func(g grant) []string { return []string{g.handle, "--handle-file", "-"} },
			stdin: func(g grant) string { return g.handle }, code: exitUsage, msg: "HANDLE given twice"},
		{name: "no handle", code: exitUsage, msg: "no HANDLE: set $COORDCTL_HANDLE or pass --handle-file"},
		{name: "an empty COORDCTL_HANDLE is none", env: func(grant) []string { return []string{"COORDCTL_HANDLE= "} }, code: exitUsage, msg: "no HANDLE"},
		{name: "an empty --handle-file", args: func(grant) []string { return []string{"--handle-file", writeFile(t, dir, "empty", " \n")} },
			code: exitUsage, msg: "is empty"},
		{name: "a missing --handle-file", args: func(grant) []string { return []string{"--handle-file", filepath.Join(dir, "missing")} },
			code: exitUsage, msg: "--handle-file"},
		{name: "a --handle-file that is not a handle", args: func(grant) []string { return []string{"--handle-file", "-"} },
			stdin: func(grant) string { return big }, code: exitUsage, msg: "not a handle"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, cmd := range []string{"keepalive", "release"} {
				g := acquire(t, "cli/handle", "--ttl", "30s")
				args := []string{cmd, "cli/handle", g.token}
				if tc.args != nil {
					args = append(args, tc.args(g)...)
				}
				c := coordctlCmd(t, args...)
				if tc.env != nil {
					c.Env = append(c.Env, tc.env(g)...)
				}
				if tc.stdin != nil {
					c.Stdin = strings.NewReader(tc.stdin(g))
				}
				var stdout, stderr bytes.Buffer
				c.Stdout, c.Stderr = &stdout, &stderr
				code := 0
				var ee *exec.ExitError
				if err := c.Run(); errors.As(err, &ee) {
					code = ee.ExitCode()
				} else if err != nil {
					t.Fatal(err)
				}
				if code != tc.code || !strings.Contains(stderr.String(), tc.msg) {
					t.Errorf("coordctl %q: exit %d, want %d; stderr %q, want it to say %q", args, code, tc.code, stderr.String(), tc.msg)
				}
				// What happened to the grant says which handle was used.
				released := cmd == "release" && tc.code == 0
				if released {
					must(t, exitNotValid, "keepalive", "cli/handle", g.token, g.handle)
				} else {
					must(t, 0, "release", "cli/handle", g.token, g.handle)
				}
			}
		})
	}
}

func TestHandleHelp(t *testing.T) {
	r := must(t, 0, "help")
	if !strings.Contains(r.stdout, "release NAME TOKEN [HANDLE]") || !strings.Contains(r.stdout, "$COORDCTL_HANDLE") || !strings.Contains(r.stdout, "--handle-file") {
		t.Errorf("help does not recommend $COORDCTL_HANDLE and --handle-file:\n%s", r.stdout)
	}
	for _, c := range []string{"release", "keepalive"} {
		r := must(t, 0, "help", c)
		if !strings.Contains(r.stderr, "$COORDCTL_HANDLE") || !strings.Contains(r.stderr, "--handle-file FILE") || !strings.Contains(r.stderr, "ps shows it") {
			t.Errorf("help %s:\n%s", c, r.stderr)
		}
		if strings.Contains(r.stderr, "\n  coordctl "+c+" reports/nightly 2 37e4") {
			t.Errorf("help %s still shows the handle as an argument in its examples:\n%s", c, r.stderr)
		}
	}
}
