package shard

import (
	"errors"
	"testing"
	"time"
)

// waitEnd waits for a watch to be done and returns its reason.
func waitEnd(t *testing.T, w *GrantWatch, within time.Duration) GrantEnd {
	t.Helper()
	select {
	case <-w.Done():
		return w.Reason()
	case <-time.After(within):
		t.Fatalf("the watch is not done after %v", within)
		return 0
	}
}

// A watch is told how its grant ended: released, force-released, expired;
// a watch that starts after the end learns it too; a stopped watch is
// told nothing.
func TestWatchGrantReportsEachEnd(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	watch := func(name string, token int64) *GrantWatch {
		t.Helper()
		w, err := o.WatchGrant(name, token)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Stop)
		return w
	}

	g, err := o.Acquire(ctx, acq("rel", 10*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	w := watch("rel", g.Token)
	if w.Reason() != 0 {
		t.Fatalf("reason %v before the end", w.Reason())
	}
	if ok, err := o.Release(ctx, "rel", g.Token, g.Handle, "alice"); err != nil || !ok {
		t.Fatalf("release = %v, %v", ok, err)
	}
	if r := waitEnd(t, w, 5*time.Second); r != GrantReleased {
		t.Fatalf("release reported as %v", r)
	}
	// Started after the end: remembered.
	if r := waitEnd(t, watch("rel", g.Token), time.Second); r != GrantReleased {
		t.Fatalf("a late watch of a released grant: %v", r)
	}

	g, err = o.Acquire(ctx, acq("force", 10*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	w = watch("force", g.Token)
	if ok, err := o.ForceRelease(ctx, "force", g.Token); err != nil || !ok {
		t.Fatalf("force release = %v, %v", ok, err)
	}
	if r := waitEnd(t, w, 5*time.Second); r != GrantForced {
		t.Fatalf("force release reported as %v", r)
	}

	g, err = o.Acquire(ctx, acq("exp", 300*time.Millisecond, 0))
	if err != nil {
		t.Fatal(err)
	}
	w = watch("exp", g.Token)
	if r := waitEnd(t, w, 5*time.Second); r != GrantExpired {
		t.Fatalf("expiry reported as %v", r)
	}

	// A token that never was a grant: gone at once.
	if r := waitEnd(t, watch("never", 12345), time.Second); r != GrantGone {
		t.Fatalf("a watch of no grant: %v", r)
	}

	// A stopped watch hears nothing.
	g, err = o.Acquire(ctx, acq("stopped", 10*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	w = watch("stopped", g.Token)
	w.Stop()
	if ok, err := o.Release(ctx, "stopped", g.Token, g.Handle, "alice"); err != nil || !ok {
		t.Fatalf("release = %v, %v", ok, err)
	}
	select {
	case <-w.Done():
		t.Fatal("a stopped watch was told of the end")
	case <-time.After(100 * time.Millisecond):
	}
	o.shards[o.ShardOf("stopped")].mu.Lock()
	left := len(o.shards[o.ShardOf("stopped")].ends.watches)
	o.shards[o.ShardOf("stopped")].mu.Unlock()
	if left != 0 {
		t.Fatalf("%d watched grants left in the registry", left)
	}
}

// A dropped table ends its watches with GrantDropped, not with an end of
// the grant: the grant lives on in etcd, the next table loads it, and a
// new watch follows it there. While the shard has no table, WatchGrant
// fails as every call does.
func TestWatchGrantAcrossADroppedTable(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	g, err := o.Acquire(ctx, acq("kept", 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	w, err := o.WatchGrant("kept", g.Token)
	if err != nil {
		t.Fatal(err)
	}
	n := o.ShardOf("kept")
	s := o.shards[n]
	s.mu.Lock()
	term := s.term
	s.mu.Unlock()

	o.lost(n) // as the ownership callback does
	if r := waitEnd(t, w, time.Second); r != GrantDropped {
		t.Fatalf("a dropped table reported %v", r)
	}
	if _, err := o.WatchGrant("kept", g.Token); !errors.Is(err, ErrNotServing) {
		t.Fatalf("WatchGrant while the shard has no table: %v", err)
	}

	o.acquired(n, term) // won again: loads the grant from etcd
	waitServing(t, o)
	w, err = o.WatchGrant("kept", g.Token)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	select {
	case <-w.Done():
		t.Fatalf("the reloaded grant's watch is done: %v", w.Reason())
	default:
	}
	if ok, err := o.Release(ctx, "kept", g.Token, g.Handle, "alice"); err != nil || !ok {
		t.Fatalf("release on the reloaded table = %v, %v", ok, err)
	}
	if r := waitEnd(t, w, 5*time.Second); r != GrantReleased {
		t.Fatalf("release after the reload reported as %v", r)
	}
}
