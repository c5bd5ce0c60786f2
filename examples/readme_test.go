package examples_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the output blocks of docs/WALKTHROUGH.md (the grpcurl walkthrough) with what its commands print")

// walkthroughFile holds the grpcurl walkthrough (it was the README's).
const walkthroughFile = "docs/WALKTHROUGH.md"

// block is one fenced code block of the walkthrough.
type block struct {
	lang string
	body string
}

// walkthrough returns the fenced blocks of docs/WALKTHROUGH.md's "Walkthrough with
// grpcurl" section, in order.
func walkthrough(t *testing.T) []block {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(repoRoot, walkthroughFile))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Walkthrough with grpcurl\n")
	if !ok {
		t.Fatal(`docs/WALKTHROUGH.md has no "## Walkthrough with grpcurl" section`)
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	var blocks []block
	var cur *block
	for _, line := range strings.SplitAfter(section, "\n") {
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &block{lang: strings.TrimSpace(strings.TrimPrefix(line, "```"))}
		case cur != nil && strings.TrimSpace(line) == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.body += line
		}
	}
	if cur != nil {
		t.Fatal("docs/WALKTHROUGH.md walkthrough: unterminated code block")
	}
	return blocks
}

// step is one ```sh block of the walkthrough and the output block after it.
type step struct {
	commands string
	want     string
}

// steps pairs every ```sh block with the next block, its documented output.
func steps(t *testing.T, blocks []block) []step {
	t.Helper()
	var out []step
	for i := 0; i < len(blocks); i++ {
		if blocks[i].lang != "sh" {
			t.Fatalf("docs/WALKTHROUGH.md walkthrough: a %q block without a ```sh block before it:\n%s", blocks[i].lang, blocks[i].body)
		}
		s := step{commands: blocks[i].body}
		if i+1 < len(blocks) && blocks[i+1].lang != "sh" {
			i++
			s.want = blocks[i].body
		}
		out = append(out, s)
	}
	if len(out) < 6 {
		t.Fatalf("docs/WALKTHROUGH.md walkthrough: %d ```sh blocks, want the full walkthrough", len(out))
	}
	return out
}

var (
	timestampRE = regexp.MustCompile(`"\d{4}-\d\d-\d\dT[0-9:.]+Z"`)
	handleRE    = regexp.MustCompile(`"handle": "[^"]*"`)
	numberRE    = regexp.MustCompile(`\d+`)
)

// normalize blanks out what differs from run to run (times, handles, tokens,
// lease ids, the TTL left), so that the shape and every word of an output can
// be compared with the README's.
func normalize(s string) string {
	s = timestampRE.ReplaceAllString(s, `"<time>"`)
	s = handleRE.ReplaceAllString(s, `"handle": "<handle>"`)
	s = numberRE.ReplaceAllString(s, "<n>")
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		lines = append(lines, strings.TrimRight(l, " \t"))
	}
	return strings.Trim(strings.Join(lines, "\n"), "\n")
}

// leaseIDRE is a normalized leaseId line of an AcquireResponse.
var leaseIDRE = regexp.MustCompile(`(?m)^ *"leaseId": "<n>",\n`)

// onTestCore is the walkthrough's normalized output as the tests' core
// prints it: the shard core backs no grant with an etcd lease of its own,
// so its AcquireResponse has no leaseId (informational, the queue core's).
func onTestCore(want string) string {
	if !sharded() {
		return want
	}
	return leaseIDRE.ReplaceAllString(want, "")
}

// TestReadmeGrpcurlWalkthrough runs the ```sh blocks of the README's grpcurl
// walkthrough, in one shell as the README says, against a live daemon (its
// address substituted for 127.0.0.1:7070), and compares each block's output
// with the block the README shows after it, then checks the tokens.
func TestReadmeGrpcurlWalkthrough(t *testing.T) {
	st := steps(t, walkthrough(t))

	// The README's `make grpcurl` line installs bin/grpcurl if missing (a
	// cold compile takes minutes: .ci/run runs it before the tests).
	var script strings.Builder
	for i, s := range st {
		for _, line := range strings.Split(s.commands, "\n") {
			if strings.HasPrefix(line, "make ") {
				if _, err := os.Stat(filepath.Join(repoRoot, "bin", "grpcurl")); err != nil && testing.Short() {
					t.Skip("bin/grpcurl is not built and -short is set: run make grpcurl")
				}
				cmd := exec.Command("bash", "-c", line)
				cmd.Dir = repoRoot
				if out, err := cmd.CombinedOutput(); err != nil {
					if _, lerr := exec.LookPath("make"); lerr != nil {
						skipOrFail(t, "make not found: the walkthrough installs grpcurl with make grpcurl")
					}
					t.Fatalf("%s: %v\n%s", line, err, out)
				}
				continue
			}
			script.WriteString(line + "\n")
		}
		fmt.Fprintf(&script, "echo '@@end of step %d@@'\n", i)
	}

	addr := startDaemon(t)
	src := strings.ReplaceAll(script.String(), "127.0.0.1:7070", addr)
	if strings.Count(src, addr) < 10 {
		t.Fatalf("the walkthrough names 127.0.0.1:7070 only %d times: did the README change its address?", strings.Count(src, addr))
	}
	var out bytes.Buffer
	cmd := exec.Command("bash", "--noprofile", "--norc")
	cmd.Dir = repoRoot
	cmd.Stdin = strings.NewReader(src)
	cmd.Stdout, cmd.Stderr = &out, &out // one pipe: the order of stdout and stderr is kept
	cmd.WaitDelay = 5 * time.Second
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("walkthrough: %v\n%s", err, out.String())
		}
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Logf("walkthrough killed: %v", <-done)
		t.Fatalf("walkthrough still running after 60s:\n%s", out.String())
	}

	got := strings.Split(out.String(), "\n")
	outputs := make([]string, len(st))
	i := 0
	for _, line := range got {
		if line == fmt.Sprintf("@@end of step %d@@", i) {
			i++
			continue
		}
		if i < len(outputs) {
			outputs[i] += line + "\n"
		}
	}
	if i != len(st) {
		t.Fatalf("walkthrough ended after step %d of %d:\n%s", i, len(st), out.String())
	}
	if *update {
		updateReadme(t, st, outputs)
		return
	}
	for i, s := range st {
		if g, w := normalize(outputs[i]), onTestCore(normalize(s.want)); g != w {
			t.Errorf("README walkthrough step %d:\n%s\nprinted:\n%s\nREADME shows:\n%s\n(numbers, times and handles blanked as <n>, <time>, <handle>; "+
				"if the new output is right: go test ./examples/ -run TestReadmeGrpcurlWalkthrough -update)",
				i+1, s.commands, outputs[i], s.want)
		}
	}

	// The numbers the shapes cannot check: the tokens.
	all := out.String()
	token := first(t, all, `"token": "(\d+)"`)
	for _, re := range []string{
		`(?s)"valid": true,\s*"reason": "REASON_CURRENT",\s*"currentToken": "(\d+)"`, // ValidateToken
		`held by token (\d+)`,                 // the try-lock's message
		`"holderToken": "(\d+)"`,              // its ErrorInfo
		`(?s)"holder": \{.*?"token": "(\d+)"`, // Describe
		`host-a token (\d+), host-b token`,    // the last step's echo
	} {
		if n := first(t, all, re); n != token {
			t.Errorf("%s: token %d, want host-a's token %d", re, n, token)
		}
	}
	tokenB := first(t, all, `host-a token \d+, host-b token (\d+)`)
	if tokenB <= token {
		t.Errorf("host-b's token %d not greater than host-a's %d", tokenB, token)
	}
	if n := first(t, all, `(?s)"reason": "REASON_SUPERSEDED",\s*"currentToken": "(\d+)"`); n != tokenB {
		t.Errorf("REASON_SUPERSEDED names current token %d, want host-b's %d", n, tokenB)
	}
	if t.Failed() {
		t.Logf("walkthrough output:\n%s", all)
	}
}

// first returns the integer of re's first submatch in s.
func first(t *testing.T, s, re string) int64 {
	t.Helper()
	m := regexp.MustCompile(re).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("walkthrough output has no match for %s:\n%s", re, s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// updateReadme replaces the output block after each ```sh block of the
// walkthrough with outputs[i], what step i printed (go test -update).
func updateReadme(t *testing.T, st []step, outputs []string) {
	t.Helper()
	path := filepath.Join(repoRoot, walkthroughFile)
	readme, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	at := strings.Index(text, "\n## Walkthrough with grpcurl\n")
	for i, s := range st {
		at += strings.Index(text[at:], s.commands) + len(s.commands)
		if s.want == "" {
			continue
		}
		j := strings.Index(text[at:], s.want)
		if j < 0 {
			t.Fatalf("docs/WALKTHROUGH.md: output block of step %d not found", i+1)
		}
		got := strings.Trim(outputs[i], "\n") + "\n"
		text = text[:at+j] + got + text[at+j+len(s.want):]
		at += j + len(got)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("rewrote the walkthrough's output blocks in %s: review the diff", path)
}
