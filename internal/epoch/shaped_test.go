package epoch_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// acquireShaped takes a semaphore's permit (limit > 1) or a reader's hold
// (shared) of name.
func (c *coord) acquireShaped(t *testing.T, ctx context.Context, name string, limit int32, shared bool) grant {
	t.Helper()
	req := &coordinatorv1.AcquireRequest{Name: name, Ttl: durationpb.New(30 * time.Second), Wait: durationpb.New(5 * time.Second), Limit: limit}
	if shared {
		req.Mode = coordinatorv1.LockMode_LOCK_MODE_SHARED
	}
	r, err := unavailable(ctx, func() (*coordinatorv1.AcquireResponse, error) { return c.lock.Acquire(ctx, req) })
	if err != nil {
		t.Fatalf("acquire %s (limit %d, shared %v): %v", name, limit, shared, err)
	}
	return grant{name: name, handle: r.GetHandle(), token: r.GetToken()}
}

// TestRestoreSemaphoreAndReadersInTheNewEpoch: after a restore raised the
// epoch, a semaphore's permits and a read-write lock's readers are judged
// by their tokens of the new epoch (create revision plus the epoch's
// bits): every holder validates, a semaphore's permit raises the mark of
// its (resource, slot), a reader's token with a resource is refused as
// before, and the permits and readers of before the restore validate
// nowhere.
func TestRestoreSemaphoreAndReadersInTheNewEpoch(t *testing.T) {
	ctx, m := runningMember(t)
	c := startCoord(t, m)
	defer func() { c.close() }()

	var old []grant
	for range 3 {
		old = append(old, c.acquireShaped(t, ctx, "sem", 3, false))
	}
	old = append(old, c.acquireShaped(t, ctx, "rw", 0, true), c.acquireShaped(t, ctx, "rw", 0, true))
	if err := c.c.Epochs().Check(ctx); err != nil { // as the running loop does every interval
		t.Fatal(err)
	}
	snap, _ := m.saveSnapshot(t, ctx)
	c.close()
	m.stop()
	m.start(t, m.restore(t, snap, 0))
	c = startCoord(t, m)
	eventually(t, 20*time.Second, "epoch raised", func() bool {
		st := c.c.Epochs().Status()
		return st.Epoch >= 1 && st.Paused == ""
	})
	c.refused(t, ctx, old, false)

	var permits []grant
	for range 3 {
		g := c.acquireShaped(t, ctx, "sem", 3, false)
		if e, _ := keyspace.SplitToken(g.token); e != 1 {
			t.Fatalf("permit token %d: epoch %d, want 1", g.token, e)
		}
		permits = append(permits, g)
	}
	for _, g := range permits {
		c.mustValidate(t, ctx, g, "")
		c.mustValidate(t, ctx, g, "sdb") // its slot's mark of sdb
	}
	if !c.release(t, ctx, permits[1]) {
		t.Fatal("release of a permit failed")
	}
	if r, err := c.validate(ctx, permits[1], ""); err != nil || r.GetValid() {
		t.Fatalf("released permit %d: %v, %v; want invalid", permits[1].token, r, err)
	}
	c.refused(t, ctx, old, false)

	readers := []grant{c.acquireShaped(t, ctx, "rw", 0, true), c.acquireShaped(t, ctx, "rw", 0, true)}
	for _, g := range readers {
		c.mustValidate(t, ctx, g, "")
		_, err := c.validate(ctx, g, "rdb")
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("reader %d with a resource: %v, want FAILED_PRECONDITION", g.token, err)
		}
		if info := errorInfo(err); info == nil || info.GetReason() != "SHARED_HOLDER_CANNOT_FENCE" {
			t.Fatalf("reader %d with a resource: %v, want SHARED_HOLDER_CANNOT_FENCE", g.token, info)
		}
	}
}
