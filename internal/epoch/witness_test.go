package epoch_test

import (
	"testing"
	"time"

	"github.com/coordinatord/coordinatord/internal/coordinator"
)

// TestRestoreFoundByTheRevisionsItAnswered: a replica whose checks read
// nothing of the history after the snapshot (here: its first check, before
// the grants; in production the grants of the second before a restore)
// still finds the restore at its next check, because the revisions of the
// answers it gave count (epoch.Keeper.Witness, fed by the coordinator's
// etcd client). Before, only what checks read counted, and a short
// history does not move etcd's raft index enough to show the restore: the
// check reopened epoch 0, and the restored history issued the tokens of
// the lost one again (the chaos suite's restore scenario saw a release of
// a holder whose key came back answer released=true).
func TestRestoreFoundByTheRevisionsItAnswered(t *testing.T) {
	ctx, m := runningMember(t)
	// Checks only at start and when asked (Check).
	c := startCoord(t, m, coordinator.WithEpochInterval(time.Hour))
	defer c.close()

	snap, snapRev := m.saveSnapshot(t, ctx)
	var lost []grant
	for range 5 {
		g := c.acquire(t, ctx, "a")
		lost = append(lost, g)
		c.release(t, ctx, g)
	}
	m.stop()
	m.start(t, m.restore(t, snap, 0))
	if rev := m.revision(t, ctx); rev > lost[0].token {
		t.Fatalf("restored revision %d is above the lost token %d: no token can come again", rev, lost[0].token)
	}
	if err := c.c.Epochs().Check(ctx); err != nil {
		t.Fatal(err)
	}
	if st := c.c.Epochs().Status(); st.Epoch != 1 || st.Paused != "" {
		t.Fatalf("after the restore to the snapshot at revision %d (tokens %d..%d granted since): epoch %d (paused %q); want epoch 1",
			snapRev, lost[0].token, lost[len(lost)-1].token, st.Epoch, st.Paused)
	}
	if g := c.acquire(t, ctx, "a"); g.token <= lost[len(lost)-1].token {
		t.Fatalf("token %d granted after the restore, not above %d granted before it", g.token, lost[len(lost)-1].token)
	}
}
