package image

import (
	"fmt"
	"os"
	"os/exec"
)

// versionVar is the linker variable that -version, coordctl version and
// coordinatord_build_info report (as the Makefile's LDFLAGS set it).
const versionVar = "github.com/coordinatord/coordinatord/internal/version.Version"

// BuildBinary compiles the daemon in the repository at root into out as the
// image needs it: static (CGO_ENABLED=0, so it runs on an empty base),
// for linux/arch, with -trimpath and without symbol tables (-s -w: the
// image build is reproducible and smaller), stamped with version like make
// build. goCmd is the go command to run ("go": the one on PATH).
func BuildBinary(goCmd, root, out, version, arch string) error {
	cmd := exec.Command(goCmd, "build", "-trimpath",
		"-ldflags", "-s -w -X "+versionVar+"="+version,
		"-o", out, "./cmd/coordinatord")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/coordinatord: %w\n%s", err, b)
	}
	return nil
}
