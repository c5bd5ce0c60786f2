package daemon

import "testing"

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:7070": true,
		"127.0.0.2:7070": true,
		"[::1]:7070":     true,
		"localhost:7070": true,
		":7070":          false,
		"0.0.0.0:7070":   false,
		"[::]:7070":      false,
		"10.0.0.1:7070":  false,
		"example:7070":   false,
		"garbage":        false,
	} {
		if got := loopback(addr); got != want {
			t.Errorf("loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}
