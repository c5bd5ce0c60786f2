package main_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestZshFishCompletionNeverEvaluatesNames: the zsh and fish scripts hand
// held lock names that mean something to a shell to the shell's completion
// as the very strings, and nothing runs. Each shell is skipped where it is
// not installed (a fresh machine without them stays green).
//
// zsh: compadd works only inside a completion widget, so the test replaces
// it with a function printing its arguments (what zsh would match and
// quote) and calls _coordctl as the widget would, words and PREFIX set.
// fish: complete -C runs fish's real completion for a command line.
func TestZshFishCompletionNeverEvaluatesNames(t *testing.T) {
	var names []string
	for _, n := range shellNames {
		names = append(names, "zf/"+strings.TrimPrefix(n, "cmp/"))
	}
	for _, n := range names {
		g := acquire(t, n, "--ttl", "60s")
		t.Cleanup(func() { must(t, 0, "release", n, g.token, g.handle) })
	}
	tests := []struct {
		shell string
		args  func(script string) []string
		split string // between the offered words
	}{
		{"zsh", func(script string) []string {
			return []string{"-f", "-c", script + `
compadd() { [[ "$1" == -- ]] && shift; printf '%s\0' "$@"; }
for cmd in describe release; do words=(coordctl $cmd zf/); CURRENT=3; PREFIX=zf/; _coordctl; done`}
		}, "\x00"},
		{"fish", func(script string) []string {
			return []string{"--no-config", "-c", script + `
for cmd in describe release; complete -C "coordctl $cmd zf/"; end`}
		}, "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.shell, func(t *testing.T) {
			needShell(t, tt.shell)
			dir := t.TempDir()
			sh := exec.Command(tt.shell, tt.args(must(t, 0, "completion", tt.shell).stdout)...)
			sh.Dir = dir
			sh.Env = append(os.Environ(), "PATH="+filepath.Dir(coordctl)+":"+os.Getenv("PATH"), "COORDCTL_ADDR="+addr,
				"XDG_DATA_HOME="+t.TempDir(), "XDG_CONFIG_HOME="+t.TempDir(), "XDG_CACHE_HOME="+t.TempDir())
			var out, stderr bytes.Buffer
			sh.Stdout, sh.Stderr = &out, &stderr
			if err := sh.Run(); err != nil {
				t.Fatalf("%s: %v\n%s", tt.shell, err, stderr.String())
			}
			wantNothingRan(t, dir)
			var got []string
			for _, w := range strings.Split(strings.TrimSuffix(out.String(), tt.split), tt.split) {
				w, _, _ = strings.Cut(w, "\t") // fish: a description may follow
				got = append(got, w)
			}
			want := sorted(append(slices.Clone(names), names...)) // describe, then release
			if !slices.Equal(sorted(got), want) {
				t.Errorf("%s offered %q, want the names %q", tt.shell, sorted(got), want)
			}
		})
	}
}

// TestCompletionScripts: completion prints the script of each shell, and
// a usage error for another.
func TestCompletionScripts(t *testing.T) {
	for _, tt := range []struct{ shell, first string }{
		{"bash", "# bash completion for coordctl"},
		{"zsh", "#compdef coordctl"},
		{"fish", "# fish completion for coordctl"},
	} {
		t.Run(tt.shell, func(t *testing.T) {
			if r := must(t, 0, "completion", tt.shell); !strings.HasPrefix(r.stdout, tt.first) {
				t.Errorf("completion %s starts %.40q", tt.shell, r.stdout)
			}
		})
	}
	must(t, exitUsage, "completion", "tcsh")
}

// TestCompletionOffersEveryFlag: for every command, bash, zsh and fish
// offer, at "-" TAB, every flag its -help lists (exec's --limit and
// --shared, and marks' --slot, were missing: the scripts are written by
// hand, so this test holds them to the flags the commands really take).
func TestCompletionOffersEveryFlag(t *testing.T) {
	commands := [][]string{
		{"acquire"}, {"release"}, {"keepalive"}, {"validate"}, {"describe"}, {"list"}, {"watch"}, {"force-release"},
		{"session", "open"}, {"session", "keepalive"}, {"session", "close"},
		{"marks", "list"}, {"marks", "get"}, {"marks", "delete"}, {"marks", "rebind"},
		{"hit"}, {"counter", "get"}, {"counter", "reset"}, {"exec"}, {"epoch"}, {"restore-plan"},
	}
	// flagsOf are the flags cmd's -help lists, as a user types them.
	flagsOf := func(cmd []string) []string {
		r := must(t, 0, append(slices.Clone(cmd), "-help")...)
		var out []string
		for _, l := range strings.Split(r.stderr, "\n") {
			if name, ok := strings.CutPrefix(l, "  -"); ok && !strings.HasPrefix(name, "-") { // not the extra help's "  --x"
				name, _, _ = strings.Cut(name, " ")
				if name == "o" {
					out = append(out, "-o")
				} else {
					out = append(out, "--"+name)
				}
			}
		}
		if len(out) == 0 {
			t.Fatalf("%v -help lists no flags:\n%s", cmd, r.stderr)
		}
		return out
	}
	shells := []struct {
		name string
		// offered runs the shell's completion of "coordctl CMD... -".
		offered func(t *testing.T, script string, cmd []string) []string
	}{
		{"bash", func(t *testing.T, script string, cmd []string) []string {
			words := append(append([]string{"coordctl"}, cmd...), "-")
			line := strings.Join(words, " ")
			return shellWords(t, "bash", "\n", "--norc", "--noprofile", "-c", script+`
COMP_WORDS=(`+line+`); COMP_CWORD=`+strconv.Itoa(len(words)-1)+`; COMP_LINE="`+line+`"; COMP_POINT=${#COMP_LINE}
_coordctl; printf '%s\n' "${COMPREPLY[@]}"`)
		}},
		{"zsh", func(t *testing.T, script string, cmd []string) []string {
			words := append(append([]string{"coordctl"}, cmd...), "-")
			return shellWords(t, "zsh", "\x00", "-f", "-c", script+`
compadd() { [[ "$1" == -- ]] && shift; printf '%s\0' "$@"; }
words=(`+strings.Join(words, " ")+`); CURRENT=`+strconv.Itoa(len(words))+`; PREFIX=-; _coordctl`)
		}},
		{"fish", func(t *testing.T, script string, cmd []string) []string {
			return shellWords(t, "fish", "\n", "--no-config", "-c", script+`
complete -C "coordctl `+strings.Join(cmd, " ")+` -"`)
		}},
	}
	for _, sh := range shells {
		t.Run(sh.name, func(t *testing.T) {
			needShell(t, sh.name)
			script := must(t, 0, "completion", sh.name).stdout
			for _, cmd := range commands {
				offered := sh.offered(t, script, cmd)
				for _, f := range flagsOf(cmd) {
					if !slices.Contains(offered, f) {
						t.Errorf("%s: coordctl %s - TAB does not offer %s (offered %q)", sh.name, strings.Join(cmd, " "), f, offered)
					}
				}
			}
		})
	}
}

// shellWords runs shell with args (no coordinator reachable: no names) and
// returns what it printed, split at sep, each word cut at a tab (fish: a
// description follows).
func shellWords(t *testing.T, shell, sep string, args ...string) []string {
	t.Helper()
	sh := exec.Command(shell, args...)
	sh.Dir = t.TempDir()
	sh.Env = append(os.Environ(), "PATH="+filepath.Dir(coordctl)+":"+os.Getenv("PATH"), "COORDCTL_ADDR=127.0.0.1:1",
		"XDG_DATA_HOME="+t.TempDir(), "XDG_CONFIG_HOME="+t.TempDir(), "XDG_CACHE_HOME="+t.TempDir())
	var out, stderr bytes.Buffer
	sh.Stdout, sh.Stderr = &out, &stderr
	if err := sh.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", shell, err, stderr.String())
	}
	var words []string
	for _, w := range strings.Split(strings.TrimSuffix(out.String(), sep), sep) {
		w, _, _ = strings.Cut(w, "\t")
		words = append(words, w)
	}
	return words
}

// needShell skips the test where shell is not installed, and fails it there
// under COORDTEST_SHELLS_REQUIRED=1 (.ci/run installs zsh and fish and sets
// it).
func needShell(t *testing.T, shell string) {
	t.Helper()
	if _, err := exec.LookPath(shell); err != nil {
		if os.Getenv("COORDTEST_SHELLS_REQUIRED") == "1" {
			t.Fatalf("%s is not installed (COORDTEST_SHELLS_REQUIRED=1)", shell)
		}
		t.Skipf("%s is not installed", shell)
	}
}
