package image_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/coordinatord/coordinatord/deploy/image"
)

const version = "v0.0.0-image-test"

// time0 is the fixed time of every file in the layer.
var time0 = time.Unix(0, 0)

// buildTarball builds the image of bin and writes it to a tarball in dir,
// as make image does; it returns the image read back from the tarball's
// OCI layout, after checking that it is the image built (same digest: the
// manifest survives) and that docker load's view of it (manifest.json) has
// the same config and layers.
func buildTarball(t *testing.T, bin, dir string) v1.Image {
	t.Helper()
	img, err := image.Build(bin, image.WithVersion(version))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "coordinatord-image.tar")
	if err := image.Write(path, img, version); err != nil {
		t.Fatal(err)
	}
	want, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}

	oci := filepath.Join(dir, "layout")
	untar(t, path, oci)
	idx, err := layout.ImageIndexFromPath(oci)
	if err != nil {
		t.Fatalf("%s is no OCI layout: %v", path, err)
	}
	back, err := idx.Image(want)
	if err != nil {
		t.Fatalf("the OCI layout has no image %v: %v", want, err)
	}
	if got, err := back.Digest(); err != nil || got != want {
		t.Fatalf("the layout's image has digest %v (%v), the built one %v", got, err, want)
	}

	docker, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		t.Fatalf("%s is no docker load archive: %v", path, err)
	}
	c1, err1 := img.ConfigName()
	c2, err2 := docker.ConfigName()
	l1, err3 := img.Layers()
	l2, err4 := docker.Layers()
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		t.Fatal(err)
	}
	if c1 != c2 || len(l1) != len(l2) {
		t.Fatalf("docker load's view: config %v, %d layers; built: config %v, %d layers", c2, len(l2), c1, len(l1))
	}
	return back
}

// untar extracts the regular files of the tar at path into dir.
func untar(t *testing.T, path, dir string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg || !filepath.IsLocal(h.Name) {
			t.Fatalf("%s: unexpected entry %q", path, h.Name)
		}
		out := filepath.Join(dir, h.Name)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			t.Fatal(err)
		}
		w, err := os.Create(out)
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.Copy(w, tr)
		if err := errors.Join(err, w.Close()); err != nil {
			t.Fatal(err)
		}
	}
}

// The image is built with no container engine and no registry, read back
// from its tarball, inspected and run: the config runs the binary as a
// non-root user with no shell (the binary is the only file), and the binary
// taken out of the layer starts and reports the version it was stamped with.
// Two builds of one source give one digest (fixed timestamps, -trimpath).
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the daemon")
	}
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "coordinatord")
	if err := image.BuildBinary("go", "../..", bin, version, runtime.GOARCH); err != nil {
		t.Fatal(err)
	}
	first := t.TempDir()
	img := buildTarball(t, bin, first)

	t.Run("reproducible", func(t *testing.T) {
		// A second compile of the same source: the image digest depends on
		// the source, not on when or where it was built.
		dir := t.TempDir()
		bin2 := filepath.Join(dir, "coordinatord")
		if err := image.BuildBinary("go", "../..", bin2, version, runtime.GOARCH); err != nil {
			t.Fatal(err)
		}
		again := buildTarball(t, bin2, dir)
		a1, err1 := os.ReadFile(filepath.Join(first, "coordinatord-image.tar"))
		a2, err2 := os.ReadFile(filepath.Join(dir, "coordinatord-image.tar"))
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a1, a2) {
			t.Error("two builds of one source wrote different image archives")
		}
		d1, err1 := img.Digest()
		d2, err2 := again.Digest()
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		if d1 != d2 {
			t.Errorf("two builds of one source: digests %v and %v", d1, d2)
		}
	})

	// What crane push does with the extracted layout, to a registry in this
	// process: the registry then serves the very manifest, so the digest
	// make image prints is the one to pin in the manifests.
	t.Run("push", func(t *testing.T) {
		srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
		defer srv.Close()
		ref, err := name.ParseReference(strings.TrimPrefix(srv.URL, "http://") + "/coordinatord:" + version)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, img); err != nil {
			t.Fatalf("push: %v", err)
		}
		desc, err := remote.Head(ref)
		if err != nil {
			t.Fatal(err)
		}
		if want, err := img.Digest(); err != nil || desc.Digest != want {
			t.Errorf("the registry serves %v, the build made %v (%v)", desc.Digest, want, err)
		}
	})

	t.Run("config", func(t *testing.T) {
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		c := cf.Config
		if c.User != "65532:65532" {
			t.Errorf("User %q, want 65532:65532 (non-root, numeric: no /etc/passwd)", c.User)
		}
		if !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/coordinatord"}) || len(c.Cmd) != 0 {
			t.Errorf("Entrypoint %q Cmd %q, want the binary alone (exec form, no shell)", c.Entrypoint, c.Cmd)
		}
		if c.WorkingDir != "/data" {
			t.Errorf("WorkingDir %q, want /data (where the embedded etcd's default data dir goes)", c.WorkingDir)
		}
		if !cf.Created.Equal(time0) {
			t.Errorf("created %v, want the epoch (reproducible)", cf.Created)
		}
		if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
			t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
		}
		for k, want := range map[string]string{
			"org.opencontainers.image.source":   image.Source,
			"org.opencontainers.image.version":  version,
			"org.opencontainers.image.licenses": "Apache-2.0",
		} {
			if got := c.Labels[k]; got != want {
				t.Errorf("label %s = %q, want %q", k, got, want)
			}
		}
		if mt, err := img.MediaType(); err != nil || mt != types.OCIManifestSchema1 {
			t.Errorf("manifest media type %q (%v), want %q", mt, err, types.OCIManifestSchema1)
		}
	})

	t.Run("layer", func(t *testing.T) {
		layers, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		if len(layers) != 1 {
			t.Fatalf("%d layers, want 1 (empty base plus the binary)", len(layers))
		}
		rc, err := layers[0].Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		out := filepath.Join(t.TempDir(), "coordinatord")
		var files []string
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if !h.ModTime.Equal(time0) {
				t.Errorf("%s has time %v, want the epoch (reproducible)", h.Name, h.ModTime)
			}
			switch {
			case h.Typeflag == tar.TypeDir && h.Name == "data/":
				if h.Uid != 65532 || h.Gid != 65532 {
					t.Errorf("data/ owned by %d:%d, want 65532:65532 (the daemon writes there)", h.Uid, h.Gid)
				}
			case h.Typeflag == tar.TypeDir:
			case h.Typeflag == tar.TypeReg:
				files = append(files, h.Name)
				if h.Uid != 0 || h.Mode&0o022 != 0 {
					t.Errorf("%s owned by %d mode %o: the non-root user could change it", h.Name, h.Uid, h.Mode)
				}
				f, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY, 0o755)
				if err != nil {
					t.Fatal(err)
				}
				_, err = io.Copy(f, tr)
				if err := errors.Join(err, f.Close()); err != nil {
					t.Fatal(err)
				}
			default:
				t.Errorf("%s: unexpected entry type %q (only directories and the binary)", h.Name, h.Typeflag)
			}
		}
		if !slices.Equal(files, []string{"usr/local/bin/coordinatord"}) {
			t.Fatalf("files in the image %q, want the binary alone (no shell, no libc)", files)
		}
		if runtime.GOOS != "linux" {
			t.Skip("the binary is linux/" + runtime.GOARCH)
		}
		b, err := exec.Command(out, "-version").Output()
		if err != nil || !strings.HasPrefix(string(b), "coordinatord "+version+" ") {
			t.Errorf("-version: %v, printed %q; want coordinatord %s (...)", err, b, version)
		}
		// -help prints the usage and exits 0 (a bad flag exits 2).
		b, err = exec.Command(out, "-help").CombinedOutput()
		if err != nil || !strings.Contains(string(b), "-listen") {
			t.Errorf("-help: %v, printed:\n%s", err, b)
		}
	})
}
