package main_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// versionVar is the variable make build and deploy/Dockerfile set with -X.
const versionVar = "github.com/coordinatord/coordinatord/internal/version.Version"

// testVersion is the version TestMain's binary is built with.
const testVersion = "v9.8.7-test"

// -version prints "coordinatord VERSION (revision R, GO OS/ARCH)" on stdout
// and exits 0: VERSION from -ldflags (TestMain's build), else "dev" for a
// build that recorded no module version or VCS revision (-buildvcs=false).
// Other flags are not checked: -version answers even beside a bad one.
func TestVersionFlag(t *testing.T) {
	fallback := filepath.Join(t.TempDir(), "coordinatord")
	if out, err := exec.Command("go", "build", "-buildvcs=false", "-o", fallback, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		name, bin, version string
		args               []string
	}{
		{"ldflags", binary, testVersion, []string{"-version"}},
		{"ldflags, beside a bad flag", binary, testVersion, []string{"--max-ttl", "0s", "--version"}},
		{"fallback", fallback, "dev", []string{"-version"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := exec.Command(tc.bin, tc.args...).Output()
			if err != nil {
				t.Fatalf("%v: %v", tc.args, err)
			}
			line := string(out)
			prefix := "coordinatord " + tc.version + " (revision "
			suffix := ", " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"
			if !strings.HasPrefix(line, prefix) || !strings.HasSuffix(line, suffix) || strings.Count(line, "\n") != 1 {
				t.Errorf("-version printed %q, want %q...%q", line, prefix, suffix)
			}
		})
	}
}

// COORDINATORD_VERSION is no way to set -version: a manifest's environment
// must not turn the daemon into a command that prints and exits 0. Here the
// bad -max-ttl is reached (exit 2) instead.
func TestVersionIsNotReadFromTheEnvironment(t *testing.T) {
	cmd := exec.Command(binary, "--max-ttl", "0s")
	cmd.Env = append(os.Environ(), "COORDINATORD_VERSION=true")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("exit %v, want 2; output %s", err, out)
	}
	if strings.Contains(string(out), testVersion) {
		t.Errorf("printed the version: %s", out)
	}
}
