package main_test

import (
	"runtime"
	"slices"
	"strings"
	"testing"
)

// testVersion is the version TestMain's coordctl is built with.
const testVersion = "v9.8.7-test"

// coordctl version prints coordctl's own build (the API names no server
// version) without asking a coordinator: it answers with none reachable.
func TestVersionCommand(t *testing.T) {
	const nobody = "--addr=127.0.0.1:1" // nothing listens there
	t.Run("table", func(t *testing.T) {
		r := must(t, 0, nobody, "version")
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "PROGRAM VERSION REVISION GO" {
			t.Fatalf("version printed %q, want a header and one row", r.stdout)
		}
		row := strings.Fields(lines[1])
		if len(row) != 4 || row[0] != "coordctl" || row[1] != testVersion || row[3] != runtime.Version() {
			t.Errorf("row %q, want coordctl %s REVISION %s", row, testVersion, runtime.Version())
		}
	})
	t.Run("json", func(t *testing.T) {
		m := decode(t, must(t, 0, nobody, "-o", "json", "version"))
		c, _ := m["client"].(map[string]any)
		if len(m) != 1 || c["version"] != testVersion || c["goVersion"] != runtime.Version() || c["revision"] == "" {
			t.Errorf("version printed %v, want {client: {version: %s, revision, goVersion: %s}}", m, testVersion, runtime.Version())
		}
	})
	t.Run("no arguments", func(t *testing.T) {
		must(t, 2, "version", "extra")
	})
}

// coordctl --version prints what coordctl version does, in either output,
// whatever follows it; the help and the completion scripts offer it.
func TestVersionFlag(t *testing.T) {
	const nobody = "--addr=127.0.0.1:1"
	tests := []struct {
		name string
		flag []string // the --version form
		cmd  []string // the command it answers as
	}{
		{"table", []string{nobody, "--version"}, []string{nobody, "version"}},
		{"single dash", []string{nobody, "-version"}, []string{nobody, "version"}},
		{"json", []string{nobody, "-o", "json", "--version"}, []string{nobody, "-o", "json", "version"}},
		{"-o after it", []string{nobody, "--version", "-o=json"}, []string{nobody, "-o", "json", "version"}},
		{"before a command", []string{nobody, "--version", "acquire", "x"}, []string{nobody, "version"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, want := must(t, 0, tt.flag...), must(t, 0, tt.cmd...)
			if got.stdout != want.stdout || got.stderr != "" {
				t.Errorf("coordctl %q printed %q (stderr %q), want %q as coordctl %q", tt.flag, got.stdout, got.stderr, want.stdout, tt.cmd)
			}
		})
	}
	if r := must(t, 0, "help"); !strings.Contains(r.stdout, "coordctl --version") {
		t.Errorf("help does not mention --version:\n%s", r.stdout)
	}
	needShell(t, "bash")
	offered := shellWords(t, "bash", "\n", "--norc", "--noprofile", "-c", must(t, 0, "completion", "bash").stdout+`
COMP_WORDS=(coordctl --v); COMP_CWORD=1; COMP_LINE="coordctl --v"; COMP_POINT=${#COMP_LINE}
_coordctl; printf '%s\n' "${COMPREPLY[@]}"`)
	if !slices.Contains(offered, "--version") {
		t.Errorf("bash completes coordctl --v TAB to %q, want --version", offered)
	}
}
