package examples_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

var tapCount = regexp.MustCompile(`(?m)^# (pass|fail|skipped|todo|cancelled) (\d+)$`)

// TestNode compiles the TypeScript client (strict type checking) and runs its
// node:test suite (examples/node/src/test) against a real daemon, whose
// address it passes in COORDTEST_ADDR. It runs the package from a copy
// outside the repository (package.json, dist/, and node_modules linked):
// the package carries its protos. It fails unless at least one test ran and
// none failed, was skipped or cancelled.
func TestNode(t *testing.T) {
	n := node(t).run("x")[0]
	t.Logf("tsc took %v", compileTook)
	addr := startDaemon(t)
	cmd := exec.CommandContext(ctxT(t, 3*time.Minute), n, "--test", "--test-reporter=tap", filepath.Join("dist", "test", "client.test.js"))
	cmd.Dir = nodePackageCopy(t)
	cmd.Env = append(os.Environ(), "COORDTEST_ADDR="+addr)
	out, err := cmd.CombinedOutput()
	t.Logf("node --test:\n%s", out)
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	counts := map[string]string{}
	for _, m := range tapCount.FindAllStringSubmatch(string(out), -1) {
		counts[m[1]] = m[2]
	}
	if err != nil || counts["pass"] == "" || counts["pass"] == "0" || counts["fail"] != "0" || counts["skipped"] != "0" || counts["cancelled"] != "0" {
		t.Fatalf("node --test: %v, counts %v; want every test run and passed", err, counts)
	}
}

// nodePackageCopy copies the compiled Node package (package.json, dist/)
// into a temporary directory, with a link to its node_modules, and returns
// the directory.
func nodePackageCopy(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(filepath.Join(dir, "dist"), os.DirFS(filepath.Join("node", "dist"))); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join("node", "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "package.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	modules, err := filepath.Abs(filepath.Join("node", "node_modules"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(modules, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	return dir
}
