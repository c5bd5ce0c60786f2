package epoch_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// TestRestoreEndsWatchStreams: a Watch stream open across a restore of etcd
// without --bump-revision would wait for revisions the restore took back,
// and miss what the restored history does at the revisions it skips (the
// chaos suite's restore scenario saw streams resume into it and report
// revisions going back). The stream ends (OUT_OF_RANGE, EPOCH_CHANGED; or
// UNAVAILABLE, EPOCH_PAUSED if an event met the pause), a resume from the
// last revision seen + 1 answers OUT_OF_RANGE, EPOCH_CHANGED, and a new
// stream's revisions and tokens are above everything seen before it.
func TestRestoreEndsWatchStreams(t *testing.T) {
	ctx, m := runningMember(t)
	c := startCoord(t, m)
	defer c.close()
	c.release(t, ctx, c.acquire(t, ctx, "w"))
	snap, _ := m.saveSnapshot(t, ctx)

	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	stream, err := c.lock.Watch(wctx, &coordinatorv1.WatchRequest{Name: "w"})
	if err != nil {
		t.Fatal(err)
	}
	var lastRev, lastTok int64
	saw := func(ev *coordinatorv1.WatchResponse) {
		lastRev, lastTok = max(lastRev, ev.GetRevision()), max(lastTok, ev.GetHolder().GetToken())
	}
	ev, err := stream.Recv()
	if err != nil || ev.GetKind() != coordinatorv1.WatchResponse_KIND_CURRENT {
		t.Fatalf("first event: %v, %v; want CURRENT", ev, err)
	}
	saw(ev)
	// Grants after the snapshot, seen by the stream: their revisions come
	// again after the restore.
	for range 10 {
		c.release(t, ctx, c.acquire(t, ctx, "w"))
		for range 2 { // acquired, released
			if ev, err = stream.Recv(); err != nil {
				t.Fatal(err)
			}
			saw(ev)
		}
	}
	m.stop()
	m.start(t, m.restore(t, snap, 0))
	eventually(t, 20*time.Second, "epoch raised", func() bool { st := c.c.Epochs().Status(); return st.Epoch >= 1 && st.Paused == "" })

	for {
		ev, err = stream.Recv()
		if err != nil {
			break
		}
		if ev.GetRevision() <= lastRev {
			t.Fatalf("after the restore the open stream sent revision %d, not above %d: %v", ev.GetRevision(), lastRev, ev)
		}
	}
	switch reason := errorInfo(err).GetReason(); {
	case status.Code(err) == codes.OutOfRange && reason == "EPOCH_CHANGED":
	case status.Code(err) == codes.Unavailable && reason == "EPOCH_PAUSED":
	default:
		t.Fatalf("the stream open across the restore ended with %v (reason %q); want OUT_OF_RANGE, EPOCH_CHANGED", err, reason)
	}

	resumed, err := c.lock.Watch(ctx, &coordinatorv1.WatchRequest{Name: "w", StartRevision: lastRev + 1})
	if err == nil {
		_, err = resumed.Recv()
	}
	if status.Code(err) != codes.OutOfRange || errorInfo(err).GetReason() != "EPOCH_CHANGED" {
		t.Fatalf("resume from revision %d of the old epoch: %v; want OUT_OF_RANGE, EPOCH_CHANGED", lastRev+1, err)
	}

	fresh, err := c.lock.Watch(ctx, &coordinatorv1.WatchRequest{Name: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err = fresh.Recv(); err != nil || ev.GetRevision() <= lastRev {
		t.Fatalf("a new stream's first event: %v, %v; want a revision above %d", ev, err, lastRev)
	}
	g := c.acquire(t, ctx, "w")
	if ev, err = fresh.Recv(); err != nil || ev.GetKind() != coordinatorv1.WatchResponse_KIND_ACQUIRED ||
		ev.GetRevision() <= lastRev || ev.GetHolder().GetToken() != g.token || g.token <= lastTok {
		t.Fatalf("a grant after the restore: %v, %v (token %d); want ACQUIRED above revision %d and token %d", ev, err, g.token, lastRev, lastTok)
	}
	next, err := c.lock.Watch(ctx, &coordinatorv1.WatchRequest{Name: "w", StartRevision: ev.GetRevision()})
	if err != nil {
		t.Fatal(err)
	}
	if again, err := next.Recv(); err != nil || again.GetRevision() != ev.GetRevision() || again.GetHolder().GetToken() != g.token {
		t.Fatalf("resume in the new epoch from revision %d: %v, %v; want the same grant again", ev.GetRevision(), again, err)
	}
}

// TestRestoreRestartsTheLockEndWatch: the lock-end watch behind the
// hold-time metrics (coordinator.WatchEnds) reports the ends of grants made
// after a restore without --bump-revision; the lease manager's own watch,
// resumed from a revision the restore took back, waited silently.
func TestRestoreRestartsTheLockEndWatch(t *testing.T) {
	ctx, m := runningMember(t)
	c := startCoord(t, m)
	defer c.close()
	var mu sync.Mutex
	ended := map[int64]bool{}
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.c.WatchEnds(wctx, 0, func(e lease.GrantEnd) {
			mu.Lock()
			ended[e.Token] = true
			mu.Unlock()
		})
	}()
	defer func() {
		wcancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	saw := func(g grant) func() bool {
		_, rev := keyspace.SplitToken(g.token)
		return func() bool { mu.Lock(); defer mu.Unlock(); return ended[rev] }
	}
	g := c.acquire(t, ctx, "e")
	c.release(t, ctx, g)
	eventually(t, 10*time.Second, "the end of a grant before the snapshot", saw(g))
	snap, _ := m.saveSnapshot(t, ctx)
	for range 40 { // revisions the restored history does not reach again soon
		g = c.acquire(t, ctx, "e")
		c.release(t, ctx, g)
	}
	eventually(t, 10*time.Second, "the end of a grant after the snapshot", saw(g))
	m.stop()
	m.start(t, m.restore(t, snap, 0))
	eventually(t, 20*time.Second, "epoch raised", func() bool { st := c.c.Epochs().Status(); return st.Epoch >= 1 && st.Paused == "" })
	mu.Lock()
	clear(ended) // the restored history makes the lost one's revisions again
	mu.Unlock()
	g = c.acquire(t, ctx, "e")
	c.release(t, ctx, g)
	eventually(t, 15*time.Second, "the end of a grant after the restore", saw(g))
}
