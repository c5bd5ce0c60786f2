package server

// The error contract against the sources: the reasons sent are the proto's
// enum, the RetryInfo of a rate limit, and statuses built only in errors.go.

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

var quotaReasons = map[string]bool{
	"TOO_MANY_WAITERS": true, "TOO_MANY_LOCKS": true, "TOO_MANY_MARKS": true, "TOO_MANY_STREAMS": true, "STORE_FULL": true,
}

// reasonPrefix is what the proto's enum value names add to the wire reason.
const reasonPrefix = "ERROR_REASON_"

// Issue 19.4: the reasons the server sends and the proto's ErrorReason are
// the same set. Every withReason call of the server names its reason as a
// string literal (so that this test sees all of them); each is a value of
// the enum (as ERROR_REASON_<reason>), and each value of the enum but
// UNSPECIFIED is sent somewhere.
func TestReasonsAreTheProtoEnum(t *testing.T) {
	fset := token.NewFileSet()
	sent := map[string]bool{}
	for _, file := range goFiles(t, ".") {
		f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if fn, ok := call.Fun.(*ast.Ident); !ok || fn.Name != "withReason" {
				return true
			}
			lit, ok := call.Args[2].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				t.Errorf("%s: withReason's reason is not a string literal", fset.Position(call.Pos()))
				return true
			}
			r, _ := strconv.Unquote(lit.Value)
			sent[r] = true
			return true
		})
	}
	for r := range sent {
		if _, ok := coordinatorv1.ErrorReason_value[reasonPrefix+r]; !ok {
			t.Errorf("the server sends reason %q, which api/coordinator/v1/errors.proto does not list as %s%s", r, reasonPrefix, r)
		}
	}
	for name, n := range coordinatorv1.ErrorReason_value {
		if n == 0 {
			continue
		}
		if !sent[strings.TrimPrefix(name, reasonPrefix)] {
			t.Errorf("the proto's %s is sent nowhere: send it, or reserve it in errors.proto", name)
		}
	}
}

// The RetryInfo of RATE_LIMITED is when the caller's bucket holds a token
// again: an empty bucket of 2 tokens/s refills one in 500ms.
func TestRateLimitRetryDelay(t *testing.T) {
	now := time.Now()
	lim := rate.NewLimiter(2, 1)
	if !lim.AllowN(now, 1) || lim.AllowN(now, 1) {
		t.Fatal("a bucket of 1 allows exactly one call at once")
	}
	if got := tokenWait(lim.TokensAt(now), 2); got != 500*time.Millisecond {
		t.Errorf("wait %v, want 500ms", got)
	}
	if got := tokenWait(lim.TokensAt(now.Add(200*time.Millisecond)), 2); got != 300*time.Millisecond {
		t.Errorf("wait after 200ms %v, want 300ms", got)
	}
	if got := tokenWait(1, 2); got != 0 {
		t.Errorf("wait with a token %v, want 0", got)
	}
}

// domainErrors are the exported error sentinels (Err* variables) and typed
// errors (*Error types) of the internal packages the server imports, as
// pkg.Identifier, read from their source so that none is forgotten.
func domainErrors(t *testing.T) []string {
	t.Helper()
	const internal = "github.com/coordinatord/coordinatord/internal/"
	fset := token.NewFileSet()
	pkgs := map[string]bool{}
	for _, file := range goFiles(t, ".") {
		f, err := parser.ParseFile(fset, file, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); strings.HasPrefix(p, internal) {
				pkgs[strings.TrimPrefix(p, internal)] = true
			}
		}
	}
	if !pkgs["lease"] || !pkgs["fence"] {
		t.Fatalf("the server imports %v: the enumeration of domain errors is broken", slices.Sorted(maps.Keys(pkgs)))
	}
	var names []string
	for pkg := range pkgs {
		for _, file := range goFiles(t, filepath.Join("..", pkg)) {
			f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			for _, decl := range f.Decls {
				gd, ok := decl.(*ast.GenDecl)
				if !ok {
					continue
				}
				for _, spec := range gd.Specs {
					switch s := spec.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() && strings.HasPrefix(n.Name, "Err") {
								names = append(names, f.Name.Name+"."+n.Name)
							}
						}
					case *ast.TypeSpec:
						if s.Name.IsExported() && strings.HasSuffix(s.Name.Name, "Error") {
							names = append(names, f.Name.Name+"."+s.Name.Name)
						}
					}
				}
			}
		}
	}
	slices.Sort(names)
	return names
}

// goFiles are the non-test Go files of dir.
func goFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		if n := e.Name(); strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			files = append(files, filepath.Join(dir, n))
		}
	}
	return files
}

// Issue 14.4: errors.go is the whole error contract: no other file of the
// server builds a gRPC status (status.New, status.Error, status.Errorf,
// withReason, withDetails); they return domain errors, streamErr or a
// refusal of errors.go.
func TestStatusesAreBuiltOnlyInErrorsGo(t *testing.T) {
	builders := map[string]bool{"status.New": true, "status.Newf": true, "status.Error": true, "status.Errorf": true,
		"withReason": true, "withDetails": true}
	fset := token.NewFileSet()
	for _, file := range goFiles(t, ".") {
		if file == "errors.go" {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			var name string
			switch fn := call.Fun.(type) {
			case *ast.Ident:
				name = fn.Name
			case *ast.SelectorExpr:
				if x, ok := fn.X.(*ast.Ident); ok {
					name = x.Name + "." + fn.Sel.Name
				}
			}
			if builders[name] {
				t.Errorf("%s: %s builds a status outside errors.go: return a domain error, or add a named refusal to errors.go", fset.Position(call.Pos()), name)
			}
			return true
		})
	}
}
