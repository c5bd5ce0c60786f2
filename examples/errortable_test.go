package examples_test

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

var (
	// protoReason is a value of enum ErrorReason in errors.proto.
	protoReason = regexp.MustCompile(`^\s*ERROR_REASON_([A-Z_]+)\s*=\s*\d+;`)
	// upperCode is a reason or a gRPC code in backquotes (metadata keys are
	// lowerCamel).
	upperCode = regexp.MustCompile("`([A-Z][A-Z_]*)`")
	// grpcCode is a gRPC code's name as the proto comments write it.
	grpcCode = regexp.MustCompile(`^[A-Z_]+$`)
)

// errorRow is one row of docs/CONCEPTS.md's error table.
type errorRow struct {
	line  int
	codes []string
	todo  string
}

// TestDocsErrorTableListsEveryReason: docs/CONCEPTS.md's error table has a
// row for every reason of ErrorReason (the generated Go's
// ErrorReason_name), with the code errors.proto fixes for it and what to
// do, and names no reason the enum lacks: it missed the reasons added
// after it was written (SHARD_NOT_SERVED, NOT_ON_SHARD_CORE,
// TOKENS_EXHAUSTED...).
func TestDocsErrorTableListsEveryReason(t *testing.T) {
	rows := conceptsErrorTable(t)
	codes := reasonCodes(t)
	var reasons []string // the enum's, but UNSPECIFIED (never sent)
	for n, full := range coordinatorv1.ErrorReason_name {
		if n != int32(coordinatorv1.ErrorReason_ERROR_REASON_UNSPECIFIED) {
			reasons = append(reasons, strings.TrimPrefix(full, "ERROR_REASON_"))
		}
	}
	slices.Sort(reasons)
	for _, r := range reasons {
		row, ok := rows[r]
		if !ok {
			t.Errorf("docs/CONCEPTS.md: the error table has no row for %s (code %s)", r, strings.Join(codes[r], " or "))
			continue
		}
		if len(codes[r]) == 0 {
			t.Errorf("errors.proto: the comment of ERROR_REASON_%s does not start with its code (\"CODE: ...\")", r)
		}
		for _, c := range codes[r] {
			if !slices.Contains(row.codes, c) {
				t.Errorf("docs/CONCEPTS.md:%d: %s has code %v, errors.proto says %s", row.line, r, row.codes, c)
			}
		}
		if row.todo == "" {
			t.Errorf("docs/CONCEPTS.md:%d: %s does not say what to do", row.line, r)
		}
	}
	for r, row := range rows {
		if !slices.Contains(reasons, r) {
			t.Errorf("docs/CONCEPTS.md:%d: %s is no reason of ErrorReason", row.line, r)
		}
	}
}

// conceptsErrorTable reads the error table of docs/CONCEPTS.md (the one
// with the columns "reason (metadata)", "code" and "what to do"): each
// reason it names in backquotes, with its row's codes and what to do.
func conceptsErrorTable(t *testing.T) map[string]errorRow {
	t.Helper()
	lines := readLines(t, filepath.Join(repoRoot, "docs", "CONCEPTS.md"))
	start := slices.IndexFunc(lines, func(l string) bool {
		c := cells(l)
		return strings.HasPrefix(l, "|") && slices.Contains(c, "reason (metadata)") && slices.Contains(c, "code")
	})
	if start < 0 {
		t.Fatal(`docs/CONCEPTS.md has no table with the columns "reason (metadata)" and "code"`)
	}
	head := cells(lines[start])
	reasonCol, codeCol, todoCol := slices.Index(head, "reason (metadata)"), slices.Index(head, "code"), slices.Index(head, "what to do")
	if todoCol < 0 {
		t.Errorf("docs/CONCEPTS.md:%d: the error table has no \"what to do\" column: %q", start+1, head)
	}
	rows := map[string]errorRow{}
	for i := start + 2; i < len(lines) && strings.HasPrefix(lines[i], "|"); i++ {
		c := cells(lines[i])
		if len(c) != len(head) {
			t.Errorf("docs/CONCEPTS.md:%d: %d cells, the header has %d", i+1, len(c), len(head))
			continue
		}
		row := errorRow{line: i + 1}
		if todoCol >= 0 {
			row.todo = c[todoCol]
		}
		for _, m := range upperCode.FindAllStringSubmatch(c[codeCol], -1) {
			row.codes = append(row.codes, m[1])
		}
		for _, m := range upperCode.FindAllStringSubmatch(c[reasonCol], -1) {
			if prev, dup := rows[m[1]]; dup {
				t.Errorf("docs/CONCEPTS.md:%d: %s has a row already (line %d)", i+1, m[1], prev.line)
			}
			rows[m[1]] = row
		}
	}
	return rows
}

// reasonCodes reads errors.proto: each reason's gRPC codes, as the first
// line of its comment names them ("NOT_FOUND: ...", "UNAUTHENTICATED or
// PERMISSION_DENIED: ...").
func reasonCodes(t *testing.T) map[string][]string {
	t.Helper()
	codes := map[string][]string{}
	var comment []string
	for _, l := range readLines(t, filepath.Join(repoRoot, "api", "coordinator", "v1", "errors.proto")) {
		text, isComment := strings.CutPrefix(strings.TrimSpace(l), "//")
		switch m := protoReason.FindStringSubmatch(l); {
		case isComment:
			comment = append(comment, strings.TrimSpace(text))
		case m != nil && len(comment) > 0:
			prefix, _, ok := strings.Cut(comment[0], ":")
			for _, c := range strings.Split(prefix, " or ") {
				if ok && grpcCode.MatchString(c) {
					codes[m[1]] = append(codes[m[1]], c)
				}
			}
			comment = nil
		default:
			comment = nil
		}
	}
	return codes
}

// cells are the cells of a Markdown table row, trimmed.
func cells(row string) []string {
	c := strings.Split(strings.Trim(strings.TrimSpace(row), "|"), "|")
	for i := range c {
		c[i] = strings.TrimSpace(c[i])
	}
	return c
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		lines = append(lines, s.Text())
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}
