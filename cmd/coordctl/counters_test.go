package main_test

import (
	"strings"
	"testing"
)

// TestCounterCommands: hit counts and refuses (exit 3) at the limit,
// counter get reads without counting, counter reset deletes; bad input is a
// usage error.
func TestCounterCommands(t *testing.T) {
	hit := []string{"hit", "cli-counter/a", "--limit", "2", "--window", "1m"}
	tests := []struct {
		name string
		args []string
		code int
		want string // in stdout
	}{
		{"first hit", append([]string{"-o", "json"}, hit...), 0, `{"allowed":true,"count":"1","remaining":"1","resetAt":"`},
		{"second hit, table", hit, 0, "cli-counter/a  true     2      0"},
		{"refused", append([]string{"-o", "json"}, hit...), exitNotAcquired, `{"allowed":false,"count":"2","remaining":"0"`},
		{"peek", append([]string{"-o", "json"}, append(hit, "--hits", "0")...), exitNotAcquired, `"count":"2"`},
		{"get", []string{"-o", "json", "counter", "get", "cli-counter/a"}, 0,
			`{"exists":true,"algorithm":"ALGORITHM_FIXED_WINDOW","count":"2","limit":"2","remaining":"0","resetAt":"`},
		{"reset", []string{"-o", "json", "counter", "reset", "cli-counter/a"}, 0, `{"existed":true}`},
		{"get after reset", []string{"-o", "json", "counter", "get", "cli-counter/a"}, 0, `{"exists":false,"algorithm":"ALGORITHM_UNSPECIFIED","count":"0"`},
		{"token bucket", []string{"-o", "json", "hit", "cli-counter/b", "--limit", "5", "--window", "1s", "--token-bucket", "--hits", "5"}, 0, `"allowed":true,"count":"5"`},
		{"no limit", []string{"hit", "cli-counter/c", "--window", "1m"}, exitUsage, ""},
		{"no name", []string{"hit", "--limit", "1", "--window", "1m"}, exitUsage, ""},
		{"unknown counter command", []string{"counter", "frob"}, exitUsage, ""},
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
