// Package image builds coordinatord's container image without a container
// engine and without a registry: go-containerregistry assembles it in
// memory from an empty base (nothing to pull, nothing to pin) and one layer
// holding the static binary, and writes it as a tarball that docker load,
// podman load and crane push read.
//
// The image is reproducible: the same binary gives the same image digest,
// because every timestamp in the layer and the config is fixed and the
// layer's entries are written in a fixed order with fixed owners and modes.
package image

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	// BinaryPath is where the daemon lives in the image: the entrypoint.
	BinaryPath = "/usr/local/bin/coordinatord"
	// DataDir is the working directory, owned by User: the embedded etcd
	// (no --etcd-endpoints) writes its default --data-dir,
	// coordinatord-data, under it. Mount a volume here to keep it.
	DataDir = "/data"
	// User is distroless's "nonroot" (65532:65532), by number: the image
	// has no /etc/passwd to name it in.
	User = "65532:65532"
	// Source is the org.opencontainers.image.source label's default.
	Source = "https://github.com/coordinatord/coordinatord"
)

// epoch is every timestamp in the image (file times, config created): a
// fixed one, so that two builds of one binary give one digest.
var epoch = time.Unix(0, 0).UTC()

type options struct {
	version string
	source  string
	arch    string
}

// Option configures Build.
type Option func(*options)

// WithVersion sets the org.opencontainers.image.version label (default "dev").
func WithVersion(v string) Option { return func(o *options) { o.version = v } }

// WithSource sets the org.opencontainers.image.source label (default Source).
func WithSource(s string) Option { return func(o *options) { o.source = s } }

// WithArch sets the platform architecture in the config (default
// runtime.GOARCH); it must be the architecture the binary was built for.
func WithArch(a string) Option { return func(o *options) { o.arch = a } }

// Build returns the image of the static binary at binary: an empty base
// plus one layer with the binary at BinaryPath and the DataDir directory,
// run as User with the binary as its entrypoint, OCI media types and
// labels.
func Build(binary string, opts ...Option) (v1.Image, error) {
	o := options{version: "dev", source: Source, arch: runtime.GOARCH}
	for _, opt := range opts {
		opt(&o)
	}
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, fmt.Errorf("read the binary to put in the image: %w", err)
	}
	layerTar, err := binaryLayer(bin)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(
		func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil },
		tarball.WithMediaType(types.OCILayer),
	)
	if err != nil {
		return nil, fmt.Errorf("compress the image layer: %w", err)
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: epoch},
			CreatedBy: "coordinatord deploy/image: " + BinaryPath,
			Comment:   "the static coordinatord binary",
		},
	})
	if err != nil {
		return nil, fmt.Errorf("add the binary layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read the image config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", o.arch
	cf.Created = v1.Time{Time: epoch}
	cf.Config.User = User
	cf.Config.Entrypoint = []string{BinaryPath}
	cf.Config.Cmd = nil
	cf.Config.WorkingDir = DataDir
	// gRPC, plaintext gRPC health (probes), metrics. The default --listen is
	// 127.0.0.1:7070: pass --listen to serve outside the container.
	cf.Config.ExposedPorts = map[string]struct{}{"7070/tcp": {}, "7071/tcp": {}, "9090/tcp": {}}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.source":   o.source,
		"org.opencontainers.image.version":  o.version,
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.title":    "coordinatord",
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set the image config: %w", err)
	}
	return img, nil
}

// binaryLayer is the layer's tar: the directories down to the binary (root
// owned, 0755), the binary (root owned, 0755: the non-root user runs it but
// cannot change it) and DataDir (owned by User, 0700), all at epoch.
func binaryLayer(bin []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entries := []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "data/", Mode: 0o700, Uid: 65532, Gid: 65532},
		{Typeflag: tar.TypeDir, Name: "usr/", Mode: 0o755},
		{Typeflag: tar.TypeDir, Name: "usr/local/", Mode: 0o755},
		{Typeflag: tar.TypeDir, Name: "usr/local/bin/", Mode: 0o755},
		{Typeflag: tar.TypeReg, Name: BinaryPath[1:], Mode: 0o755, Size: int64(len(bin))},
	}
	for _, h := range entries {
		h.ModTime, h.Format = epoch, tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("write the image layer: %w", err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(bin); err != nil {
				return nil, fmt.Errorf("write the image layer: %w", err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("write the image layer: %w", err)
	}
	return buf.Bytes(), nil
}
