package examples_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPythonStubsFresh regenerates the committed Python stubs
// (examples/python/coordinator/v1) from api/coordinator/v1/*.proto with
// gen_stubs.py into a temporary directory and fails if any file differs, is
// missing or is extra: the Python counterpart of make verify.
func TestPythonStubsFresh(t *testing.T) {
	py := pythonWith(t, "grpc_tools.protoc")
	out := t.TempDir()
	if b, err := exec.Command(py, filepath.Join("python", "gen_stubs.py"), out).CombinedOutput(); err != nil {
		t.Fatalf("gen_stubs.py: %v\n%s", err, b)
	}
	committed := filepath.Join("python", "coordinator")
	want := map[string][]byte{}
	_ = filepath.WalkDir(filepath.Join(out, "coordinator"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(out, p)
			want[rel], _ = os.ReadFile(p)
		}
		return err
	})
	if len(want) == 0 {
		t.Fatal("gen_stubs.py wrote no files")
	}
	_ = filepath.WalkDir(committed, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.Contains(p, "__pycache__") {
			return err
		}
		rel, _ := filepath.Rel("python", p)
		if _, ok := want[rel]; !ok {
			t.Errorf("examples/python/%s is not generated from the protos any more: delete it", rel)
		}
		return nil
	})
	for rel, gen := range want {
		got, err := os.ReadFile(filepath.Join("python", rel))
		if err != nil || !bytes.Equal(got, gen) {
			t.Errorf("examples/python/%s is stale (%v): run /usr/bin/python3 examples/python/gen_stubs.py and commit", rel, err)
		}
	}
}

// TestPython runs the coordinatord package's pytest suite
// (examples/python/tests) against a real daemon, whose address it passes in
// COORDTEST_ADDR. Any pytest failure fails the test, and so does exit code 5
// (no tests collected).
func TestPython(t *testing.T) {
	py := pythonWith(t, "grpc", "pytest")
	addr := startDaemon(t)
	cmd := exec.CommandContext(ctxT(t, 3*time.Minute), py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", "tests")
	cmd.Dir = "python"
	cmd.Env = append(os.Environ(), "COORDTEST_ADDR="+addr, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("pytest:\n%s", out)
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit) && exit.ExitCode() == 5:
		t.Fatal("pytest collected no tests (exit 5)")
	case err != nil:
		t.Fatalf("pytest: %v", err)
	case bytes.Contains(out, []byte(" skipped")):
		t.Fatal("pytest skipped tests: every test must run against the daemon")
	}
}

// TestPythonWheel builds the package's wheel with setuptools (pyproject.toml,
// no network: Debian's python3-setuptools) from a copy of examples/python,
// unpacks it and imports the client from there: the wheel carries the
// committed stubs and needs nothing from the repository.
func TestPythonWheel(t *testing.T) {
	py := pythonWith(t, "grpc", "setuptools", "zipfile")
	src := filepath.Join(t.TempDir(), "src")
	if err := os.CopyFS(src, os.DirFS("python")); err != nil {
		t.Fatal(err)
	}
	dist, site := t.TempDir(), t.TempDir()
	build := exec.Command(py, "-c", "import sys; from setuptools import build_meta as b; print(b.build_wheel(sys.argv[1]))", dist)
	build.Dir = src
	out, err := build.CombinedOutput()
	if err != nil {
		t.Fatalf("build_wheel: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	wheel := filepath.Join(dist, lines[len(lines)-1])
	if b, err := exec.Command(py, "-m", "zipfile", "-e", wheel, site).CombinedOutput(); err != nil {
		t.Fatalf("unzip %s: %v\n%s", wheel, err, b)
	}
	imp := exec.Command(py, "-c", "import coordinatord, coordinator.v1.lock_pb2_grpc as g; assert 'LOCK_HELD' in coordinatord.REASONS; print(g.LockServiceStub.__name__)")
	imp.Dir = t.TempDir() // not examples/python: only the wheel's files
	imp.Env = append(os.Environ(), "PYTHONPATH="+site, "PYTHONDONTWRITEBYTECODE=1")
	if b, err := imp.CombinedOutput(); err != nil || strings.TrimSpace(string(b)) != "LockServiceStub" {
		t.Fatalf("import from the wheel: %v\n%s", err, b)
	}
}
