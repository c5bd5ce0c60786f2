package chaos_test

import (
	"context"
	"testing"
	"time"

	"github.com/coordinatord/coordinatord/internal/chaos"
)

// TestSemaphoreAndReadWriteLockThroughLeaderKill: a semaphore of 3, a
// read-write lock (readers and writers at random) and a mutex, 4 clients
// each, through an etcd leader's kill and restart: the history is
// linearizable under the model's N holders and shared holders, and the
// register accepts the read-write lock's writers only in token order.
func TestSemaphoreAndReadWriteLockThroughLeaderKill(t *testing.T) {
	scenario(t, false)
	e := newEnv(t, 2)
	kinds := map[string]chaos.NameKind{"sem": {Limit: 3}, "rw": {ReadWrite: true}}
	res := run{d: scale(10 * time.Second), names: []string{"sem", "rw", "m"}, perName: 4, pauseOneIn: 3, wantStale: true, kinds: kinds}.exec(t, e,
		func(ctx context.Context, _ *chaos.Workload) {
			if !pause(ctx, 3*time.Second) {
				return
			}
			l, err := e.Cluster.KillLeader()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("killed leader m%d", l)
			if !pause(ctx, 2*time.Second) {
				return
			}
			if err := e.Cluster.RestartMember(l); err != nil {
				t.Fatal(err)
			}
		})
	// Not void: the semaphore had several holders at once and the
	// read-write lock both kinds of grant.
	var semGrants, readers, writers int
	for _, op := range res.ops {
		if op.Kind != chaos.Acquire || op.Outcome != chaos.OK {
			continue
		}
		switch {
		case op.Name == "sem":
			semGrants++
		case op.Name == "rw" && op.Shared:
			readers++
		case op.Name == "rw":
			writers++
		}
	}
	t.Logf("semaphore grants %d, readers %d, writers %d", semGrants, readers, writers)
	if semGrants == 0 || readers == 0 || writers == 0 {
		t.Fatalf("void run: semaphore grants %d, readers %d, writers %d", semGrants, readers, writers)
	}
}
