package main_test

import (
	"strconv"
	"strings"
	"testing"
)

// TestMarksCommands: marks list and get show the mark a validate raised;
// an admin rebinds and deletes it; each error exits as documented.
func TestMarksCommands(t *testing.T) {
	a := acquire(t, "cli/marks-lock")
	must(t, 0, "validate", "cli/marks-lock", a.token, "--resource", "cli-marks/res")
	defer must(t, 0, "release", "cli/marks-lock", a.token, a.handle)

	mark := `"mark":{"resource":"cli-marks/res","token":"` + a.token + `","lock":`
	tests := []struct {
		name string
		args []string
		code int
		want string // in stdout
	}{
		{"list", []string{"-o", "json", "marks", "list", "cli-marks/"}, 0, `{"marks":[{"resource":"cli-marks/res","token":"` + a.token + `","lock":"cli/marks-lock","updatedAt":"`},
		{"list table", []string{"marks", "list", "cli-marks/"}, 0, "cli-marks/res  -     " + a.token},
		{"list nothing", []string{"-o", "json", "marks", "list", "cli-marks/none/"}, 0, `{"marks":[]}`},
		{"get", []string{"-o", "json", "marks", "get", "cli-marks/res"}, 0, mark + `"cli/marks-lock"`},
		{"get missing", []string{"marks", "get", "cli-marks/none"}, exitNotValid, ""},
		{"get without RESOURCE", []string{"marks", "get"}, exitUsage, ""},
		{"rebind", []string{"-o", "json", "marks", "rebind", "cli-marks/res", "cli/marks-other"}, 0, mark + `"cli/marks-other"`},
		{"rebind without LOCK", []string{"marks", "rebind", "cli-marks/res"}, exitUsage, ""},
		{"delete", []string{"-o", "json", "marks", "delete", "cli-marks/res"}, 0, mark + `"cli/marks-other"`},
		{"delete again", []string{"marks", "delete", "cli-marks/res"}, exitNotValid, ""},
		{"unknown marks command", []string{"marks", "frob"}, exitUsage, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, tt.args...)
			if r.code != tt.code || !strings.Contains(r.stdout, tt.want) {
				t.Fatalf("exit %d, want %d; stdout %q, want %q in it; stderr %s", r.code, tt.code, r.stdout, tt.want, r.stderr)
			}
		})
	}
}

// TestTypoPrintsShortUsage: an unknown command or a bad flag prints the
// synopsis and where the help is, not the whole help; -help still does.
func TestTypoPrintsShortUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // the usage's first line
		help string // where the help is
	}{
		{"unknown command", []string{"aquire", "x"}, "Usage: coordctl [connection flags] COMMAND", "run 'coordctl help'"},
		{"bad connection flag", []string{"--adr", "x", "list"}, "Usage: coordctl [connection flags] COMMAND", "run 'coordctl help'"},
		{"bad command flag", []string{"acquire", "x", "--tll", "3s"}, "Usage: coordctl acquire NAME", "run 'coordctl help acquire'"},
		{"bad value", []string{"acquire", "x", "--ttl", "soon"}, "Usage: coordctl acquire NAME", "run 'coordctl help acquire'"},
		{"too many arguments", []string{"describe", "a", "b"}, "Usage: coordctl describe NAME", "run 'coordctl help describe'"},
		{"bad flag of a group's command", []string{"session", "open", "--tl", "3s"}, "Usage: coordctl session open", "run 'coordctl help session open'"},
		{"unknown group command", []string{"session", "opne"}, "Usage:", "run 'coordctl help session CMD'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := must(t, exitUsage, tt.args...)
			if !strings.Contains(r.stderr, tt.want) || !strings.Contains(r.stderr, tt.help) {
				t.Errorf("stderr %q: want %q and %q", r.stderr, tt.want, tt.help)
			}
			if n := strings.Count(r.stderr, "\n"); n > 6 || strings.Contains(r.stderr, "Exit codes") || strings.Contains(r.stderr, "Flags:") {
				t.Errorf("a typo printed %d lines, the whole help:\n%s", n, r.stderr)
			}
		})
	}
	if r := must(t, 0, "acquire", "-help"); !strings.Contains(r.stderr, "Flags:") || !strings.Contains(r.stderr, "Exit codes") {
		t.Errorf("acquire -help is not the whole help:\n%s", r.stderr)
	}
	if r := must(t, 0, "help", "marks"); !strings.Contains(r.stdout, "coordctl marks rebind RESOURCE LOCK") {
		t.Errorf("help marks:\n%s", r.stdout)
	}
}

// TestMarksOfSemaphoreSlots: a semaphore's holders raise one mark per
// (resource, slot); marks list shows each under its resource with its slot,
// and --slot reaches it in marks get, rebind and delete.
func TestMarksOfSemaphoreSlots(t *testing.T) {
	tok, slot := semaphoreMark(t, "cli/slot-marks", "cli-slot-marks/res")

	mark := `{"resource":"cli-slot-marks/res","token":"` + tok + `","lock":`
	tests := []struct {
		name string
		args []string
		code int
		want string // in stdout
	}{
		{"list", []string{"-o", "json", "marks", "list", "cli-slot-marks/"}, 0, mark + `"cli/slot-marks","updatedAt":"`},
		{"list shows the slot", []string{"-o", "json", "marks", "list", "cli-slot-marks/"}, 0, `"slot":` + slot + `}`},
		{"list table", []string{"marks", "list", "cli-slot-marks/"}, 0, "cli-slot-marks/res  " + slot + "     " + tok},
		{"the resource's own mark", []string{"marks", "get", "cli-slot-marks/res"}, exitNotValid, ""},
		{"get", []string{"-o", "json", "marks", "get", "cli-slot-marks/res", "--slot", slot}, 0, `"slot":` + slot},
		{"bad slot", []string{"marks", "get", "cli-slot-marks/res", "--slot", "one"}, exitUsage, ""},
		{"negative slot", []string{"marks", "get", "cli-slot-marks/res", "--slot", "-1"}, exitUsage, ""},
		{"rebind", []string{"-o", "json", "marks", "rebind", "cli-slot-marks/res", "cli/slot-other", "--slot", slot}, 0, `"mark":` + mark + `"cli/slot-other"`},
		{"delete", []string{"-o", "json", "marks", "delete", "cli-slot-marks/res", "--slot", slot}, 0, `"mark":` + mark + `"cli/slot-other"`},
		{"delete again", []string{"marks", "delete", "cli-slot-marks/res", "--slot", slot}, exitNotValid, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, tt.args...)
			if r.code != tt.code || !strings.Contains(r.stdout, tt.want) {
				t.Fatalf("exit %d, want %d; stdout %q, want %q in it; stderr %s", r.code, tt.code, r.stdout, tt.want, r.stderr)
			}
		})
	}
}

// semaphoreMark acquires a permit of the semaphore name (2 permits),
// validates its token against resource, and releases it at the test's end;
// it returns the token and slot as coordctl prints them.
func semaphoreMark(t *testing.T, name, resource string) (token, slot string) {
	t.Helper()
	m := decode(t, must(t, 0, "-o", "json", "acquire", name, "--limit", "2", "--ttl", "1m"))
	token, _ = m["token"].(string)
	h, _ := m["handle"].(string)
	n, ok := m["slot"].(float64) // set for a semaphore's permit, slot 0 too
	if !ok {
		t.Fatalf("acquire --limit 2: no slot in %v", m)
	}
	must(t, 0, "validate", name, token, "--resource", resource)
	t.Cleanup(func() { must(t, 0, "release", name, token, h) })
	return token, strconv.Itoa(int(n))
}
