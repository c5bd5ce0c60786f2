package main_test

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/coordinatord/coordinatord/internal/embedetcd"
)

// TestEpochCommand: a coordinator over an etcd never restored serves in
// epoch 0, floor 0. With -o json every field is printed, zeros too: it
// printed {} (every field omitted as zero), which a script cannot tell from
// an answer without the fields.
func TestEpochCommand(t *testing.T) {
	out := must(t, 0, "epoch").stdout
	if !strings.Contains(out, "EPOCH") || !strings.Contains(out, "serving") {
		t.Fatalf("epoch printed %q", out)
	}
	const want = `{"epoch":"0","floor":"0","paused":""}`
	if got := strings.TrimSpace(must(t, 0, "-o", "json", "epoch").stdout); got != want {
		t.Fatalf("epoch -o json printed %q, want %s (epoch 0, serving)", got, want)
	}
}

// TestRestorePlan reads a real snapshot's revision and prints the bump
// that takes revisions past --last-revision by --margin.
func TestRestorePlan(t *testing.T) {
	snap, rev := snapshotFile(t)
	var p struct {
		SnapshotRevision string `json:"snapshotRevision"`
		BumpRevision     string `json:"bumpRevision"`
		Command          string `json:"command"`
	}
	last := rev + 500
	out := must(t, 0, "-o", "json", "restore-plan", snap, "--last-revision", itoa(last), "--margin", "1000").stdout
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("%v: %q", err, out)
	}
	if p.SnapshotRevision != itoa(rev) || p.BumpRevision != "1500" || !strings.Contains(p.Command, "--bump-revision 1500 --mark-compacted") {
		t.Fatalf("restore-plan: %+v; want snapshot revision %d, bump 1500", p, rev)
	}
	if r := run(t, "restore-plan", snap, "--last-revision", "1"); r.code != 1 || !strings.Contains(r.stderr, "last-revision") {
		t.Fatalf("restore-plan with a last revision below the snapshot's: %+v", r)
	}
	if r := run(t, "restore-plan", filepath.Join(t.TempDir(), "none.db")); r.code == 0 {
		t.Fatalf("restore-plan of a missing file: %+v", r)
	}
}

// TestRestorePlanRefusesBumpsPast2To47 (issue 26, item 4): restore-plan
// recommended, for --last-revision 281474976710697, a bump that took etcd
// past 2^48, where tokens wrapped and fell. A plan that takes etcd's
// revision past 2^47 is refused (exit 1, saying why); one that stops at
// 2^47 is printed. The help no longer claims that every restore is
// detected whatever the bump (item 5): it asks for the bump.
func TestRestorePlanRefusesBumpsPast2To47(t *testing.T) {
	snap, rev := snapshotFile(t)
	const limit = int64(1) << 47
	for _, last := range []string{"281474976710697", itoa(limit - 999)} {
		r := run(t, "restore-plan", snap, "--last-revision", last, "--margin", "1000")
		if r.code != 1 || !strings.Contains(r.stderr, "2^47") || r.stdout != "" {
			t.Fatalf("restore-plan --last-revision %s: %+v; want refused (exit 1), naming 2^47", last, r)
		}
	}
	var p struct {
		BumpRevision string `json:"bumpRevision"`
	}
	out := must(t, 0, "-o", "json", "restore-plan", snap, "--last-revision", itoa(limit-1000), "--margin", "1000").stdout
	if err := json.Unmarshal([]byte(out), &p); err != nil || p.BumpRevision != itoa(limit-rev) {
		t.Fatalf("restore-plan up to 2^47: %q (%v); want bump %d", out, err, limit-rev)
	}
	help := run(t, "restore-plan", "-h")
	all := help.stdout + help.stderr
	if strings.Contains(all, "Whatever the bump") || !strings.Contains(all, "Restore with the bump") {
		t.Fatalf("restore-plan help: %q; want it to ask for the bump, not to promise detection whatever the bump", all)
	}
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// snapshotFile is a snapshot (Maintenance.Snapshot) of an etcd with a few
// writes, and the revision it was taken at.
func snapshotFile(t *testing.T) (string, int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := embedetcd.Start(ctx, t.TempDir(), embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	var rev int64
	for i := range 7 {
		r, err := cli.Put(ctx, "k", itoa(int64(i)))
		if err != nil {
			t.Fatal(err)
		}
		rev = r.Header.Revision
	}
	rc, err := cli.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	path := filepath.Join(t.TempDir(), "backup.db")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, rc); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path, rev
}
