package server_test

import (
	"context"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

func TestIdempotentAcquire(t *testing.T) {
	e := newEnv(t)
	const id = "9b2f6c1e-5d0a-4e8b-a1c3-7f2d9e4b6a10"
	req := &coordinatorv1.AcquireRequest{Name: "idem", Ttl: dur(30 * time.Second), RequestId: id}
	a, err := e.lc.Acquire(ctxT(t, 10*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	// The response was "lost": the retry gets the same grant.
	b, err := e.lc.Acquire(ctxT(t, 10*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	if b.Token != a.Token || b.Handle != a.Handle || !b.Resumed || a.Resumed {
		t.Fatalf("retry = token %d handle %q resumed %v; want token %d handle %q", b.Token, b.Handle, b.Resumed, a.Token, a.Handle)
	}
	if n := e.queueKeys("idem"); n != 1 {
		t.Fatalf("%d queue keys, want 1", n)
	}
	// The same id under another name is another acquisition.
	other, err := e.tryAcquire("idem-2")
	if err != nil {
		t.Fatal(err)
	}
	_ = other

	t.Run("concurrent retries while waiting share one waiter", func(t *testing.T) {
		const wid = "0d3c1a52-8e77-4b1f-9c2a-55e0f6a7b8c9"
		var wg sync.WaitGroup
		res := make([]*coordinatorv1.AcquireResponse, 3)
		for i := range res {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := e.lc.Acquire(ctxT(t, 20*time.Second), &coordinatorv1.AcquireRequest{Name: "idem", Ttl: dur(10 * time.Second), RequestId: wid})
				if err != nil {
					t.Errorf("attempt %d: %v", i, err)
				}
				res[i] = r
			}()
		}
		eventually(t, 10*time.Second, "the shared waiter queued", func() bool { return e.queueKeys("idem") == 2 })
		time.Sleep(500 * time.Millisecond) // the other calls in flight too
		if n := e.queueKeys("idem"); n != 2 {
			t.Fatalf("%d queue keys with three concurrent retries waiting, want holder + 1", n)
		}
		if w := e.describe("idem").Waiters; len(w) != 1 {
			t.Fatalf("%d waiters, want 1", len(w))
		}
		e.release("idem", a.Token, a.Handle)
		wg.Wait()
		for i, r := range res {
			if r == nil || r.Token != res[0].Token || r.Handle != res[0].Handle {
				t.Fatalf("attempt %d got %v, want the same grant as attempt 0 (%v)", i, r, res[0])
			}
		}
		if res[0].Token <= a.Token {
			t.Fatalf("token %d not above %d", res[0].Token, a.Token)
		}
	})
}

func TestRetryOnAnotherReplicaAfterCrashRejoinsTheQueue(t *testing.T) {
	queueCoreOnly(t, "TestShardRetryAfterTheForwardingReplicaCrashedRejoins")
	e := newEnv(t)
	holder := e.acquire("crash", 30*time.Second)
	const id = "5e9c2b7a-0f14-4d3e-8a6b-c1d2e3f4a5b6"

	// Replica B: its own etcd client and lease manager on the same etcd.
	b := e.replica()
	errB := make(chan error, 1)
	go func() {
		_, err := b.lc.Acquire(context.Background(), &coordinatorv1.AcquireRequest{Name: "crash", Ttl: dur(30 * time.Second), RequestId: id})
		errB <- err
	}()
	eventually(t, 10*time.Second, "B's waiter queued", func() bool { return e.queueKeys("crash") == 2 })
	r, err := e.cli.Get(context.Background(), e.mgr.Keyspace().Queue("crash"), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatal(err)
	}
	waiterToken := r.Kvs[1].CreateRevision
	b.crash() // no cleanup: the queue entry stays until its lease ends
	t.Logf("crashed waiter: %v", <-errB)
	if n := e.queueKeys("crash"); n != 2 {
		t.Fatalf("%d queue keys after the crash, want 2 (the crashed waiter's stays)", n)
	}

	done := make(chan *coordinatorv1.AcquireResponse, 1)
	go func() {
		g, err := e.lc.Acquire(ctxT(t, 20*time.Second), &coordinatorv1.AcquireRequest{Name: "crash", Ttl: dur(30 * time.Second), RequestId: id})
		if err != nil {
			t.Errorf("retry on replica A: %v", err)
		}
		done <- g
	}()
	time.Sleep(300 * time.Millisecond)
	if n := e.queueKeys("crash"); n != 2 {
		t.Fatalf("%d queue keys after the retry, want 2: the retry must rejoin, not queue again", n)
	}
	e.release("crash", holder.Token, holder.Handle)
	g := <-done
	if g == nil || g.Token != waiterToken {
		t.Fatalf("retry granted %v, want the original queue position's token %d", g, waiterToken)
	}
}

func TestMaxHoldBoundsRenewal(t *testing.T) {
	e := newEnv(t)
	const maxHold = 2 * time.Second
	g, err := e.lc.Acquire(ctxT(t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: "mh", Ttl: dur(3 * time.Second), MaxHold: dur(maxHold)})
	if err != nil {
		t.Fatal(err)
	}
	ka := func() error {
		_, err := e.lc.KeepAlive(ctxT(t, 5*time.Second), &coordinatorv1.KeepAliveRequest{Name: "mh", Token: g.Token, Handle: g.Handle})
		return err
	}
	if err := ka(); err != nil {
		t.Fatalf("renewal within max_hold: %v", err)
	}
	time.Sleep(time.Until(g.AcquiredAt.AsTime().Add(maxHold + 100*time.Millisecond)))
	if err := ka(); code(err) != codes.FailedPrecondition {
		t.Fatalf("renewal past max_hold: %v, want FAILED_PRECONDITION", err)
	}
	// Left to end: the lock frees by itself.
	eventually(t, 10*time.Second, "the lease ends", func() bool { return !e.validate("mh", g.Token).Valid })

	_, err = e.lc.Acquire(ctxT(t, 5*time.Second), &coordinatorv1.AcquireRequest{Name: "mh2", MaxHold: dur(2 * time.Hour)})
	if code(err) != codes.InvalidArgument || fieldOf(err) != "max_hold" {
		t.Fatalf("max_hold above the cap: %v, want INVALID_ARGUMENT on max_hold", err)
	}
}

func TestLockDelay(t *testing.T) {
	e := newEnv(t)
	const delay = 2 * time.Second
	t.Run("expiry delays the next grant", func(t *testing.T) {
		g, err := e.lc.Acquire(ctxT(t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: "ld", Ttl: dur(time.Second), LockDelay: dur(delay)})
		if err != nil {
			t.Fatal(err)
		}
		granted := time.Now()
		n, err := e.lc.Acquire(ctxT(t, 20*time.Second), &coordinatorv1.AcquireRequest{Name: "ld", Ttl: dur(10 * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(granted)
		t.Logf("next grant %v after the unrenewed grant (ttl 1s + lock-delay 2s)", took)
		if took < time.Second+delay-500*time.Millisecond { // etcd's lease clock has 500ms granularity
			t.Fatalf("next grant after %v, before ttl + lock-delay", took)
		}
		if n.Token <= g.Token {
			t.Fatal("token did not increase")
		}
		e.release("ld", n.Token, n.Handle)
	})
	t.Run("try-lock during the delay is refused", func(t *testing.T) {
		g, err := e.lc.Acquire(ctxT(t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: "ld2", Ttl: dur(time.Second), LockDelay: dur(delay)})
		if err != nil {
			t.Fatal(err)
		}
		r, err := e.lc.ForceRelease(ctxT(t, 5*time.Second), &coordinatorv1.ForceReleaseRequest{Name: "ld2", Token: g.Token})
		if err != nil || !r.Released {
			t.Fatalf("ForceRelease: %v %v", r, err)
		}
		if _, err := e.tryAcquire("ld2"); code(err) != codes.Aborted {
			t.Fatalf("try-lock right after a force-release with lock-delay: %v, want ABORTED", err)
		}
		eventually(t, 10*time.Second, "granted after the delay", func() bool { _, err := e.tryAcquire("ld2"); return err == nil })
	})
	t.Run("a clean release does not delay", func(t *testing.T) {
		g, err := e.lc.Acquire(ctxT(t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: "ld3", Ttl: dur(30 * time.Second), LockDelay: dur(10 * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		e.release("ld3", g.Token, g.Handle)
		if _, err := e.tryAcquire("ld3"); err != nil {
			t.Fatalf("try-lock after a clean release: %v", err)
		}
	})
}

func TestWaiterWhoseLeaseEndsFailsAtOnce(t *testing.T) {
	queueCoreOnly(t, "TestShardWaiterOfAGoneCallerLeavesTheQueue")
	e := newEnv(t)
	holder := e.acquire("ff", 30*time.Second)
	errc := make(chan error, 1)
	go func() {
		_, err := e.lc.Acquire(ctxT(t, 30*time.Second), &coordinatorv1.AcquireRequest{Name: "ff", Ttl: dur(30 * time.Second)})
		errc <- err
	}()
	eventually(t, 10*time.Second, "waiter queued", func() bool { return e.queueKeys("ff") == 2 })
	r, err := e.cli.Get(context.Background(), e.mgr.Keyspace().Queue("ff"), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	if _, err := e.cli.Revoke(context.Background(), clientv3.LeaseID(r.Kvs[1].Lease)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if code(err) != codes.NotFound {
			t.Fatalf("waiter whose lease was revoked: %v, want NOT_FOUND", err)
		}
		t.Logf("waiter failed %v after its lease was revoked", time.Since(revoked))
		if !raceEnabled && time.Since(revoked) > time.Second {
			t.Errorf("waiter failed only %v after its lease was revoked", time.Since(revoked))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter still waiting 10s after its lease was revoked")
	}
	// It is never granted: releasing the holder leaves the lock free.
	e.release("ff", holder.Token, holder.Handle)
	if d := e.describe("ff"); d.Holder != nil {
		t.Fatalf("lock held by %v after the dead waiter", d.Holder)
	}
}
