// Package version is the build's version, for coordinatord -version,
// coordctl version and the coordinatord_build_info metric.
//
// A release build sets it with the linker:
//
//	go build -ldflags "-X github.com/coordinatord/coordinatord/internal/version.Version=v1.2.3" ./cmd/coordinatord
//
// (make build does, from git describe). Without it, the version comes from
// the build information the Go toolchain embeds: the module's version
// (go install ...@v1.2.3), else the VCS revision of a build from a checkout,
// else "dev".
package version

import (
	"runtime"
	"runtime/debug"
)

// Version is set by -ldflags "-X ...internal/version.Version=..."; empty, the
// build information decides (Get).
var Version string

// Unknown is the revision of a build that recorded none.
const Unknown = "unknown"

// Info is what a build knows of itself.
type Info struct {
	// Version is the release (v1.2.3, or git describe's v1.2.3-4-gabcdef),
	// a module pseudo-version, a VCS revision or "dev".
	Version string
	// Revision is the VCS commit the binary was built from (with "-dirty"
	// if the tree had changes), or Unknown.
	Revision string
	// GoVersion is the toolchain that built the binary (go1.26.0).
	GoVersion string
}

// String is the one line of -version: "v1.2.3 (revision abc, go1.26.0 linux/amd64)".
func (i Info) String() string {
	return i.Version + " (revision " + i.Revision + ", " + i.GoVersion + " " + runtime.GOOS + "/" + runtime.GOARCH + ")"
}

// Get is this binary's Info.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(Version, bi)
}

// resolve is the Info of a build whose linker set version (maybe empty) and
// whose toolchain embedded bi (nil if none).
func resolve(version string, bi *debug.BuildInfo) Info {
	info := Info{Version: version, Revision: Unknown, GoVersion: runtime.Version()}
	if bi == nil {
		if info.Version == "" {
			info.Version = "dev"
		}
		return info
	}
	if bi.GoVersion != "" {
		info.GoVersion = bi.GoVersion
	}
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev != "" {
		info.Revision = rev
		if dirty {
			info.Revision += "-dirty"
		}
	}
	switch {
	case info.Version != "":
	case bi.Main.Version != "" && bi.Main.Version != "(devel)":
		info.Version = bi.Main.Version
	case rev != "":
		info.Version = short(rev)
		if dirty {
			info.Version += "-dirty"
		}
	default:
		info.Version = "dev"
	}
	return info
}

// short is a commit hash cut to the 12 digits git and Go pseudo-versions
// show.
func short(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}
