package version

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const rev = "0123456789abcdef0123456789abcdef01234567"

func vcs(revision, modified string) []debug.BuildSetting {
	return []debug.BuildSetting{
		{Key: "-compiler", Value: "gc"},
		{Key: "vcs", Value: "git"},
		{Key: "vcs.revision", Value: revision},
		{Key: "vcs.modified", Value: modified},
	}
}

// The version comes from -ldflags, else the module version, else the VCS
// revision, else "dev"; the revision from the VCS settings, else Unknown.
func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ldflags string
		bi      *debug.BuildInfo
		want    Info
	}{
		{"ldflags win over everything", "v1.2.3", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v9.9.9"}, Settings: vcs(rev, "true")},
			Info{Version: "v1.2.3", Revision: rev + "-dirty", GoVersion: "go1.26.0"}},
		{"ldflags without build info", "v1.2.3", nil,
			Info{Version: "v1.2.3", Revision: Unknown, GoVersion: runtime.Version()}},
		{"module version (go install ...@v1.4.0)", "", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.4.0"}},
			Info{Version: "v1.4.0", Revision: Unknown, GoVersion: "go1.26.0"}},
		{"devel module, clean checkout", "", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "false")},
			Info{Version: "0123456789ab", Revision: rev, GoVersion: "go1.26.0"}},
		{"devel module, dirty checkout", "", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: vcs(rev, "true")},
			Info{Version: "0123456789ab-dirty", Revision: rev + "-dirty", GoVersion: "go1.26.0"}},
		{"nothing recorded (-buildvcs=false, go test)", "", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}},
			Info{Version: "dev", Revision: Unknown, GoVersion: "go1.26.0"}},
		{"no build info at all", "", nil,
			Info{Version: "dev", Revision: Unknown, GoVersion: runtime.Version()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := resolve(tc.ldflags, tc.bi); got != tc.want {
				t.Errorf("resolve = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The linker flag the Makefile and the Dockerfile pass sets Version: the
// variable's path is the one they spell (a renamed package would make -X a
// silent no-op).
func TestLdflagsSetVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	bin := filepath.Join(t.TempDir(), "printversion")
	for _, tc := range []struct {
		name    string
		ldflags string
		want    string
	}{
		{"set", "-X github.com/coordinatord/coordinatord/internal/version.Version=v1.2.3-4-gabcdef", "v1.2.3-4-gabcdef"},
		{"unset", "", "dev"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			build := exec.Command("go", "build", "-buildvcs=false", "-ldflags", tc.ldflags, "-o", bin, "./testdata/printversion")
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("go build: %v\n%s", err, out)
			}
			out, err := exec.Command(bin).Output()
			if err != nil {
				t.Fatal(err)
			}
			var got Info
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			if got.Version != tc.want || got.Revision != Unknown || got.GoVersion != runtime.Version() {
				t.Errorf("got %+v, want version %q, revision %q, %s", got, tc.want, Unknown, runtime.Version())
			}
		})
	}
}
