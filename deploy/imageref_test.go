package deploy_test

import (
	iofs "io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// podImages returns the image of every container (and init container) of
// the workloads kustomize builds from dir in fs, keyed by
// "<kind>/<name>/<container>".
func podImages(t *testing.T, fs filesys.FileSystem, dir string) map[string]string {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(fs, dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	type container struct{ Name, Image string }
	images := map[string]string{}
	for _, r := range rm.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		var w struct {
			Spec struct {
				Template struct {
					Spec struct {
						Containers     []container `json:"containers"`
						InitContainers []container `json:"initContainers"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(y, &w); err != nil {
			t.Fatalf("%s: %s %s: %v", dir, r.GetKind(), r.GetName(), err)
		}
		for _, c := range append(w.Spec.Template.Spec.Containers, w.Spec.Template.Spec.InitContainers...) {
			images[r.GetKind()+"/"+r.GetName()+"/"+c.Name] = c.Image
		}
	}
	return images
}

// inMemory copies the kustomize/ tree into an in-memory file system.
func inMemory(t *testing.T) filesys.FileSystem {
	t.Helper()
	fs := filesys.MakeFsInMemory()
	err := filepath.WalkDir("kustomize", func(path string, d iofs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return fs.WriteFile("/"+filepath.ToSlash(path), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// setImage does to the kustomization in dir what
// kustomize edit set image coordinatord=<newName>@<digest> does: replace
// the images: entry named coordinatord.
func setImage(t *testing.T, fs filesys.FileSystem, dir, newName, digest string) {
	t.Helper()
	path := dir + "/kustomization.yaml"
	b, err := fs.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var k types.Kustomization
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		t.Fatal(err)
	}
	found := false
	for i, img := range k.Images {
		if img.Name == "coordinatord" {
			k.Images[i], found = types.Image{Name: "coordinatord", NewName: newName, Digest: digest}, true
		}
	}
	if !found {
		t.Fatalf("%s has no images: entry named coordinatord to set", path)
	}
	if b, err = yaml.Marshal(k); err != nil {
		t.Fatal(err)
	}
	if err := fs.WriteFile(path, b); err != nil {
		t.Fatal(err)
	}
}

// The coordinatord image is named coordinatord in the manifests and set by
// each kustomization's images: entry, which deploy/README.md tells
// operators to set by digest (kustomize edit set image in the
// kustomization's directory, or an overlay matching the placeholder's
// name). Unset, it is a placeholder that never resolves (no :latest,
// nothing pulled from a registry nobody chose); set, every coordinatord
// container runs the pinned digest.
func TestImageIsSetByKustomize(t *testing.T) {
	const (
		placeholder = "registry.invalid/coordinatord:unset"
		newName     = "registry.example.test/team/coordinatord"
		digest      = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	)
	coordinatord := func(images map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range images {
			if strings.HasSuffix(k, "/coordinatord") {
				out[k] = v
			}
		}
		if len(out) == 0 {
			t.Fatalf("no coordinatord container among %v", images)
		}
		return out
	}
	for _, dir := range []string{"/kustomize/shared", "/kustomize/sidecar", "/kustomize/sidecar-relay"} {
		t.Run(strings.TrimPrefix(dir, "/kustomize/"), func(t *testing.T) {
			fs := inMemory(t)
			if !fs.Exists(dir + "/kustomization.yaml") {
				t.Skip("no kustomization in " + dir)
			}
			for k, img := range coordinatord(podImages(t, fs, dir)) {
				if img != placeholder {
					t.Errorf("%s runs %q; want the placeholder %q until the operator sets it", k, img, placeholder)
				}
			}
			overlay := "resources:\n  - .." + dir + "\nimages:\n  - name: registry.invalid/coordinatord\n    newName: " + newName + "\n    digest: " + digest + "\n"
			if err := fs.WriteFile("/overlay/kustomization.yaml", []byte(overlay)); err != nil {
				t.Fatal(err)
			}
			for k, img := range coordinatord(podImages(t, fs, "/overlay")) {
				if img != newName+"@"+digest {
					t.Errorf("an overlay setting the image: %s runs %q; want %q", k, img, newName+"@"+digest)
				}
			}
			setImage(t, fs, dir, newName, digest)
			for k, img := range coordinatord(podImages(t, fs, dir)) {
				if img != newName+"@"+digest {
					t.Errorf("%s runs %q after set image; want %q", k, img, newName+"@"+digest)
				}
			}
		})
	}
}
