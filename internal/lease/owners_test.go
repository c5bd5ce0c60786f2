package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func countOwned(t *testing.T, m *Manager, id string) int64 {
	t.Helper()
	n, err := m.CountOwned(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// eventuallyOwned waits until identity id owns want acquisitions (the index
// of an expired lease goes with the lease, on etcd's clock).
func eventuallyOwned(t *testing.T, m *Manager, id string, want int64) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		n := countOwned(t, m, id)
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("identity %q owns %d acquisitions, want %d", id, n, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Every way an acquisition ends removes its limit slots (its identity's and
// its lock's): holders and waiters count while they live, and nothing is
// left behind.
func TestOwnedIndexFollowsEveryEnd(t *testing.T) {
	ms, cli := newReplicas(t, 1, WithMaxLocksPerIdentity(100), WithMaxWaitersPerLock(100))
	m := ms[0]
	ctx := context.Background()
	const id = "spiffe://example.org/team-a"
	mine := func(extra ...AcquireOption) []AcquireOption {
		return append([]AcquireOption{WithIdentity(id), WithTTL(10 * time.Second)}, extra...)
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, lock string)
	}{
		{"released", func(t *testing.T, lock string) {
			g, err := m.Acquire(ctx, lock, mine()...)
			if err != nil {
				t.Fatal(err)
			}
			eventuallyOwned(t, m, id, 1)
			if ok, err := m.Release(ctx, lock, g.Token, g.Handle); err != nil || !ok {
				t.Fatalf("release: %v %v", ok, err)
			}
		}},
		{"released with request id", func(t *testing.T, lock string) {
			g, err := m.Acquire(ctx, lock, mine(WithRequestID("owned-request-0001"))...)
			if err != nil {
				t.Fatal(err)
			}
			eventuallyOwned(t, m, id, 1)
			if ok, err := m.Release(ctx, lock, g.Token, g.Handle); err != nil || !ok {
				t.Fatalf("release: %v %v", ok, err)
			}
		}},
		{"force-released", func(t *testing.T, lock string) {
			g, err := m.Acquire(ctx, lock, mine()...)
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := m.ForceRelease(ctx, lock, g.Token); err != nil || !ok {
				t.Fatalf("force-release: %v %v", ok, err)
			}
		}},
		{"expired", func(t *testing.T, lock string) {
			if _, err := m.Acquire(ctx, lock, WithIdentity(id), WithTTL(time.Second)); err != nil {
				t.Fatal(err)
			}
			eventuallyOwned(t, m, id, 1)
			eventuallyOwned(t, m, id, 0) // on etcd's clock
		}},
		{"waiter whose wait elapsed, and a failed try-lock", func(t *testing.T, lock string) {
			g, err := m.Acquire(ctx, lock, WithTTL(10*time.Second)) // another caller, not indexed
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _, _ = m.Release(ctx, lock, g.Token, g.Handle) }()
			if _, err := m.Acquire(ctx, lock, mine(WithWait(300*time.Millisecond))...); !errors.Is(err, ErrNotGranted) {
				t.Fatalf("wait: %v", err)
			}
			if _, err := m.Acquire(ctx, lock, mine(WithWait(0))...); !errors.Is(err, ErrNotGranted) {
				t.Fatalf("try-lock: %v", err)
			}
		}},
		{"session: waiter withdrawn, holder force-released, holder of a closed session", func(t *testing.T, lock string) {
			s, err := m.OpenSession(ctx, 10*time.Second, "")
			if err != nil {
				t.Fatal(err)
			}
			g, err := m.Acquire(ctx, lock, WithTTL(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := m.Acquire(ctx, lock, WithIdentity(id), WithSession(s.Handle), WithWait(300*time.Millisecond)); !errors.Is(err, ErrNotGranted) {
				t.Fatalf("session wait: %v", err)
			}
			if n := countOwned(t, m, id); n != 0 {
				t.Fatalf("a withdrawn session waiter left %d index keys", n)
			}
			if _, err := m.Release(ctx, lock, g.Token, g.Handle); err != nil {
				t.Fatal(err)
			}
			sg, err := m.Acquire(ctx, lock, WithIdentity(id), WithSession(s.Handle))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := m.Acquire(ctx, lock+"/2", WithIdentity(id), WithSession(s.Handle)); err != nil {
				t.Fatal(err)
			}
			eventuallyOwned(t, m, id, 2)
			if ok, err := m.ForceRelease(ctx, lock, sg.Token); err != nil || !ok {
				t.Fatalf("force-release: %v %v", ok, err)
			}
			if n := countOwned(t, m, id); n != 1 {
				t.Fatalf("after a force-release: %d index keys, want 1", n)
			}
			if ok, _, err := m.CloseSession(ctx, s.Handle); err != nil || !ok {
				t.Fatalf("close session: %v %v", ok, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lock := "owned/" + tc.name
			tc.run(t, lock)
			// At once: a released lease is pooled alive, so only the
			// transaction that ended the grant can have removed its slots.
			if n := countOwned(t, m, id); n != 0 {
				t.Errorf("%d identity slots left behind", n)
			}
			for _, l := range []string{lock, lock + "/2"} {
				if r, err := cli.Get(ctx, m.ks.waiterSlots(l), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || r.Count != 0 {
					t.Errorf("%s: waiter slots left behind: %v %v", l, r, err)
				}
			}
		})
	}
}

// At the limit an identity is refused with nothing written, another
// identity keeps working, a retry of a live acquisition is not refused, and
// a release frees a slot.
func TestOwnedLimit(t *testing.T) {
	ms, cli := newReplicas(t, 1, WithMaxLocksPerIdentity(2))
	m := ms[0]
	ctx := context.Background()
	const a, b = "team-a", "team-b"
	opts := func(id string, extra ...AcquireOption) []AcquireOption {
		return append([]AcquireOption{WithIdentity(id), WithTTL(10 * time.Second)}, extra...)
	}
	g1, err := m.Acquire(ctx, "lim/1", opts(a, WithRequestID("limit-request-0001"))...)
	if err != nil {
		t.Fatal(err)
	}
	// A waiter counts as much as a holder.
	other, err := m.Acquire(ctx, "lim/2", WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _, err := m.Acquire(wctx, "lim/2", opts(a)...); waited <- err }()
	eventuallyOwned(t, m, a, 2)

	before, err := cli.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Acquire(ctx, "lim/3", opts(a)...)
	var tm *TooManyLocksError
	if !errors.As(err, &tm) || !errors.Is(err, ErrTooManyLocks) || tm.Count != 2 || tm.Limit != 2 {
		t.Fatalf("third acquisition: %v, want a TooManyLocksError 2/2", err)
	}
	after, err := cli.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if after.Header.Revision != before.Header.Revision {
		t.Errorf("a refused acquisition wrote to etcd: revision %d -> %d", before.Header.Revision, after.Header.Revision)
	}
	// A retry of the live acquisition is the same acquisition, not a new one.
	if g, err := m.Acquire(ctx, "lim/1", opts(a, WithRequestID("limit-request-0001"))...); err != nil || g.Token != g1.Token {
		t.Fatalf("retry with the request id: %v", err)
	}
	gb, err := m.Acquire(ctx, "lim/3", opts(b)...)
	if err != nil {
		t.Fatalf("another identity: %v", err)
	}
	if ok, err := m.Release(ctx, "lim/1", g1.Token, g1.Handle); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	if _, err := m.Acquire(ctx, "lim/4", opts(a)...); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("waiter: %v", err)
	}
	_, _ = m.Release(ctx, "lim/2", other.Token, other.Handle)
	_, _ = m.Release(ctx, "lim/3", gb.Token, gb.Handle)
	eventuallyOwned(t, m, a, 1)
}
