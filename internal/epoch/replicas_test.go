package epoch_test

import (
	"context"
	"testing"
	"time"
)

// TestRestoreTwoRunningReplicasAgree: two replicas keep running across a
// restore without a bump. Both find it; one raises the epoch, the other
// adopts it (or raises it once more): they end in the same epoch, neither
// accepts a token of the lost history meanwhile, and a token granted
// through one validates through the other.
func TestRestoreTwoRunningReplicasAgree(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m := newMember(t)
	m.start(t, t.TempDir())
	defer m.stop()
	a, b := startCoord(t, m), startCoord(t, m)
	defer a.close()
	defer b.close()

	var old []grant
	for range 20 {
		g := a.acquire(t, ctx, "a")
		b.mustValidate(t, ctx, g, "db")
		a.release(t, ctx, g)
		old = append(old, g)
	}
	held := a.acquire(t, ctx, "b")
	for _, c := range []*coord{a, b} {
		if err := c.c.Epochs().Check(ctx); err != nil {
			t.Fatal(err)
		}
	}
	snap, _ := m.saveSnapshot(t, ctx)
	b.release(t, ctx, held)
	var lost []grant
	for range 10 {
		g := b.acquire(t, ctx, "a")
		a.mustValidate(t, ctx, g, "db")
		b.release(t, ctx, g)
		lost = append(lost, g)
	}
	lost = append(lost, a.acquire(t, ctx, "b"), held)

	m.stop()
	m.start(t, m.restore(t, snap, 0))
	for deadline := time.Now().Add(20 * time.Second); ; {
		a.refused(t, ctx, lost, true)
		b.refused(t, ctx, lost, true)
		sa, sb := a.c.Epochs().Status(), b.c.Epochs().Status()
		if sa.Epoch >= 1 && sa.Epoch == sb.Epoch && sa.Paused == "" && sb.Paused == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas did not agree on a raised epoch: %+v, %+v", sa, sb)
		}
		time.Sleep(20 * time.Millisecond)
	}
	a.refused(t, ctx, append(old, lost...), true)
	b.refused(t, ctx, append(old, lost...), true)

	maxOld := int64(0)
	for _, g := range append(old, lost...) {
		maxOld = max(maxOld, g.token)
	}
	g := a.acquire(t, ctx, "a")
	if g.token <= maxOld {
		t.Fatalf("new token %d not above %d", g.token, maxOld)
	}
	b.mustValidate(t, ctx, g, "db")
	a.mustValidate(t, ctx, g, "")
}
