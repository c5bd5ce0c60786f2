package image

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Write writes img to the file path as a tar that is both an OCI image
// layout (oci-layout, index.json, blobs/sha256/...: skopeo copy
// oci-archive:, podman load, docker load, and crane push of the extracted
// directory read it, keeping the manifest and so the digest img.Digest
// reports) and a docker save archive (manifest.json naming the same blobs,
// tagged coordinatord:version: older docker load reads it). Every tar
// entry is at the epoch, in a fixed order: the same image gives the same
// file.
func Write(path string, img v1.Image, version string) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write the image archive: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("write the image archive: %w", cerr)
		}
	}()
	return writeArchive(f, img, version)
}

// writeArchive is Write's tar, to w.
func writeArchive(w io.Writer, img v1.Image, version string) error {
	manifest, err := img.RawManifest()
	if err != nil {
		return fmt.Errorf("image manifest: %w", err)
	}
	desc, err := descriptor(img, manifest)
	if err != nil {
		return err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return fmt.Errorf("image config digest: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("image layers: %w", err)
	}
	tag := "coordinatord:" + version
	desc.Annotations = map[string]string{
		"org.opencontainers.image.ref.name": version,
		"io.containerd.image.name":          "docker.io/library/" + tag,
	}
	index, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     "application/vnd.oci.image.index.v1+json",
		Manifests:     []v1.Descriptor{desc},
	})
	if err != nil {
		return fmt.Errorf("image index: %w", err)
	}
	docker := []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}{{Config: blob(cfgName), RepoTags: []string{tag}}}

	tw := tar.NewWriter(w)
	add := func(name string, size int64, r io.Reader) error {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("write the image archive: %w", err)
		}
		if _, err := io.CopyN(tw, r, size); err != nil {
			return fmt.Errorf("write %s to the image archive: %w", name, err)
		}
		return nil
	}
	addBytes := func(name string, b []byte) error { return add(name, int64(len(b)), bytes.NewReader(b)) }
	if err := addBytes("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := addBytes(blob(cfgName), config); err != nil {
		return err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return fmt.Errorf("layer digest: %w", err)
		}
		size, err := l.Size()
		if err != nil {
			return fmt.Errorf("layer size: %w", err)
		}
		rc, err := l.Compressed()
		if err != nil {
			return fmt.Errorf("layer: %w", err)
		}
		err = add(blob(d), size, rc)
		if cerr := rc.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		docker[0].Layers = append(docker[0].Layers, blob(d))
	}
	if err := addBytes(blob(desc.Digest), manifest); err != nil {
		return err
	}
	if err := addBytes("index.json", index); err != nil {
		return err
	}
	dockerJSON, err := json.Marshal(docker)
	if err != nil {
		return fmt.Errorf("docker manifest.json: %w", err)
	}
	if err := addBytes("manifest.json", dockerJSON); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write the image archive: %w", err)
	}
	return nil
}

// descriptor is the index's entry for img, whose manifest is raw.
func descriptor(img v1.Image, raw []byte) (v1.Descriptor, error) {
	mt, err := img.MediaType()
	if err != nil {
		return v1.Descriptor{}, fmt.Errorf("image media type: %w", err)
	}
	d, err := img.Digest()
	if err != nil {
		return v1.Descriptor{}, fmt.Errorf("image digest: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return v1.Descriptor{}, fmt.Errorf("image config: %w", err)
	}
	return v1.Descriptor{
		MediaType: mt,
		Size:      int64(len(raw)),
		Digest:    d,
		Platform:  &v1.Platform{OS: cf.OS, Architecture: cf.Architecture},
	}, nil
}

// blob is the layout path of the blob with digest d.
func blob(d v1.Hash) string { return "blobs/" + d.Algorithm + "/" + d.Hex }
