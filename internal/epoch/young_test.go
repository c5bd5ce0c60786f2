package epoch_test

import (
	"testing"
)

// TestRestoreOfAYoungSnapshotIsFound (issue 26, item 5): a snapshot taken
// before the beacon's first rewrite, restored without --bump-revision under
// a fresh coordinator (one with no memory of the lost history). The
// restored etcd's raft index restarts at the member count, as a new
// cluster's does, so it was not below half of the young beacon's index:
// the check reopened epoch 0, a new holder got the token of a holder of
// the lost history, and both validated. Now the beacon records an index no
// restored etcd reaches before it is checked, and a member whose index is
// below the entries its revisions need since the beacon shows a restore:
// the epoch is raised, the lost holder's token is refused and the new one
// is above it.
func TestRestoreOfAYoungSnapshotIsFound(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before int // grants made and released before the snapshot
	}{
		{"NothingSinceTheBeacon", 0},
		{"AFewGrants", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, m := runningMember(t)
			c := startCoord(t, m)
			for range tc.before {
				c.release(t, ctx, c.acquire(t, ctx, "a"))
			}
			snap, snapRev := m.saveSnapshot(t, ctx)

			// After the snapshot: a holder of the history the restore loses.
			lost := c.acquire(t, ctx, "a")
			c.mustValidate(t, ctx, lost, "")
			c.close()
			m.stop()
			m.start(t, m.restore(t, snap, 0))

			c = startCoord(t, m)
			defer c.close()
			g := c.acquire(t, ctx, "a")
			if g.token <= lost.token {
				t.Fatalf("token %d granted after the restore of the snapshot at revision %d is not above %d, granted before it (epoch %+v)",
					g.token, snapRev, lost.token, c.c.Epochs().Status())
			}
			c.refused(t, ctx, []grant{lost}, false)
			c.mustValidate(t, ctx, g, "")
			if st := c.c.Epochs().Status(); st.Epoch != 1 {
				t.Fatalf("status %+v after the restore, want epoch 1", st)
			}
		})
	}
}
