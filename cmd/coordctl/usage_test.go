package main_test

import (
	"strings"
	"testing"
)

// TestUsageErrorsSayWhatToWrite: a duration without its unit says the unit
// is missing and what to write (the flag package said only "parse error"),
// and an unknown command or flag names the ones it is probably a typo of.
// Each is a usage error (exit 2) printed before any connection.
func TestUsageErrorsSayWhatToWrite(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string // in stderr
		not  string   // not in stderr ("" for no check)
	}{
		{"--ttl without a unit", []string{"acquire", "x", "--ttl", "10"}, []string{`invalid value "10" for flag -ttl: missing unit in duration "10": write 10s for seconds`}, "parse error"},
		{"--wait without a unit", []string{"acquire", "x", "--wait", "5"}, []string{`flag -wait: missing unit in duration "5": write 5s`}, ""},
		{"--lock-delay with a fraction", []string{"acquire", "x", "--lock-delay", "1.5"}, []string{`flag -lock-delay: missing unit in duration "1.5": write 1.5s`}, ""},
		{"exec --grace", []string{"exec", "x", "--grace", "3", "--", "true"}, []string{`flag -grace: missing unit in duration "3"`}, ""},
		{"hit --window", []string{"hit", "x", "--limit", "1", "--window", "60"}, []string{`flag -window: missing unit in duration "60": write 60s`}, ""},
		{"session open --ttl", []string{"session", "open", "--ttl", "30"}, []string{`flag -ttl: missing unit in duration "30"`}, ""},
		{"connection --timeout", []string{"--timeout", "2", "list"}, []string{`flag -timeout: missing unit in duration "2"`}, ""},
		{"not a duration at all", []string{"acquire", "x", "--ttl", "soon"}, []string{`"soon" is not a duration: write it as 30s`}, "parse error"},
		{"a typo of a command", []string{"aquire", "x"}, []string{`unknown command "aquire"; did you mean acquire?`}, ""},
		{"the start of a command", []string{"desc", "x"}, []string{`unknown command "desc"; did you mean describe?`}, ""},
		{"a swap in a group's command", []string{"session", "opne"}, []string{`coordctl session: unknown command "opne"; did you mean open?`}, ""},
		{"a typo of a counter command", []string{"counter", "rest", "x"}, []string{`did you mean reset?`}, ""},
		{"nothing like a command", []string{"frobnicate"}, []string{`unknown command "frobnicate"`}, "did you mean"},
		{"a typo of a command's flag", []string{"acquire", "x", "--tll", "3s"}, []string{"-tll", "coordctl acquire: did you mean", "--ttl"}, ""},
		{"a typo of exec's flag", []string{"exec", "x", "--gace", "3s", "--", "true"}, []string{"coordctl exec: did you mean --grace?"}, ""},
		{"a typo of a connection flag", []string{"--adr", "x", "list"}, []string{"coordctl: did you mean --addr?"}, ""},
		{"nothing like a flag", []string{"list", "--zzzzzz"}, []string{"flag provided but not defined: -zzzzzz"}, "did you mean"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := must(t, exitUsage, tt.args...)
			for _, w := range tt.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr %q: want %q in it", r.stderr, w)
				}
			}
			if tt.not != "" && strings.Contains(r.stderr, tt.not) {
				t.Errorf("stderr %q: want no %q", r.stderr, tt.not)
			}
		})
	}
	// The help names the value of every duration flag "duration", as the
	// flag package's own did (a flag type of coordctl's shows "value").
	help := must(t, 0, "acquire", "-help").stderr
	for _, f := range []string{"-ttl duration", "-wait duration", "-lock-delay duration", "-max-hold duration", "-timeout duration"} {
		if !strings.Contains(help, "  "+f+"\n") {
			t.Errorf("acquire -help lacks %q:\n%s", f, help)
		}
	}
}
