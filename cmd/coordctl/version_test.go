package main_test

import (
	"runtime"
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
