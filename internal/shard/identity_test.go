package shard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// slotsOf counts the slots of identity's count etcd holds.
func slotsOf(t *testing.T, cli *clientv3.Client, o *Owner, identity string) int64 {
	t.Helper()
	r, err := cli.Get(ctxT(t), o.identityPrefix(o.IdentityHome(identity))+keyspace.IdentityHash(identity)+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return r.Count
}

// A burst of one identity's try-locks over many shards is cut at exactly
// n, every slot in etcd before its grant; the refusals write nothing; a
// retry of a request id takes no second slot; another identity has its
// own count.
func TestIdentityCountIsExactUnderABurst(t *testing.T) {
	const n, burst = 5, 100
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli, WithMaxLocksPerIdentity(n))
	ctx := ctxT(t)

	var mu sync.Mutex
	granted, refused := 0, 0
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() {
			a := acq(fmt.Sprintf("burst/%d", i), time.Minute, 0)
			a.RequestID = fmt.Sprintf("req-%d", i)
			_, err := o.AcquireCounted(ctx, a)
			var tl *lease.TooManyLocksError
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				granted++
			case errors.As(err, &tl) && tl.Limit == n && tl.Count == n:
				refused++
			default:
				t.Errorf("burst/%d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if granted != n || refused != burst-n {
		t.Fatalf("%d granted, %d refused, want %d and %d", granted, refused, n, burst-n)
	}
	if got := slotsOf(t, cli, o, "alice"); got != n {
		t.Fatalf("%d slots in etcd, want %d", got, n)
	}
	// A retry of a granted request: resumed, with the slot it holds.
	var retried bool
	for i := range burst {
		a := acq(fmt.Sprintf("burst/%d", i), time.Minute, 0)
		a.RequestID = fmt.Sprintf("req-%d", i)
		if g, err := o.AcquireCounted(ctx, a); err == nil {
			if !g.Resumed {
				t.Fatalf("burst/%d granted again, not resumed", i)
			}
			retried = true
			break
		}
	}
	if !retried || slotsOf(t, cli, o, "alice") != n {
		t.Fatalf("retried %v, %d slots, want a resumed grant and %d slots", retried, slotsOf(t, cli, o, "alice"), n)
	}
	b := acq("other/1", time.Minute, 0)
	b.Caller = "bob"
	if _, err := o.AcquireCounted(ctx, b); err != nil {
		t.Fatalf("another identity: %v", err)
	}
}

// A slot comes back when its grant is released (before the release's
// caller may go on: AwaitIdentityRelease), when its waiter is cancelled
// (before AcquireCounted returns), and when a try-lock is refused.
func TestIdentitySlotsComeBack(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli, WithMaxLocksPerIdentity(2))
	ctx := ctxT(t)
	g1, err := o.AcquireCounted(ctx, acq("a/1", time.Minute, 0))
	if err != nil {
		t.Fatal(err)
	}
	bob := acq("a/busy", time.Minute, 0)
	bob.Caller = "bob"
	if _, err := o.AcquireCounted(ctx, bob); err != nil {
		t.Fatal(err)
	}
	// A refused try-lock gives its slot back at once.
	var ng *lease.NotGrantedError
	if _, err := o.AcquireCounted(ctx, acq("a/busy", time.Minute, 0)); !errors.As(err, &ng) {
		t.Fatalf("a try-lock of a held lock: %v, want NotGrantedError", err)
	}
	// A waiter holds a slot until it is cancelled.
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := o.AcquireCounted(wctx, acq("a/busy", time.Minute, time.Minute))
		done <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, ws, _ := o.Describe("a/busy"); len(ws) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter never queued")
		}
	}
	if _, err := o.AcquireCounted(ctx, acq("a/2", time.Minute, 0)); !errors.Is(err, lease.ErrTooManyLocks) {
		t.Fatalf("a third lock: %v, want TooManyLocks", err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled waiter: %v", err)
	}
	g2, err := o.AcquireCounted(ctx, acq("a/2", time.Minute, 0))
	if err != nil {
		t.Fatalf("after the waiter was cancelled: %v", err)
	}
	// A release: the slot is free once AwaitIdentityRelease returns.
	if ok, err := o.Release(ctx, g1.Name, g1.Token, g1.Handle, "alice"); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	o.AwaitIdentityRelease(ctx, g1.Name, g1.Token)
	if _, err := o.AcquireCounted(ctx, acq("a/3", time.Minute, 0)); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if _, err := o.AcquireCounted(ctx, acq("a/4", time.Minute, 0)); !errors.Is(err, lease.ErrTooManyLocks) {
		t.Fatalf("full again: %v", err)
	}
	_ = g2
	if got := slotsOf(t, cli, o, "alice"); got > 2 {
		t.Fatalf("%d slots of alice's in etcd, limit 2", got)
	}
}

// A new owner of the shards (a graceful hand-over) keeps the count: the
// slots of the grants it reloaded are found in their records and the
// count's slots in etcd; a release there frees its slot.
func TestIdentityCountSurvivesAHandOver(t *testing.T) {
	_, cli := ownerEtcd(t)
	first := startOwner(t, cli, WithMaxLocksPerIdentity(2), WithMember("first", ""))
	ctx := ctxT(t)
	var gs []string
	for i := range 2 {
		g, err := first.AcquireCounted(ctx, acq(fmt.Sprintf("h/%d", i), time.Minute, 0))
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g.Handle)
	}
	second, err := NewOwner(ctx, cli, "/t/", WithShards(8), WithLeaseTTL(2*time.Second), WithMaxLocksPerIdentity(2), WithMember("second", ""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Close(context.Background()) })
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	first.Close(cctx)
	cancel()
	waitServing(t, second)
	if _, err := second.AcquireCounted(ctx, acq("h/2", time.Minute, 0)); !errors.Is(err, lease.ErrTooManyLocks) {
		t.Fatalf("after the hand-over: %v, want TooManyLocks", err)
	}
	// The new owner holds the slots of the grants it reloaded.
	held := 0
	for _, s := range second.shards {
		s.mu.Lock()
		h := second.held(s)
		if s.tab != nil {
			second.syncHeld(s, h)
		}
		held += len(h.claims)
		s.mu.Unlock()
	}
	if held != 2 {
		t.Fatalf("the new owner holds %d slots, want 2", held)
	}
	hs, _ := second.List("h/")
	if len(hs) != 2 {
		t.Fatalf("%d grants after the hand-over, want 2", len(hs))
	}
	if ok, err := second.Release(ctx, hs[0].Name, hs[0].Token, gs[0], "alice"); err != nil || !ok {
		t.Fatalf("release after the hand-over: %v %v", ok, err)
	}
	second.AwaitIdentityRelease(ctx, hs[0].Name, hs[0].Token)
	if _, err := second.AcquireCounted(ctx, acq("h/2", time.Minute, 0)); err != nil {
		t.Fatalf("after a release on the new owner: %v", err)
	}
}
