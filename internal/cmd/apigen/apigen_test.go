package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// repoRoot is the repository root: tests run in internal/cmd/apigen.
var repoRoot = filepath.Join("..", "..", "..")

// The Node client's descriptor module is what apigen writes from the API's
// Go code: a proto changed without make generate fails here (buf is not
// needed to check it).
func TestNodeDescriptorFresh(t *testing.T) {
	want, err := nodeDescriptor()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(repoRoot, "examples", "node", "src", "descriptor.ts"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatal("examples/node/src/descriptor.ts is stale: run make generate")
	}
}

// apiFiles names every proto file of the API: one added without it would be
// missing from the reference and from the Node client.
func TestAPIFilesComplete(t *testing.T) {
	protos, err := filepath.Glob(filepath.Join(repoRoot, "api", "coordinator", "v1", "*.proto"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, f := range apiFiles {
		listed[f] = true
	}
	for _, p := range protos {
		if f := "coordinator/v1/" + filepath.Base(p); !listed[f] {
			t.Errorf("%s is not in apiFiles (internal/cmd/apigen/main.go)", f)
		}
	}
	if len(protos) != len(apiFiles) {
		t.Errorf("api/coordinator/v1 has %d proto files, apiFiles %d", len(protos), len(apiFiles))
	}
}

var link = regexp.MustCompile(`\]\(#([^)]+)\)`)

// The committed reference has a section for every method, message and enum
// of the API (a proto changed without make generate fails here; make verify
// compares it whole), and each of its links leads to a heading.
func TestAPIReference(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "API.md"))
	if err != nil {
		t.Fatal(err)
	}
	ref := string(b)
	headings := map[string]bool{}
	for _, l := range strings.Split(ref, "\n") {
		if h, ok := strings.CutPrefix(strings.TrimLeft(l, "#"), " "); ok && strings.HasPrefix(l, "#") {
			headings[anchor(h)] = true
		}
	}
	for _, path := range apiFiles {
		fd, err := protoregistry.GlobalFiles.FindFileByPath(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range declared(fd) {
			if !headings[anchor(name)] {
				t.Errorf("docs/API.md has no section %q: run make generate", name)
			}
		}
	}
	for _, m := range link.FindAllStringSubmatch(ref, -1) {
		if !headings[m[1]] {
			t.Errorf("docs/API.md links #%s, which no heading has", m[1])
		}
	}
}

// declared is the section heading of every service method, message and
// enum of fd, as the reference writes them.
func declared(fd protoreflect.FileDescriptor) []string {
	var out []string
	for i := range fd.Services().Len() {
		s := fd.Services().Get(i)
		out = append(out, "service "+string(s.Name()))
		for j := range s.Methods().Len() {
			out = append(out, string(s.Name())+"."+string(s.Methods().Get(j).Name()))
		}
	}
	var msgs func(protoreflect.MessageDescriptors)
	enums := func(es protoreflect.EnumDescriptors) {
		for i := range es.Len() {
			out = append(out, strings.TrimPrefix(string(es.Get(i).FullName()), pkgPrefix))
		}
	}
	msgs = func(ms protoreflect.MessageDescriptors) {
		for i := range ms.Len() {
			if m := ms.Get(i); !m.IsMapEntry() {
				out = append(out, strings.TrimPrefix(string(m.FullName()), pkgPrefix))
				msgs(m.Messages())
				enums(m.Enums())
			}
		}
	}
	msgs(fd.Messages())
	enums(fd.Enums())
	return out
}

func TestCamelCase(t *testing.T) {
	for in, want := range map[string]string{
		"name": "name", "request_id": "requestId", "release_on_disconnect": "releaseOnDisconnect",
		"_x": "_x", "a__b": "a_B", "field_1": "field_1", "x_": "x_",
	} {
		if got := camelCase(in); got != want {
			t.Errorf("camelCase(%q) = %q, want %q", in, got, want)
		}
	}
}
