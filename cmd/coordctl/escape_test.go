package main_test

import (
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// Strings a server could send that would act on a terminal or on a reader
// of coordctl's tables: forge a row, rewrite or erase a line, hide text,
// reverse it, or add a column.
var hostileStrings = map[string]string{
	"newline forging a row": "evil\nforged/lock  9  root  2026-12-01T10:00:00.000Z",
	"carriage return":       "evil\rforged",
	"ANSI erase line":       "evil\x1b[2K\x1b[1Gforged",
	"ANSI conceal":          "evil\x1b[8mhidden\x1b[0m",
	"C1 CSI":                "evil\u009b31mred",
	"tab adding a column":   "evil\tforged",
	"bidi override":         "evil\u202egnp.exe",
	"zero-width space":      "evil\u200bsplit",
	"backspaces":            "evil\b\b\b\bgood",
}

// wantInert checks that out holds no rune a terminal acts on (no control
// character but the newlines ending rows, no format rune, valid UTF-8),
// has exactly lines lines, and shows each of shown Go-quoted.
func wantInert(t *testing.T, what, out string, lines int, shown ...string) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Errorf("%s: output is not valid UTF-8: %q", what, out)
	}
	for _, r := range out {
		if r != '\n' && !unicode.IsPrint(r) {
			t.Errorf("%s: output holds %U, which a terminal may act on:\n%q", what, r, out)
			break
		}
	}
	if n := strings.Count(out, "\n"); n != lines {
		t.Errorf("%s: %d lines, want %d (a string added or hid a row):\n%s", what, n, lines, out)
	}
	for _, s := range shown {
		if !strings.Contains(out, strconv.Quote(s)) {
			t.Errorf("%s: %q is not shown Go-quoted as %s:\n%s", what, s, strconv.Quote(s), out)
		}
	}
}

// TestTablesEscapeServerStrings: whatever a server answers, coordctl's
// tables and messages show names, owners, handles and error messages as
// inert text, one row per record.
func TestTablesEscapeServerStrings(t *testing.T) {
	for what, s := range hostileStrings {
		t.Run(what, func(t *testing.T) {
			a := startHostile(t, &hostileServer{names: []string{"a/" + s, "b/" + s}, owner: s, handle: s, message: s})
			c := []string{"--addr", a, "--timeout", "5s"}
			r := must(t, 0, append(c, "list")...)
			wantInert(t, "list", r.stdout, 3, "a/"+s, "b/"+s, s)
			r = must(t, 0, append(c, "describe", "a/"+s)...)
			wantInert(t, "describe", r.stdout, 3, "a/"+s, s)
			r = must(t, 0, append(c, "watch", "a/"+s, "--count", "1")...)
			wantInert(t, "watch", r.stdout, 2, s)
			r = must(t, 0, append(c, "acquire", "a/"+s, "--wait", "0s", "--owner", "x")...)
			wantInert(t, "acquire", r.stdout, 2, "a/"+s, s)
			r = must(t, exitNotValid, append(c, "force-release", "a/"+s, "7")...) // FAILED_PRECONDITION with s as its message
			wantInert(t, "an error message", r.stderr, 1, "FAILED_PRECONDITION: "+s)
		})
	}
}

// TestTablesShowPlainStringsAsTheyAre: escaping is for what would act on a
// terminal; names and owners with spaces, quotes inside, or non-ASCII
// letters are shown as they are. Only a string that starts with a double
// quote is quoted although it is printable: a quoted cell always starts
// with one, a plain cell never does, so a name cannot pass for the escaped
// form of another.
func TestTablesShowPlainStringsAsTheyAre(t *testing.T) {
	owner := `coordctl@host pid 42 "night" ünïcødé 日本`
	a := startHostile(t, &hostileServer{names: []string{"jobs/é t'é", `"a\x1b"`}, owner: owner})
	r := must(t, 0, "--addr", a, "list")
	if !strings.Contains(r.stdout, "\njobs/é t'é  ") || !strings.Contains(r.stdout, "  "+owner+"  ") || !strings.Contains(r.stdout, "\n"+`"\"a\\x1b\""  `) {
		t.Fatalf("list:\n%s", r.stdout)
	}
}
