package client_test

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// The SDK's promise: importing it pulls in grpc, protobuf and the generated
// API, nothing of the daemon (etcd, prometheus, sqlite, zap, ...). The
// module graph (go list -m all, test dependencies included) holds only
// what grpc, protobuf, genproto's rpc types and goleak (for the tests) bring,
// and the packages a program importing the SDK compiles
// (go list -deps) come only from the standard library, the API module,
// grpc, protobuf, genproto's rpc types and golang.org/x.
func TestSDKDependencies(t *testing.T) {
	t.Run("modules", func(t *testing.T) {
		// Everything in the module's graph must come through these
		// requirements (go.mod lists some of their dependencies too, as
		// indirect: those must be reachable from these).
		roots := map[string]bool{
			"github.com/coordinatord/coordinatord/api":  true,
			"google.golang.org/grpc":                    true,
			"google.golang.org/protobuf":                true,
			"google.golang.org/genproto/googleapis/rpc": true,
			"go.uber.org/goleak":                        true, // this package's tests only
		}
		reachable := map[string]bool{}
		edges := map[string][]string{}
		var queue []string
		graph := goList(t, "mod", "graph")
		for i := 0; i+1 < len(graph); i += 2 {
			from, to := graph[i], graph[i+1]
			edges[from] = append(edges[from], to)
			if from == "github.com/coordinatord/coordinatord/client" && roots[modulePath(to)] {
				queue = append(queue, to)
			}
		}
		for len(queue) > 0 {
			m := queue[0]
			queue = queue[1:]
			if !reachable[m] {
				reachable[m] = true
				queue = append(queue, edges[m]...)
			}
		}
		reachablePath := map[string]bool{}
		for m := range reachable {
			reachablePath[modulePath(m)] = true
		}
		for _, line := range goList(t, "list", "-m", "-f", "{{.Path}}", "all") {
			if line != "github.com/coordinatord/coordinatord/client" && !reachablePath[line] {
				t.Errorf("module %s is in the SDK's graph but not through its allowed requirements", line)
			}
			for _, banned := range []string{"go.etcd.io/", "github.com/prometheus/", "modernc.org/", "go.uber.org/zap", "github.com/coordinatord/coordinatord "} {
				if strings.HasPrefix(line+" ", banned) {
					t.Errorf("the SDK's module graph has %s", line)
				}
			}
		}
	})
	t.Run("go version", func(t *testing.T) {
		// The SDK builds with Go 1.24 (grpc v1.80's minimum): a newer go
		// line here or in a requirement would force it on every importer.
		for _, v := range goList(t, "list", "-m", "-f", "{{.GoVersion}}", "github.com/coordinatord/coordinatord/client", "github.com/coordinatord/coordinatord/api") {
			if goMinor(v) > 24 {
				t.Errorf("the SDK's modules need Go %s; want at most 1.24", v)
			}
		}
	})
	t.Run("packages", func(t *testing.T) {
		allowed := []string{
			"github.com/coordinatord/coordinatord/client",
			"github.com/coordinatord/coordinatord/api/",
			"google.golang.org/grpc",
			"google.golang.org/protobuf/",
			"google.golang.org/genproto/googleapis/rpc/",
			"golang.org/x/",
		}
		for _, line := range goList(t, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".") {
			if !hasAnyPrefix(line, allowed) {
				t.Errorf("the SDK compiles in %s", line)
			}
		}
	})
}

// goList runs the go command (list, mod graph) in this module and returns
// the words of its output.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	return strings.Fields(string(out))
}

// goMinor is the minor version of a go line ("1.24.0": 24).
func goMinor(v string) int {
	parts := strings.Split(v, ".")
	if len(parts) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(parts[1])
	return n
}

// modulePath is the path of "path@version".
func modulePath(m string) string {
	path, _, _ := strings.Cut(m, "@")
	return path
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
