package main_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// shellNames are lock names that mean something to a shell: each would run
// touch (creating a marker file) or change what a command line passes if
// bash ever expanded it.
var shellNames = []string{
	"cmp/x$(touch${IFS}pwned)",
	"cmp/y`touch${IFS}pwned2`",
	"cmp/$(touch pwned3)",
	"cmp/z;touch pwned4",
	"cmp/w|touch pwned5",
	"cmp/v&&touch pwned6",
	"cmp/q'uo\"te",
	"cmp/sp ace",
	"cmp/${IFS}",
	"cmp/$HOME",
	"cmp/~tilde",
	"cmp/glob*?[a]",
	"cmp/brace{a,b}",
	"cmp/back\\slash",
	"cmp/redir>out",
	"cmp/hash#x",
	"cmp/excl!x",
	"cmp/é unicode",
}

// bashComplete runs coordctl's real bash completion script in a fresh bash
// (in dir, with coordctl on PATH and talking to addr) for each word, as if
// TAB were pressed after "coordctl CMD word", and returns, per word, the
// candidates COMPREPLY offers and what each candidate becomes as a word of
// a command line that is then run (bash expands it, as on Enter).
func bashComplete(t *testing.T, dir, addr, cmd string, words ...string) (offered, run [][]string) {
	t.Helper()
	script := must(t, 0, "completion", "bash").stdout + `
for w in "$@"; do
    COMP_WORDS=(coordctl ` + cmd + ` "$w"); COMP_CWORD=2; COMP_LINE="coordctl ` + cmd + ` $w"; COMP_POINT=${#COMP_LINE}
    _coordctl
    printf '%s\0' "${COMPREPLY[@]}"; printf '@@offered\0'
    for c in "${COMPREPLY[@]}"; do eval "printf '%s\0' $c"; done; printf '@@run\0'
done
`
	sh := exec.Command("bash", append([]string{"--noprofile", "--norc", "-c", script, "bash"}, words...)...)
	sh.Dir = dir
	sh.Env = append(os.Environ(), "PATH="+filepath.Dir(coordctl)+":"+os.Getenv("PATH"), "COORDCTL_ADDR="+addr)
	var out, stderr bytes.Buffer
	sh.Stdout, sh.Stderr = &out, &stderr
	if err := sh.Run(); err != nil {
		t.Fatalf("bash completion: %v\n%s", err, stderr.String())
	}
	var cur []string
	for _, f := range strings.Split(out.String(), "\x00") {
		switch f {
		case "@@offered":
			offered, cur = append(offered, cur), nil
		case "@@run":
			run, cur = append(run, cur), nil
		default:
			cur = append(cur, f)
		}
	}
	if len(offered) != len(words) || len(run) != len(words) {
		t.Fatalf("bash completion printed %q", out.String())
	}
	return offered, run
}

// wantNothingRan fails if anything but what the test put there appeared in dir.
func wantNothingRan(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("completion ran a command: %s appeared in its directory", e.Name())
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestCompletionNeverEvaluatesNames: TAB over held lock names that hold
// $(...), backticks, quotes, spaces, ${IFS}, globs... runs nothing, offers
// exactly the names, and each offered word, once on a command line, is
// exactly the name again. First the finding's name alone (with others, an
// unbalanced one could make compgen -W fail before it ran anything), then
// all of them.
func TestCompletionNeverEvaluatesNames(t *testing.T) {
	var grants []grant
	t.Cleanup(func() {
		for i, g := range grants {
			must(t, 0, "release", shellNames[i], g.token, g.handle)
		}
	})
	dir := t.TempDir()
	grants = append(grants, acquire(t, shellNames[0], "--ttl", "60s"))
	offered, run := bashComplete(t, dir, addr, "describe", "cmp/")
	wantNothingRan(t, dir)
	if !slices.Equal(run[0], shellNames[:1]) {
		t.Errorf("describe cmp/<TAB>: the offered words %q run as %q, want %q", offered[0], run[0], shellNames[:1])
	}

	for _, n := range shellNames[1:] {
		grants = append(grants, acquire(t, n, "--ttl", "60s"))
	}
	for _, cmd := range []string{"describe", "release"} {
		offered, run := bashComplete(t, dir, addr, cmd, "cmp/", "cmp/x", `cmp/x\$\(`, "cmp/sp", `cmp/q\'`, "nothing/")
		wantNothingRan(t, dir)
		if got, want := sorted(run[0]), sorted(shellNames); !slices.Equal(got, want) {
			t.Errorf("%s cmp/<TAB>: the offered words run as %q, want the names %q (offered: %q)", cmd, got, want, offered[0])
		}
		for i, want := range [][]string{1: {"cmp/x$(touch${IFS}pwned)"}, 2: {"cmp/x$(touch${IFS}pwned)"}, 3: {"cmp/sp ace"}, 4: {"cmp/q'uo\"te"}, 5: nil} {
			if i > 0 && !slices.Equal(run[i], want) {
				t.Errorf("%s: completing word %d: the offered words %q run as %q, want %q", cmd, i, offered[i], run[i], want)
			}
		}
	}
}

// TestCompletionOfNamesNoCoordinatorAccepts: names the coordinator refuses
// today (newlines, control characters) but a server could still send are
// inert too.
func TestCompletionOfNamesNoCoordinatorAccepts(t *testing.T) {
	names := []string{"cmp/new\nline$(touch${IFS}pwned)", "cmp/tab\t`touch${IFS}pwned2`", "cmp/esc\x1b[31m", "cmp/nul\x00$(touch${IFS}pwned3)"}
	a := startHostile(t, &hostileServer{names: names})
	dir := t.TempDir()
	offered, run := bashComplete(t, dir, a, "describe", "")
	wantNothingRan(t, dir)
	if got, want := sorted(run[0]), sorted(names[:3]); !slices.Equal(got, want) { // a NUL cannot be in a command line: left out
		t.Errorf("the offered words %q run as %q, want %q", offered[0], got, want)
	}
}

// TestCompletionAtARealTAB types into an interactive bash on a terminal
// (util-linux script makes the pty): "coordctl describe " and the start of
// a name, TAB, then Home, a printf prefix and Enter, so the line readline
// completed runs and prints its words. Nothing runs but printf, and the
// completed word is the name, also past the : = @ where COMP_WORDBREAKS
// cuts words.
func TestCompletionAtARealTAB(t *testing.T) {
	if out, err := exec.Command("script", "--version").CombinedOutput(); err != nil || !strings.Contains(string(out), "util-linux") {
		t.Skip("needs util-linux script(1) for a terminal")
	}
	cases := []struct{ name, typed string }{
		{"tab/0x$(touch${IFS}pwned)", "tab/0"},
		{"tab/1`touch${IFS}pwned2`", "tab/1"},
		{"tab/2sp ace", "tab/2sp\\ "},
		{"tab/3q'uo\"te", "tab/3"},
		{"tab/4;touch pwned3", "tab/4\\;"},
		{"tab/5a:b=c@d", "tab/5a:"},
		{"tab/6a:b=c@d", "tab/6a:b="},
		{"tab/7a@b", "tab/7a@"},
	}
	var input strings.Builder
	input.WriteString("source <(coordctl completion bash)\n")
	for _, c := range cases {
		g := acquire(t, c.name, "--ttl", "60s")
		t.Cleanup(func() { must(t, 0, "release", c.name, g.token, g.handle) })
		fmt.Fprintf(&input, "coordctl describe %s\t\x01printf '[%%s]\\n' \n", c.typed)
	}
	input.WriteString("exit\n")
	dir := t.TempDir()
	sh := exec.Command("script", "-q", "-c", "bash --noprofile --norc -i", "/dev/null")
	sh.Dir = dir
	sh.Env = append(os.Environ(), "PATH="+filepath.Dir(coordctl)+":"+os.Getenv("PATH"), "COORDCTL_ADDR="+addr, "TERM=dumb", "HISTFILE=")
	sh.Stdin = strings.NewReader(input.String())
	out, err := sh.CombinedOutput()
	if err != nil {
		t.Fatalf("script: %v\n%s", err, out)
	}
	wantNothingRan(t, dir)
	screen := strings.ReplaceAll(string(out), "\r", "")
	for _, c := range cases {
		if !strings.Contains(screen, "\n[coordctl]\n[describe]\n["+c.name+"]\n") {
			t.Errorf("%s TAB did not complete to the name %q; the terminal shows:\n%s", c.typed, c.name, screen)
		}
	}
}
