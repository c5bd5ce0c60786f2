// Command apigen writes what is generated from the API's protos beside the
// Go code that buf generates (make generate runs it):
//
//   - docs/API.md, the API reference, from the proto comments of a buf image
//     (buf build -o image.binpb: every file with its imports and comments);
//   - examples/node/src/descriptor.ts, the protos' FileDescriptorSet for the
//     Node client, which loads its services from it instead of reading .proto
//     files at run time (taken from the Go code, which embeds each file's
//     descriptor without comments).
//
// Both are committed; make verify fails when either differs from what this
// command writes, and TestNodeDescriptorFresh checks the second without buf.
package main

import (
	"flag"
	"fmt"
	"os"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

func main() {
	image := flag.String("image", "", "buf image (a FileDescriptorSet with source info) of the API: the input of -doc")
	doc := flag.String("doc", "", "write the API reference (Markdown) here")
	node := flag.String("node", "", "write the Node client's descriptor module (TypeScript) here")
	flag.Parse()
	if err := run(*image, *doc, *node); err != nil {
		fmt.Fprintln(os.Stderr, "apigen:", err)
		os.Exit(1)
	}
}

func run(image, doc, node string) error {
	if doc != "" {
		if image == "" {
			return fmt.Errorf("-doc needs -image")
		}
		b, err := os.ReadFile(image)
		if err != nil {
			return err
		}
		var fds descriptorpb.FileDescriptorSet
		if err := proto.Unmarshal(b, &fds); err != nil {
			return fmt.Errorf("read %s: %w", image, err)
		}
		md, err := reference(&fds)
		if err != nil {
			return err
		}
		if err := os.WriteFile(doc, []byte(md), 0o644); err != nil {
			return err
		}
	}
	if node != "" {
		ts, err := nodeDescriptor()
		if err != nil {
			return err
		}
		if err := os.WriteFile(node, []byte(ts), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// apiFiles are the API's proto files, in the order the reference shows them.
var apiFiles = []string{"coordinator/v1/lock.proto", "coordinator/v1/fence.proto", "coordinator/v1/counter.proto", "coordinator/v1/errors.proto"}

// descriptorSet is the API's files and their imports, each after its
// imports, as the Go code registered them (no comments).
func descriptorSet() (*descriptorpb.FileDescriptorSet, error) {
	fds := &descriptorpb.FileDescriptorSet{}
	seen := map[string]bool{}
	var add func(path string) error
	add = func(path string) error {
		if seen[path] {
			return nil
		}
		seen[path] = true
		fd, err := protoregistry.GlobalFiles.FindFileByPath(path)
		if err != nil {
			return err
		}
		for i := range fd.Imports().Len() {
			if err := add(fd.Imports().Get(i).Path()); err != nil {
				return err
			}
		}
		fds.File = append(fds.File, protodesc.ToFileDescriptorProto(fd))
		return nil
	}
	for _, f := range apiFiles {
		if err := add(f); err != nil {
			return nil, err
		}
	}
	return fds, nil
}
