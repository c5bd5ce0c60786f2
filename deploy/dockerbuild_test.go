package deploy_test

import (
	"bufio"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// shellWords splits a Dockerfile RUN line as /bin/sh would for the simple
// words it holds: blanks separate words, double and single quotes group.
func shellWords(t *testing.T, s string) []string {
	t.Helper()
	var (
		words []string
		cur   strings.Builder
		in    bool
		quote rune
	)
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '"' || r == '\'':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		case r == '\\' || r == '$' || r == '`' || r == ';' || r == '&' || r == '|':
			t.Fatalf("the build line %q needs a shell this test does not emulate (%q)", s, r)
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if quote != 0 {
		t.Fatalf("unbalanced quote in %q", s)
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}

// argRef is a reference to a build argument, as the Dockerfile writes it.
var argRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// expandArgs replaces every ${NAME} in line with the build argument NAME:
// its --build-arg value from buildArgs, else the default of its ARG line.
func expandArgs(t *testing.T, line string, declared, buildArgs map[string]string) string {
	t.Helper()
	return argRef.ReplaceAllStringFunc(line, func(ref string) string {
		name := argRef.FindStringSubmatch(ref)[1]
		def, ok := declared[name]
		if !ok {
			t.Fatalf("the build line uses ${%s}, which no ARG before it declares", name)
		}
		if v, ok := buildArgs[name]; ok {
			return v
		}
		return def
	})
}

// dockerfileBuild returns the environment and the command of the build
// stage's "go build" RUN line, its ${ARG}s expanded as docker build
// --build-arg would with buildArgs.
func dockerfileBuild(t *testing.T, buildArgs map[string]string) (env, args []string) {
	t.Helper()
	f, err := os.Open("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var line string
	declared := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if a, ok := strings.CutPrefix(l, "ARG "); ok && line == "" {
			name, def, _ := strings.Cut(strings.TrimSpace(a), "=")
			declared[name] = def
		}
		if strings.HasPrefix(l, "RUN ") && strings.Contains(l, "go build") {
			if line != "" {
				t.Fatal("the Dockerfile has more than one go build line")
			}
			line = expandArgs(t, strings.TrimPrefix(l, "RUN "), declared, buildArgs)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if line == "" {
		t.Fatal("no RUN ... go build line in the Dockerfile")
	}
	words := shellWords(t, line)
	for len(words) > 0 && strings.Contains(words[0], "=") {
		env, words = append(env, words[0]), words[1:]
	}
	return env, words
}

// The Dockerfile cannot be built here (no container engine), so its build
// line runs as written, from the repository root like the build stage's
// WORKDIR /src with go.mod, api/, cmd/ and internal/ copied in: the binary
// must be static (no ELF interpreter, no shared libraries: it runs on
// distroless/static), must start, and must report the VERSION build
// argument it was built with.
func TestDockerfileBuildsAStaticBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the daemon")
	}
	const version = "v0.0.0-image-test"
	env, args := dockerfileBuild(t, map[string]string{"VERSION": version})
	if len(args) < 2 || args[0] != "go" || args[1] != "build" {
		t.Fatalf("the build line runs %q, not go build", args)
	}
	out := filepath.Join(t.TempDir(), "coordinatord")
	found := false
	for i, a := range args {
		if a == "-o" && i+1 < len(args) {
			args[i+1], found = out, true
		}
	}
	if !found {
		t.Fatalf("the build line %q has no -o", args)
	}
	gobin := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		if gobin, err = exec.LookPath("go"); err != nil {
			t.Skip("no go command")
		}
	}
	cmd := exec.Command(gobin, args[1:]...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %q: %v\n%s", env, args, err, b)
	}

	f, err := elf.Open(out)
	if err != nil {
		t.Fatalf("not an ELF binary: %v", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has an ELF interpreter (PT_INTERP): it is dynamically linked and will not run on distroless/static")
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		t.Errorf("the binary needs shared libraries %v", libs)
	}

	b, err := exec.Command(out, "-help").CombinedOutput()
	if err != nil {
		t.Fatalf("%s -help: %v\n%s", out, err, b)
	}
	if !strings.Contains(string(b), "-listen") {
		t.Errorf("-help prints no usage:\n%s", b)
	}
	if b, err := exec.Command(out, "-version").Output(); err != nil || !strings.HasPrefix(string(b), "coordinatord "+version+" ") {
		t.Errorf("%s -version: %v, printed %q; want coordinatord %s (...)", out, err, b, version)
	}
}
