package chaos_test

import (
	"context"
	"testing"
	"time"

	"github.com/coordinatord/coordinatord/internal/chaos"
)

// TestEtcdRestoreFromBackup: while the workload runs on two replicas, an
// operator saves a snapshot of etcd, lets more grants, validations and
// resource writes happen, then restores the whole cluster from that
// snapshot (every member stopped, its data replaced by `etcdutl snapshot
// restore`, started again with the same IDs), without telling the
// coordinators. The same checkers as every scenario judge the history (a
// restore's ending of grants is the one exception to safe_until), and
// CheckRestores holds every answer after the restore to the epoch: no token
// granted before it renews, releases or validates (a holder's key may be
// back from the snapshot), every token granted after it is above all of
// them. Variants: no --bump-revision (revisions go back), a bump too small
// to pass the revisions made since the snapshot (they still come again), and
// one large enough.
func TestEtcdRestoreFromBackup(t *testing.T) {
	scenario(t, false)
	for _, tc := range []struct {
		name string
		bump uint64
	}{
		{"NoBump", 0},
		{"BumpTooSmall", 2},
		{"BumpLargeEnough", 1_000_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 2)
			var restores []chaos.Restore
			var snapRev int64
			res := run{d: scale(16 * time.Second), pauseOneIn: 4, wantStale: true, restores: &restores, after: 8 * time.Second}.exec(t, e, func(ctx context.Context, w *chaos.Workload) {
				if !pause(ctx, 3*time.Second) {
					return
				}
				snap, rev, err := e.Cluster.Snapshot(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				snapRev = rev
				if !pause(ctx, 3*time.Second) {
					return
				}
				// The restore begins once no member runs: an answer after
				// that comes from the restored cluster. A real restore
				// (stop every member, etcdutl, start them) keeps etcd away
				// for longer than a replica's check interval, so the
				// replicas pause before it ends (RELIABILITY.md: the
				// residual window of a shorter one).
				e.Cluster.StopAll()
				r := chaos.Restore{Start: w.Rec.Now()}
				eventually(t, 20*time.Second, "every replica paused while etcd is away", func() bool {
					for _, rp := range e.Replicas {
						if rp.Epoch().Paused == "" {
							return false
						}
					}
					return true
				})
				if err := e.Cluster.Restore(snap, tc.bump); err != nil {
					t.Error(err)
					return
				}
				r.End = w.Rec.Now()
				restores = append(restores, r)
				t.Logf("snapshot at revision %d; restored (bump %d) in %v", rev, tc.bump, time.Duration(r.End-r.Start))
			})
			if len(restores) == 0 {
				t.Fatal("the restore did not run")
			}
			r := restores[0]
			grantsBefore, grantsAfter := 0, 0
			for _, op := range res.ops {
				if op.Kind == chaos.Acquire && op.Outcome == chaos.OK {
					switch {
					case op.Return < r.Start:
						grantsBefore++
					case op.Call > r.End:
						grantsAfter++
					}
				}
			}
			t.Logf("%d grants before the restore (snapshot at revision %d), %d after it", grantsBefore, snapRev, grantsAfter)
			if grantsBefore == 0 || grantsAfter == 0 {
				t.Fatalf("void run: %d grants before the restore, %d after", grantsBefore, grantsAfter)
			}
			for _, rp := range e.Replicas {
				if st := rp.Epoch(); st.Epoch != 1 || st.Paused != "" {
					t.Errorf("replica %d after the restore: epoch %d (paused %q), want epoch 1, serving", rp.ID, st.Epoch, st.Paused)
				}
			}
		})
	}
}
