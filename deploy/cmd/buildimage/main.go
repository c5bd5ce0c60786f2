// Command buildimage builds coordinatord's container image without a
// container engine (make image): it compiles the static daemon and writes
// the image (package image) as a tarball to load or push.
//
//	go run ./cmd/buildimage -root .. -version v1.2.3 -o ../bin/coordinatord-image.tar
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/coordinatord/coordinatord/deploy/image"
)

func main() {
	goCmd := flag.String("go", "go", "the go command that compiles the daemon")
	root := flag.String("root", "..", "the repository root (holds cmd/coordinatord)")
	version := flag.String("version", "dev", "the version to stamp into the binary and the image's labels and tag")
	arch := flag.String("arch", runtime.GOARCH, "the architecture to build for (GOARCH)")
	out := flag.String("o", "coordinatord-image.tar", "the image tarball to write")
	flag.Parse()
	if err := build(*goCmd, *root, *version, *arch, *out); err != nil {
		fmt.Fprintln(os.Stderr, "buildimage:", err)
		os.Exit(1)
	}
}

// build compiles the binary into a temporary directory, builds the image
// around it, writes it to out and prints its digest.
func build(goCmd, root, version, arch, out string) error {
	tmp, err := os.MkdirTemp("", "buildimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "coordinatord")
	if err := image.BuildBinary(goCmd, root, bin, version, arch); err != nil {
		return err
	}
	img, err := image.Build(bin, image.WithVersion(version), image.WithArch(arch))
	if err != nil {
		return err
	}
	if err := image.Write(out, img, version); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s coordinatord:%s %s\n", out, version, digest)
	return nil
}
