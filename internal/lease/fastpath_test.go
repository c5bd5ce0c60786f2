package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A release answered from the grant cache (no read) is exactly as strict as
// one that reads the grant: a wrong handle or token, a grant that ended or
// was replaced elsewhere, or a key reused by a recycled lease all answer
// false and change nothing.
func TestCachedReleaseIsOwnerOnly(t *testing.T) {
	m, cli := newTestManager(t)
	other, err := New(cli) // a second replica: no cache entries of m's grants
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	ctx := context.Background()
	acquire := func(mgr *Manager, name string, ttl time.Duration) *Grant {
		t.Helper()
		g, err := mgr.Acquire(ctx, name, WithTTL(ttl), WithWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := mgr.grants.get(mgr.ks.key(name, clientv3.LeaseID(g.LeaseID))); !ok {
			t.Fatalf("grant of %s not remembered by the manager that made it", name)
		}
		return g
	}
	holder := func(name string) int64 {
		t.Helper()
		r, err := cli.Get(ctx, m.ks.Queue(name), clientv3.WithFirstCreate()...)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Kvs) == 0 {
			return 0
		}
		return r.Kvs[0].CreateRevision
	}
	wrongSecret := func(h string) string {
		b := []byte(h)
		if b[20] == 'A' {
			b[20] = 'B'
		} else {
			b[20] = 'A'
		}
		return string(b)
	}

	t.Run("wrong handle or token", func(t *testing.T) {
		g := acquire(m, "fast/wrong", 10*time.Second)
		for _, c := range []struct {
			token  int64
			handle string
		}{{g.Token, wrongSecret(g.Handle)}, {g.Token + 1, g.Handle}, {g.Token - 1, g.Handle}} {
			ok, err := m.Release(ctx, g.Name, c.token, c.handle)
			if err != nil || ok {
				t.Fatalf("Release(%d, %q) = %v, %v; want false, nil", c.token, c.handle, ok, err)
			}
		}
		if holder(g.Name) != g.Token {
			t.Fatal("a refused release removed the grant")
		}
		if ok, err := m.Release(ctx, g.Name, g.Token, g.Handle); err != nil || !ok {
			t.Fatalf("owner's release = %v, %v", ok, err)
		}
		if ok, err := m.Release(ctx, g.Name, g.Token, g.Handle); err != nil || ok {
			t.Fatalf("second release = %v, %v; want false", ok, err)
		}
	})

	t.Run("released elsewhere, key reused by the recycled lease", func(t *testing.T) {
		g := acquire(m, "fast/reuse", 10*time.Second)
		if ok, err := other.Release(ctx, g.Name, g.Token, g.Handle); err != nil || !ok {
			t.Fatalf("release on the other replica = %v, %v", ok, err)
		}
		// The other replica pooled the lease: its next grant of the same
		// name reuses it, so the queue key is the same, with a new secret.
		g2 := acquire(other, g.Name, 10*time.Second)
		if g2.LeaseID != g.LeaseID {
			t.Fatalf("the lease was not recycled (%x then %x): the test needs the same key", g.LeaseID, g2.LeaseID)
		}
		if ok, err := m.Release(ctx, g.Name, g.Token, g.Handle); err != nil || ok {
			t.Fatalf("stale release on the first replica = %v, %v; want false", ok, err)
		}
		if got := holder(g.Name); got != g2.Token {
			t.Fatalf("holder after a stale release = %d, want %d", got, g2.Token)
		}
	})

	t.Run("expired", func(t *testing.T) {
		g := acquire(m, "fast/expired", time.Second)
		if _, err := cli.Revoke(ctx, clientv3.LeaseID(g.LeaseID)); err != nil { // as expiry would
			t.Fatal(err)
		}
		if ok, err := m.Release(ctx, g.Name, g.Token, g.Handle); err != nil || ok {
			t.Fatalf("release after expiry = %v, %v; want false", ok, err)
		}
		g2 := acquire(m, g.Name, 10*time.Second)
		if ok, err := m.Release(ctx, g.Name, g.Token, g.Handle); err != nil || ok {
			t.Fatalf("stale release after a new grant = %v, %v; want false", ok, err)
		}
		if holder(g.Name) != g2.Token {
			t.Fatal("a stale release removed the new grant")
		}
	})
}

// The shared keepalive streams renew many leases concurrently, each answer
// going to its own caller, report a revoked lease as gone, and survive a
// broken stream.
func TestSharedKeepalives(t *testing.T) {
	m, cli := newTestManager(t)
	ctx := context.Background()
	const n = 40
	ids := make([]clientv3.LeaseID, n)
	for i := range ids {
		ttl := int64(5 + i%7)
		lr, err := cli.Grant(ctx, ttl)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = lr.ID
	}
	gone, err := cli.Grant(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 3*n)
	for round := range 3 {
		for i, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ttl, err := m.keepAliveOnce(ctx, id)
				if want := int64(5 + i%7); err != nil || ttl != want {
					errs <- fmt.Errorf("round %d lease %d: ttl %d, err %w; want %d", round, i, ttl, err, want)
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := m.keepAliveOnce(ctx, gone.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
				errs <- fmt.Errorf("revoked lease: err %w, want ErrLeaseNotFound", err)
			}
		}()
		wg.Wait()
		if round == 1 {
			// Break every stream: the next renewals reopen them.
			for i := range m.ka.lanes {
				l := &m.ka.lanes[i]
				l.mu.Lock()
				if l.cancel != nil {
					l.cancel()
				}
				l.mu.Unlock()
			}
		}
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// A caller whose context ends gets its error; the stream stays usable.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := m.keepAliveOnce(cctx, ids[0]); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled renewal: %v", err)
	}
	if ttl, err := m.keepAliveOnce(ctx, ids[0]); err != nil || ttl != 5 {
		t.Fatalf("renewal after a cancelled one: %d, %v", ttl, err)
	}
}

// A recycled lease is refreshed alongside the join; if it turns out to be
// gone, the join is redone with a new lease and the grant is sound.
func TestRecycledLeaseGoneIsReplaced(t *testing.T) {
	m, cli := newTestManager(t)
	ctx := context.Background()
	g, err := m.Acquire(ctx, "recycle/a", WithTTL(7*time.Second), WithWait(0))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := m.Release(ctx, g.Name, g.Token, g.Handle); err != nil || !ok {
		t.Fatalf("release: %v, %v", ok, err)
	}
	// Reused while alive: same lease, refreshed to the full TTL.
	g2, err := m.Acquire(ctx, "recycle/b", WithTTL(7*time.Second), WithWait(0))
	if err != nil {
		t.Fatal(err)
	}
	if g2.LeaseID != g.LeaseID {
		t.Fatalf("lease not recycled: %x then %x", g.LeaseID, g2.LeaseID)
	}
	if ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(g2.LeaseID)); err != nil || ttl.TTL < 6 {
		t.Fatalf("recycled lease TTL %v, %v; want about 7s", ttl.TTL, err)
	}
	if ok, err := m.Release(ctx, g2.Name, g2.Token, g2.Handle); err != nil || !ok {
		t.Fatalf("release: %v, %v", ok, err)
	}
	// Gone while pooled (as if it had expired): a new lease is used.
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(g2.LeaseID)); err != nil {
		t.Fatal(err)
	}
	g3, err := m.Acquire(ctx, "recycle/c", WithTTL(7*time.Second), WithWait(0))
	if err != nil {
		t.Fatalf("acquire after the pooled lease vanished: %v", err)
	}
	if g3.LeaseID == g2.LeaseID {
		t.Fatal("a revoked lease was handed out")
	}
	r, err := cli.Get(ctx, m.ks.Queue(g3.Name), clientv3.WithFirstCreate()...)
	if err != nil || len(r.Kvs) != 1 || r.Kvs[0].CreateRevision != g3.Token || r.Kvs[0].Lease != g3.LeaseID {
		t.Fatalf("the grant is not in etcd as returned: %v %v", r, err)
	}
}

// A waiter whose key vanished before its watches existed (the gap between
// the join and the first watch) learns it at the first check, not at its
// next lease renewal; one that still exists keeps waiting for the
// predecessor named by its join.
func TestWaiterKeyGoneBeforeTheWatch(t *testing.T) {
	m, cli := newTestManager(t)
	ctx := context.Background()
	holder, err := m.Acquire(ctx, "gap", WithTTL(30*time.Second), WithWait(0))
	if err != nil {
		t.Fatal(err)
	}
	o, err := m.acquireOptions("gap", []AcquireOption{WithTTL(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	join := func() *attempt {
		p, err := m.join(ctx, ctx, "gap", o)
		a, g := p.waiter, p.grant
		if err != nil || g != nil || a == nil {
			t.Fatalf("join: %v %v %v; want a queued attempt", a, g, err)
		}
		return a
	}
	a := join()
	if want := m.ks.key("gap", clientv3.LeaseID(holder.LeaseID)); a.pred.key != want {
		t.Fatalf("predecessor from the join = %q, want the holder's key %q", a.pred.key, want)
	}
	// With an identity the join writes one more key; the predecessor is
	// still found (here: a, the newest older key).
	oi, err := m.acquireOptions("gap", []AcquireOption{WithTTL(30 * time.Second), WithIdentity("alice")})
	if err != nil {
		t.Fatal(err)
	}
	p, err := m.join(ctx, ctx, "gap", oi)
	ai, g := p.waiter, p.grant
	if err != nil || g != nil || ai == nil {
		t.Fatalf("join with an identity: %v %v %v", ai, g, err)
	}
	if ai.pred.key != a.key {
		t.Fatalf("predecessor from a join with an identity = %q, want %q", ai.pred.key, a.key)
	}
	m.withdraw(ai)
	if _, err := cli.Delete(ctx, a.key); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := m.wait(wctx, wctx, a, nil); !errors.Is(err, ErrLostWhileWaiting) {
		t.Fatalf("wait with its key gone = %v, want ErrLostWhileWaiting", err)
	}
	m.withdraw(a)

	// Alive: it waits for its predecessor, then heads the queue.
	b := join()
	done := make(chan error, 1)
	go func() { done <- m.wait(wctx, wctx, b, nil) }()
	select {
	case err := <-done:
		t.Fatalf("wait returned %v while the holder holds", err)
	case <-time.After(200 * time.Millisecond):
	}
	if ok, err := m.Release(ctx, holder.Name, holder.Token, holder.Handle); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("wait after the release: %v", err)
	}
	if b.rec.Acquired == 0 {
		t.Fatal("the waiter heads the queue but did not claim the lock")
	}
	m.withdraw(b)
}

// A lease recycled right after its refresh is reused without another: the
// new grant's expiry counts from that refresh (never later than the lease's
// real expiry); one pooled longer is refreshed for a full TTL.
func TestFreshRecycledLeaseIsNotRefreshedAgain(t *testing.T) {
	m, cli := newTestManager(t)
	ctx := context.Background()
	cycle := func(name string) *Grant {
		t.Helper()
		g, err := m.Acquire(ctx, name, WithTTL(5*time.Second), WithWait(0))
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := m.Release(ctx, g.Name, g.Token, g.Handle); err != nil || !ok {
			t.Fatalf("release: %v %v", ok, err)
		}
		return g
	}
	g1 := cycle("fresh/1")
	g2 := cycle("fresh/2")
	if g2.LeaseID != g1.LeaseID {
		t.Fatalf("lease not recycled: %x then %x", g1.LeaseID, g2.LeaseID)
	}
	if !g2.ExpiresAt.Equal(g1.ExpiresAt) || g2.TTL != 5*time.Second {
		t.Fatalf("reused at once: expires %v (ttl %v), want the first grant's %v", g2.ExpiresAt, g2.TTL, g1.ExpiresAt)
	}
	// etcd agrees: the lease outlives the expiry the grant announced.
	if ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(g2.LeaseID)); err != nil || time.Now().Add(time.Duration(ttl.TTL+1)*time.Second).Before(g2.ExpiresAt) {
		t.Fatalf("lease TTL %v (%v) ends before the announced expiry %v", ttl.TTL, err, g2.ExpiresAt)
	}
	time.Sleep(freshFor(5) + 100*time.Millisecond)
	g3 := cycle("fresh/3")
	if g3.LeaseID != g1.LeaseID {
		t.Fatalf("lease not recycled: %x then %x", g1.LeaseID, g3.LeaseID)
	}
	if !g3.ExpiresAt.After(g1.ExpiresAt.Add(freshFor(5))) {
		t.Fatalf("reused after %v: expires %v, want a refresh past %v", freshFor(5), g3.ExpiresAt, g1.ExpiresAt.Add(freshFor(5)))
	}
}

// A renewal whose answer this replica sees only after the expiry it would
// promise (the process was paused while it was in flight) is reported as
// gone, never as renewed: the lease may have ended and the lock passed on.
func TestLateRenewalIsNotReportedAsRenewed(t *testing.T) {
	m, _ := newTestManager(t)
	ctx := context.Background()
	g, err := m.Acquire(ctx, "late", WithTTL(2*time.Second), WithWait(0))
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.OpenSession(ctx, 2*time.Second, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.KeepAlive(ctx, g.Name, g.Token, g.Handle); err != nil {
		t.Fatalf("timely renewal: %v", err)
	}
	if _, _, err := m.KeepAliveSession(ctx, s.Handle); err != nil {
		t.Fatalf("timely session renewal: %v", err)
	}
	// From now on the clock jumps 3 s at every reading after the first of
	// a renewal: its answer arrives after the 2 s it would promise.
	var mu sync.Mutex
	skew := time.Duration(0)
	m.now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now().Add(skew)
		skew += 3 * time.Second
		return now
	}
	if _, err := m.KeepAlive(ctx, g.Name, g.Token, g.Handle); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("late renewal: %v, want ErrNotHeld", err)
	}
	if _, _, err := m.KeepAliveSession(ctx, s.Handle); !errors.Is(err, ErrSessionNotFound) {
		t.Fatalf("late session renewal: %v, want ErrSessionNotFound", err)
	}
}
