package lease

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// burstSize is the number of concurrent acquisitions in a burst (issue 13,
// row 4: a burst of 60 once admitted 56 waiters for a limit of 10).
const burstSize = 500

type outcome struct {
	i   int
	g   *Grant
	err error
}

// startBurst starts n Acquires together, the i-th on replica ms[i%len(ms)]
// with name(i) and opts(i), and delivers each outcome as it comes.
func startBurst(ctx context.Context, ms []*Manager, n int, name func(i int) string, opts func(i int) []AcquireOption) <-chan outcome {
	out := make(chan outcome, n)
	start := make(chan struct{})
	for i := range n {
		go func() {
			<-start
			g, err := ms[i%len(ms)].Acquire(ctx, name(i), opts(i)...)
			out <- outcome{i, g, err}
		}()
	}
	close(start)
	return out
}

// burst is startBurst, waiting for every outcome.
func burst(ctx context.Context, ms []*Manager, n int, name func(i int) string, opts func(i int) []AcquireOption) []outcome {
	out := startBurst(ctx, ms, n, name, opts)
	all := make([]outcome, 0, n)
	for range n {
		all = append(all, <-out)
	}
	return all
}

func countKeys(t *testing.T, cli *clientv3.Client, prefix string) int64 {
	t.Helper()
	r, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return r.Count
}

// Issue 13, row 4: the waiters of one lock never exceed the limit under a
// burst of concurrent joins across two replicas, sessions' waiters
// included; a refusal leaves nothing behind; withdrawn waiters and a
// released holder give their places back.
func TestMaxWaitersPerLockIsExactUnderBurstsAcrossReplicas(t *testing.T) {
	const limit = 10
	ms, cli := newReplicas(t, 2, WithMaxWaitersPerLock(limit))
	ctx := context.Background()
	const lock = "crowd"
	queue := ms[0].ks.Queue(lock)
	holder, err := ms[0].Acquire(ctx, lock, WithTTL(time.Minute), WithWait(0))
	if err != nil {
		t.Fatal(err)
	}
	// Every fifth contender waits through a session of its own (a session
	// has one key per queue).
	sessions := make([]string, burstSize/5)
	for i := range sessions {
		s, err := ms[i%2].OpenSession(ctx, time.Minute, "")
		if err != nil {
			t.Fatal(err)
		}
		sessions[i] = s.Handle
	}
	// waiters sends n contenders (every fifth through sessions[from+i/5])
	// and returns once each is refused or queued, checking that exactly
	// want more were queued; the waiters wait until cancel, and their
	// outcomes then arrive on the channel.
	waiters := func(t *testing.T, n, from int, want int64) (context.CancelFunc, <-chan outcome) {
		t.Helper()
		before := countKeys(t, cli, queue)
		wctx, cancel := context.WithCancel(ctx)
		out := startBurst(wctx, ms, n, func(int) string { return lock }, func(i int) []AcquireOption {
			if i%5 == 0 {
				return []AcquireOption{WithSession(sessions[from+i/5])}
			}
			return []AcquireOption{WithTTL(time.Minute)}
		})
		refused := 0
		eventually(t, "every contender refused or queued", func() bool {
			for more := true; more; {
				select {
				case o := <-out:
					if !errors.Is(o.err, ErrTooManyWaiters) {
						t.Errorf("contender %d: %v, want ErrTooManyWaiters or to wait", o.i, o.err)
					}
					var tw *TooManyWaitersError
					if errors.As(o.err, &tw) && (tw.Limit != limit || tw.Name != lock) {
						t.Errorf("contender %d: %+v, want limit %d on %q", o.i, tw, limit, lock)
					}
					refused++
				default:
					more = false
				}
			}
			return int64(refused)+countKeys(t, cli, queue)-before == int64(n)
		})
		if got := countKeys(t, cli, queue) - before; got != want {
			cancel()
			t.Fatalf("a burst of %d queued %d more waiters, want %d (limit %d)", n, got, want, limit)
		}
		return cancel, out
	}
	// end cancels the n waiters of a burst and checks they are withdrawn.
	end := func(t *testing.T, cancel context.CancelFunc, out <-chan outcome, n int) {
		t.Helper()
		cancel()
		for range n {
			if o := <-out; !errors.Is(o.err, context.Canceled) {
				t.Errorf("waiter %d: %v, want context.Canceled", o.i, o.err)
			}
		}
	}

	cancel, out := waiters(t, burstSize, 0, limit)
	// Full: a try-lock is told the lock is held; nothing was left behind.
	if _, err := ms[1].Acquire(ctx, lock, WithTTL(time.Minute), WithWait(0)); !errors.Is(err, ErrNotGranted) {
		t.Errorf("a try-lock on a full queue: %v, want ErrNotGranted", err)
	}
	if n := countKeys(t, cli, ms[0].ks.waiterSlots(lock)); n != limit+1 {
		t.Errorf("%d waiter slots taken, want %d (the holder and the waiters)", n, limit+1)
	}
	end(t, cancel, out, limit)
	if n, s := countKeys(t, cli, queue), countKeys(t, cli, ms[0].ks.waiterSlots(lock)); n != 1 || s != 1 {
		t.Fatalf("after the waiters were withdrawn: %d queue keys and %d slots, want 1 and 1 (the holder)", n, s)
	}

	// Withdrawn waiters gave their places back.
	cancel, out = waiters(t, burstSize/5, 0, limit)
	// A released holder gives its place back: its successor keeps its own.
	if ok, err := ms[0].Release(ctx, lock, holder.Token, holder.Handle); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	first := <-out // the successor, granted
	if first.err != nil {
		t.Fatalf("the holder's successor: %v", first.err)
	}
	cancelOne, outOne := waiters(t, burstSize/10, burstSize/25, 1)
	end(t, cancelOne, outOne, 1)
	end(t, cancel, out, limit-1)
	if _, err := ms[first.i%2].Release(ctx, lock, first.g.Token, first.g.Handle); err != nil {
		t.Fatal(err)
	}
}

// Issue 13, row 4: the locks held or awaited by one identity never exceed
// the limit under a burst of concurrent acquisitions across two replicas,
// its sessions' locks included; releases, a session's close and expiries
// give the capacity back; another identity is not affected.
func TestMaxLocksPerIdentityIsExactUnderBurstsAcrossReplicas(t *testing.T) {
	const limit = 20
	const id = "spiffe://example.org/team-a"
	ms, cli := newReplicas(t, 2, WithMaxLocksPerIdentity(limit))
	ctx := context.Background()
	var sessions [2]*Session
	for i := range sessions {
		s, err := ms[i].OpenSession(ctx, time.Minute, "")
		if err != nil {
			t.Fatal(err)
		}
		sessions[i] = s
	}
	round := 0
	// grants runs a burst of n acquisitions of distinct locks by id, every
	// fourth through a session if withSessions, and checks that exactly
	// want are granted and the others refused.
	grants := func(t *testing.T, n, want int, withSessions bool) []outcome {
		t.Helper()
		round++
		all := burst(ctx, ms, n, func(i int) string { return fmt.Sprintf("own/%d/%d", round, i) }, func(i int) []AcquireOption {
			o := []AcquireOption{WithIdentity(id), WithWait(0)}
			if withSessions && i%4 == 0 {
				return append(o, WithSession(sessions[(i/4)%2].Handle))
			}
			return append(o, WithTTL(time.Minute))
		})
		var granted []outcome
		for _, o := range all {
			var tm *TooManyLocksError
			switch {
			case o.err == nil:
				granted = append(granted, o)
			case errors.As(o.err, &tm):
				if tm.Limit != limit {
					t.Errorf("acquisition %d: %+v, want limit %d", o.i, tm, limit)
				}
			default:
				t.Errorf("acquisition %d: %v, want a grant or ErrTooManyLocks", o.i, o.err)
			}
		}
		if len(granted) != want {
			t.Fatalf("a burst of %d granted %d locks, want %d (limit %d)", n, len(granted), want, limit)
		}
		return granted
	}

	first := grants(t, burstSize, limit, true)
	if n := countOwned(t, ms[0], id); n != limit {
		t.Fatalf("identity counts %d locks, want %d", n, limit)
	}
	if _, err := ms[1].Acquire(ctx, "other/1", WithIdentity("team-b"), WithTTL(time.Minute)); err != nil {
		t.Fatalf("another identity: %v", err)
	}
	// Release the plain grants, close session 0: what is left is
	// session 1's locks.
	left := int64(0)
	for _, o := range first {
		switch {
		case o.i%4 != 0:
			if ok, err := ms[o.i%2].Release(ctx, o.g.Name, o.g.Token, o.g.Handle); err != nil || !ok {
				t.Fatalf("release: %v %v", ok, err)
			}
		case (o.i/4)%2 == 1:
			left++
		}
	}
	if ok, _, err := ms[0].CloseSession(ctx, sessions[0].Handle); err != nil || !ok {
		t.Fatalf("close session: %v %v", ok, err)
	}
	if n := countOwned(t, ms[0], id); n != left {
		t.Fatalf("after the releases and the close: %d locks counted, want %d (session 1's)", n, left)
	}

	// Released capacity comes back; grants whose leases end (revoked, as
	// etcd does at expiry: no coordinator sees it) give theirs back too.
	second := grants(t, burstSize/5, limit-int(left), false)
	for _, o := range second {
		if _, err := cli.Revoke(ctx, clientv3.LeaseID(o.g.LeaseID)); err != nil {
			t.Fatal(err)
		}
	}
	if n := countOwned(t, ms[0], id); n != left {
		t.Fatalf("after the leases ended: %d locks counted, want %d", n, left)
	}
	grants(t, burstSize/5, limit-int(left), false)
}

// A flood of joins beyond a limit costs reads, not writes: once a scope was
// seen full, a join reads its occupancy before granting a lease, and is
// refused without a raft proposal; when the scope drains, joins go through
// again.
func TestRefusalsOfAFullScopeProposeNothing(t *testing.T) {
	ctx := context.Background()
	raftIndex := func(t *testing.T, cli *clientv3.Client) uint64 {
		t.Helper()
		st, err := cli.Status(ctx, cli.Endpoints()[0])
		if err != nil {
			t.Fatal(err)
		}
		return st.RaftIndex
	}
	for _, tc := range []struct {
		name  string
		opt   Option
		fill  func(t *testing.T, m *Manager) (drain func())
		join  func(m *Manager) error
		error error
	}{
		{"waiters per lock", WithMaxWaitersPerLock(1), func(t *testing.T, m *Manager) func() {
			if _, err := m.Acquire(ctx, "full", WithTTL(time.Minute)); err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { _, err := m.Acquire(wctx, "full", WithTTL(time.Minute)); done <- err }()
			eventually(t, "one waiter", func() bool { n, err := m.QueueLen(ctx, "full"); return err == nil && n == 2 })
			return func() { cancel(); t.Logf("cancelled waiter: %v", <-done) }
		}, func(m *Manager) error {
			g, err := m.Acquire(ctx, "full", WithTTL(time.Minute), WithWait(50*time.Millisecond))
			if err == nil {
				_, _ = m.Release(ctx, "full", g.Token, g.Handle)
			}
			return err
		}, ErrTooManyWaiters},
		{"locks per identity", WithMaxLocksPerIdentity(1), func(t *testing.T, m *Manager) func() {
			g, err := m.Acquire(ctx, "mine/1", WithTTL(time.Minute), WithIdentity("a"))
			if err != nil {
				t.Fatal(err)
			}
			return func() { _, _ = m.Release(ctx, g.Name, g.Token, g.Handle) }
		}, func(m *Manager) error {
			g, err := m.Acquire(ctx, "mine/2", WithTTL(time.Minute), WithIdentity("a"))
			if err == nil {
				_, _ = m.Release(ctx, g.Name, g.Token, g.Handle)
			}
			return err
		}, ErrTooManyLocks},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms, cli := newReplicas(t, 1, tc.opt)
			m := ms[0]
			drain := tc.fill(t, m)
			if err := tc.join(m); !errors.Is(err, tc.error) {
				t.Fatalf("the first join beyond the limit: %v, want %v", err, tc.error)
			}
			before := raftIndex(t, cli)
			for range 20 {
				if err := tc.join(m); !errors.Is(err, tc.error) {
					t.Fatalf("a join beyond the limit: %v, want %v", err, tc.error)
				}
			}
			if after := raftIndex(t, cli); after != before {
				t.Errorf("20 refused joins of a scope seen full made %d raft proposals, want 0", after-before)
			}
			drain()
			if err := tc.join(m); errors.Is(err, tc.error) {
				t.Fatalf("a join once the scope drained: %v", err)
			}
		})
	}
}
