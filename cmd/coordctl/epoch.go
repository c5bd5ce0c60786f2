package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/coordinatord/coordinatord/client"
)

// The restore commands: epoch shows the token epoch a replica serves in,
// restore-plan the etcdutl flags for restoring a snapshot (the operator
// procedure is in docs/RELIABILITY.md, "Restoring etcd from a backup").

const epochHelp = `Tokens are epoch * 2^48 + the etcd create revision. The epoch is 0 until
coordinatord detects that etcd was restored from a backup; it then raises it,
and every token below the floor is never valid again. PAUSED says why the
replica grants and validates nothing for now (empty while it serves).
`

func runEpoch(x *call[struct{}]) (client.Epoch, error) {
	ctx, cancel := x.bounded()
	defer cancel()
	return x.c.Epoch(ctx)
}

func printEpoch(x *call[struct{}], ep client.Epoch) int {
	if x.output == "json" { // every field, zeros too: epoch 0 while serving is an answer
		x.printJSON(struct {
			Epoch  string `json:"epoch"`
			Floor  string `json:"floor"`
			Paused string `json:"paused"`
		}{i64(ep.Epoch), i64(ep.Floor), ep.Paused})
		return exitOK
	}
	state := "serving"
	if ep.Paused != "" {
		state = "paused: " + ep.Paused
	}
	x.table([]string{"EPOCH", "FLOOR", "STATE"}, []string{strconv.FormatInt(ep.Epoch, 10), strconv.FormatInt(ep.Floor, 10), state})
	return exitOK
}

// restorePlanLine is restore-plan's command line.
type restorePlanLine struct {
	snapshot     string
	lastRevision int64
	margin       int64
}

const restorePlanHelp = `--last-revision is the highest revision etcd reached before the restore
(etcdctl endpoint status, or the etcd_debugging_mvcc_current_revision metric you
monitored); the bump then is last-revision - snapshot revision + margin. Without it, the bump is
a billion revisions (hours of writes at 100,000 a second). A plan that takes
etcd's revision (snapshot revision + bump) past 2^47 is refused: tokens carry
the revision in 48 bits, and coordinatord serves nothing once etcd passes 2^48
(reason TOKENS_EXHAUSTED), so half the space stays for the years after.

Restore with the bump. coordinatord also detects a restore without one and
raises the token epoch (the restored etcd's raft index restarts at the member
count, below what its revisions need since coordinatord's beacon), from the
first write on; but a snapshot taken before coordinatord first ran on the key
prefix holds no beacon, and only the bump keeps its tokens from coming back.
The bump is also what etcd's other clients and watchers need.
`

// defaultBump is the bump without --last-revision.
const defaultBump = 1_000_000_000

// maxPlannedRevision is the highest revision a plan may take etcd to:
// 2^47, half of what a token carries (internal/keyspace EpochShift is 48;
// coordinatord refuses to serve past 2^48 - 1).
const maxPlannedRevision = 1 << 47

// restorePlan is what restore-plan prints.
type restorePlan struct {
	Snapshot         string `json:"snapshot"`
	SnapshotRevision int64  `json:"snapshotRevision,string"`
	LastRevision     int64  `json:"lastRevision,string,omitempty"`
	BumpRevision     int64  `json:"bumpRevision,string"`
	Command          string `json:"command"`
}

func runRestorePlan(x *call[restorePlanLine]) (restorePlan, error) {
	rev, err := snapshotRevision(x.f.snapshot)
	if err != nil {
		return restorePlan{}, err
	}
	bump := int64(defaultBump)
	if x.f.lastRevision > 0 {
		if x.f.lastRevision < rev {
			return restorePlan{}, fmt.Errorf("--last-revision %d is below the snapshot's revision %d: pass the highest revision etcd reached", x.f.lastRevision, rev)
		}
		bump = x.f.lastRevision - rev + x.f.margin
	}
	if bump > maxPlannedRevision-rev {
		return restorePlan{}, fmt.Errorf("a bump of %d takes etcd's revision from the snapshot's %d past 2^47 (%d): fencing tokens carry the revision in 48 bits, and coordinatord serves nothing past 2^48; check --last-revision, and if it is right, restore with a smaller bump (coordinatord detects the restore and raises the token epoch; etcd's own watchers must start over)", bump, rev, int64(maxPlannedRevision))
	}
	return restorePlan{Snapshot: x.f.snapshot, SnapshotRevision: rev, LastRevision: x.f.lastRevision, BumpRevision: bump,
		Command: fmt.Sprintf("etcdutl snapshot restore %s --bump-revision %d --mark-compacted --data-dir NEW-DATA-DIR", x.f.snapshot, bump)}, nil
}

func printRestorePlan(x *call[restorePlanLine], p restorePlan) int {
	if x.output == "json" {
		x.printJSON(p)
		return exitOK
	}
	x.table([]string{"SNAPSHOT REVISION", "BUMP REVISION"}, []string{strconv.FormatInt(p.SnapshotRevision, 10), strconv.FormatInt(p.BumpRevision, 10)})
	fmt.Fprintln(x.stdout, p.Command)
	return exitOK
}

// snapshotRevision is the revision an etcd snapshot file was taken at: the
// greatest main revision of its "key" bucket, whose keys start with it (8
// bytes, big-endian), as etcdutl snapshot status reads it.
func snapshotRevision(path string) (int64, error) {
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return 0, fmt.Errorf("open snapshot %s: %w", path, err)
	}
	defer db.Close()
	var rev int64
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("key"))
		if b == nil {
			return errors.New("no key bucket: not an etcd v3 snapshot")
		}
		k, _ := b.Cursor().Last()
		if len(k) < 8 {
			return errors.New("no revision: an empty etcd snapshot")
		}
		rev = int64(binary.BigEndian.Uint64(k[:8]))
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("snapshot %s: %w", path, err)
	}
	return rev, nil
}

func restorePlanFlags(fs *flag.FlagSet, f *restorePlanLine) {
	fs.Int64Var(&f.lastRevision, "last-revision", 0, "the highest revision etcd reached before the restore (0: unknown)")
	fs.Int64Var(&f.margin, "margin", 1_000_000, "revisions added beyond --last-revision")
}
