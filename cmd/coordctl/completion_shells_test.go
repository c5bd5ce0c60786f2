package main_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
			if _, err := exec.LookPath(tt.shell); err != nil {
				// .ci/run installs zsh and fish and sets
				// COORDTEST_SHELLS_REQUIRED=1: there a missing shell fails.
				if os.Getenv("COORDTEST_SHELLS_REQUIRED") == "1" {
					t.Fatalf("%s is not installed (COORDTEST_SHELLS_REQUIRED=1)", tt.shell)
				}
				t.Skipf("%s is not installed", tt.shell)
			}
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
