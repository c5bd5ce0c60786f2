package epoch_test

import (
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/coordinator"
	"github.com/coordinatord/coordinatord/internal/epoch"
	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// TestRevisionsPast2To48AreRefusedNotWrapped (issue 26, item 4): etcd,
// restored once before (epoch 1), restored again with a --bump-revision
// that takes its revision to just below 2^48, as `coordctl restore-plan
// --last-revision 281474976710697` recommended. Tokens carry the revision
// in 48 bits: the grants past 2^48 - 1 made tokens below the earlier ones
// (562949953421299, then 281474976710697), and Release answered
// released=false, KeepAlive NOT_FOUND. Now, on both cores, every token
// answered is above the one before and every grant answered is released;
// once etcd's revision is past 2^48 - 1, Acquire (and every other call)
// answers FAILED_PRECONDITION, reason TOKENS_EXHAUSTED, and the replica
// shows no headroom and says why it serves nothing.
func TestRevisionsPast2To48AreRefusedNotWrapped(t *testing.T) {
	for _, core := range []string{"queue", "shard"} {
		t.Run(core, func(t *testing.T) { revisionsPast2To48(t, core) })
	}
}

func revisionsPast2To48(t *testing.T, core string) {
	ctx, m := runningMember(t)
	cli, err := clientv3.New(m.clientConfig())
	if err != nil {
		t.Fatal(err)
	}
	_, err = cli.Put(ctx, keyspace.New(prefix).Epoch(), `{"epoch":1,"state":"ready"}`)
	cli.Close()
	if err != nil {
		t.Fatal(err)
	}
	snap, snapRev := m.saveSnapshot(t, ctx)
	m.stop()
	// Room for the coordinator's start (the beacon; the shard core's
	// campaigns) and a few grants and releases.
	const room = 40
	m.start(t, m.restore(t, snap, uint64(epoch.MaxRevision-room-snapRev)))

	var opts []coordinator.Option
	if core == "shard" {
		opts = append(opts, coordinator.WithShardCore(shard.WithShards(4), shard.WithLeaseTTL(2*time.Second)))
	}
	c := startCoord(t, m, opts...)
	defer c.close()

	exhausted := func(what string, err error) bool {
		t.Helper()
		if err == nil {
			return false
		}
		if status.Code(err) != codes.FailedPrecondition || errorInfo(err).GetReason() != "TOKENS_EXHAUSTED" {
			t.Fatalf("%s: %v; want FAILED_PRECONDITION, TOKENS_EXHAUSTED", what, err)
		}
		return true
	}
	var last int64
	granted := 0
	for i := 0; ; i++ {
		if i > 2*room {
			t.Fatalf("etcd's revision never passed 2^48 - 1 (%d grants; status %+v)", granted, c.c.Epochs().Status())
		}
		g, err := unavailable(ctx, func() (*coordinatorv1.AcquireResponse, error) {
			return c.lock.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "a", Ttl: durationpb.New(30 * time.Second), Wait: durationpb.New(5 * time.Second)})
		})
		if exhausted("Acquire", err) {
			break
		}
		granted++
		if g.GetToken() <= last || g.GetToken() < keyspace.EpochFloor(1) || g.GetToken() >= keyspace.EpochFloor(2) {
			t.Fatalf("grant %d: token %d after %d; want above it, in epoch 1", granted, g.GetToken(), last)
		}
		last = g.GetToken()
		r, err := unavailable(ctx, func() (*coordinatorv1.ReleaseResponse, error) {
			return c.lock.Release(ctx, &coordinatorv1.ReleaseRequest{Name: "a", Token: g.GetToken(), Handle: g.GetHandle()})
		})
		if exhausted("Release", err) {
			break
		}
		if !r.GetReleased() {
			t.Fatalf("release of the grant with token %d: released=false", g.GetToken())
		}
	}
	t.Logf("%d grants, the last token %d; then refused: %+v", granted, last, c.c.Epochs().Status())
	if granted == 0 {
		t.Fatal("no grant before the revisions ran out: the start used up the room")
	}
	_, err = c.validate(ctx, grant{name: "a", token: last}, "")
	if !exhausted("ValidateToken", err) {
		t.Fatal("ValidateToken answered once etcd's revision passed 2^48 - 1")
	}
	if st := c.c.Epochs().Status(); st.Headroom != 0 || st.Revision <= epoch.MaxRevision || !strings.Contains(st.Paused, "2^48") {
		t.Fatalf("status %+v; want no headroom and why nothing is served", st)
	}
}
