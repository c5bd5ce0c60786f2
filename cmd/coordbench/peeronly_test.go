package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestPeerOnly runs -peer-only, tiny: every variant completes cycles in
// every cell, without errors, and each is reported.
func TestPeerOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and coordinatord processes")
	}
	dir := t.TempDir()
	cfg, err := parse([]string{"-peer-only", "-reps", "1", "-duration", "300ms", "-warmup", "100ms", "-clients", "2",
		"-contended", "3", "-conns", "2", "-data-dir", filepath.Join(dir, "etcd")})
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	null, _ := os.Open(os.DevNull)
	os.Stdout = null
	rep, err := peerOnly(cfg)
	os.Stdout = stdout
	null.Close()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[cell]bool{}
	for _, r := range rep.results {
		seen[r.cell] = true
		if r.errs > 0 {
			t.Errorf("%+v: %d errors", r.cell, r.errs)
		}
		if r.ops == 0 && !raceEnabled {
			t.Errorf("%+v: no cycle completed in the window", r.cell)
		}
	}
	for _, sc := range []cell{{scenario: scUncontended, clients: 2}, {scenario: scContended, clients: 3}} {
		for _, v := range []string{peerMinimal, peerNow, peerEmbedded, peerShared, peerCoord} {
			if sc.system = v; !seen[sc] {
				t.Errorf("%s, %d clients, %s: not measured", sc.scenario, sc.clients, v)
			}
		}
	}
}
