package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/coordinatord/coordinatord/internal/embedetcd"
)

// newReplicas starts one embedded etcd and n managers over it, each with its
// own etcd client: n coordinator replicas sharing the key prefix. The last
// client returned is for the test's own reads.
func newReplicas(t *testing.T, n int, opts ...Option) ([]*Manager, *clientv3.Client) {
	t.Helper()
	e, err := embedetcd.Start(context.Background(), t.TempDir(), embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	client := func() *clientv3.Client {
		cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		return cli
	}
	ms := make([]*Manager, n)
	for i := range ms {
		m, err := New(client(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
		ms[i] = m
	}
	return ms, client()
}

// eventually polls cond every 20ms until it holds, or fails after 60s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	// A bound against a hang, not a speed: CI's -race pass on a loaded
	// machine took over 15 s to settle a burst of 500 across two replicas.
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Issue 13, row 17: a replica's waiter clean-up never ends a queue entry
// that another replica resumed or granted. Client C waits on replica A with
// a request id; A freezes; C's deadline passes and it retries on replica B
// with the same id, which resumes the same entry. When A thaws, its waiter
// finds its context ended and cleans up (queued -> withdraw): that must not
// take C's grant (or C's place in the queue) away. A's freeze is simulated
// by running A's waiter only after B acted, with a context already ended.
func TestCleanupNeverEndsAnEntryAnotherReplicaResumed(t *testing.T) {
	ms, cli := newReplicas(t, 2)
	a, b := ms[0], ms[1]
	ctx := context.Background()
	const ttl = 10 * time.Second
	opts := func(reqID string) []AcquireOption {
		o := []AcquireOption{WithTTL(ttl)}
		if reqID != "" {
			o = append(o, WithRequestID(reqID))
		}
		return o
	}
	// waitOnA is C's first call: it joins lock's queue on replica A behind
	// a holder, and returns A's attempt (A then freezes).
	waitOnA := func(t *testing.T, lock, reqID string) (*Grant, *attempt, acquireOptions) {
		t.Helper()
		holder, err := b.Acquire(ctx, lock, WithTTL(ttl), WithWait(0))
		if err != nil {
			t.Fatal(err)
		}
		o, err := a.acquireOptions(lock, opts(reqID))
		if err != nil {
			t.Fatal(err)
		}
		p, err := a.start(ctx, ctx, lock, o)
		att, g := p.waiter, p.grant
		if err != nil || g != nil || att == nil {
			t.Fatalf("joining behind a holder: %v %v %v", att, g, err)
		}
		return holder, att, o
	}
	// thawA runs A's waiter with C's deadline long past: it cleans up.
	thawA := func(t *testing.T, att *attempt, o acquireOptions) {
		t.Helper()
		dead, cancel := context.WithCancel(ctx)
		cancel()
		if g, err := a.queued(dead, dead, att, o, nil); !errors.Is(err, context.Canceled) {
			t.Fatalf("A's waiter with its context ended: %v %v, want context.Canceled", g, err)
		}
	}
	stillHeld := func(t *testing.T, m *Manager, lock string, g *Grant) {
		t.Helper()
		if _, err := m.KeepAlive(ctx, lock, g.Token, g.Handle); err != nil {
			t.Fatalf("C's grant (token %d) after A's clean-up: %v; it was taken away before its safe_until %v",
				g.Token, err, g.SafeUntil.Format(time.RFC3339Nano))
		}
		d, err := m.Describe(ctx, lock)
		if err != nil || d.Holder == nil || d.Holder.Token != g.Token {
			t.Fatalf("holder after A's clean-up: %+v %v, want token %d", d, err, g.Token)
		}
	}
	queueKeys := func(t *testing.T, lock string) int64 {
		t.Helper()
		r, err := cli.Get(ctx, a.ks.Queue(lock), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return r.Count
	}

	t.Run("granted on B after resuming there", func(t *testing.T) {
		const lock, id = "w/granted", "row17-request-0001"
		holder, att, o := waitOnA(t, lock, id)
		granted := make(chan *Grant, 1)
		go func() {
			g, err := b.Acquire(ctx, lock, opts(id)...)
			if err != nil {
				t.Errorf("C's retry on B: %v", err)
			}
			granted <- g
		}()
		if _, err := b.Release(ctx, lock, holder.Token, holder.Handle); err != nil {
			t.Fatal(err)
		}
		g := <-granted
		if g == nil {
			t.FailNow()
		}
		if g.Token != att.token {
			t.Fatalf("C's retry got token %d, want the same entry's %d", g.Token, att.token)
		}
		thawA(t, att, o)
		stillHeld(t, b, lock, g)
	})

	t.Run("resumed on B, still waiting there", func(t *testing.T) {
		const lock, id = "w/waiting", "row17-request-0002"
		holder, att, o := waitOnA(t, lock, id)
		granted := make(chan *Grant, 1)
		go func() {
			g, err := b.Acquire(ctx, lock, opts(id)...)
			if err != nil {
				t.Errorf("C's retry on B, waiting while A cleaned up: %v", err)
			}
			granted <- g
		}()
		// B adopts the entry it resumed: it writes it, so that A's
		// knowledge of it (its mod revision) is out of date.
		eventually(t, "B's adoption of the entry", func() bool {
			r, err := cli.Get(ctx, att.key)
			return err == nil && len(r.Kvs) == 1 && r.Kvs[0].ModRevision > r.Kvs[0].CreateRevision
		})
		thawA(t, att, o)
		if n := queueKeys(t, lock); n != 2 {
			t.Fatalf("%d queue keys after A's clean-up, want 2 (the holder and C's entry)", n)
		}
		if _, err := b.Release(ctx, lock, holder.Token, holder.Handle); err != nil {
			t.Fatal(err)
		}
		g := <-granted
		if g == nil {
			t.FailNow()
		}
		if g.Token != att.token {
			t.Fatalf("C got token %d, want its entry's %d", g.Token, att.token)
		}
		stillHeld(t, b, lock, g)
	})

	t.Run("granted entry whose join outcome A never learned", func(t *testing.T) {
		// A's join granted at once, but A saw an error (a lost answer): it
		// knows the entry's lease and key, not its revision.
		const lock, id = "w/unknown", "row17-request-0003"
		o, err := a.acquireOptions(lock, opts(id))
		if err != nil {
			t.Fatal(err)
		}
		if p, err := a.start(ctx, ctx, lock, o); err != nil || p.grant == nil {
			t.Fatalf("first call: %v %v", p.grant, err)
		}
		att, err := a.lookupRequest(ctx, ctx, lock, o)
		if err != nil || att == nil {
			t.Fatalf("A's view of its entry: %v %v", att, err)
		}
		att.modRev = 0 // the join's outcome was not seen
		g, err := b.Acquire(ctx, lock, opts(id)...)
		if err != nil || !g.Resumed {
			t.Fatalf("C's retry on B: %v %v", g, err)
		}
		a.withdraw(att)
		stillHeld(t, b, lock, g)
	})

	// No orphans: an entry nobody else resumed is still removed at once.
	for _, id := range []string{"", "row17-request-0004"} {
		t.Run("abandoned entry is removed, request id "+map[bool]string{true: "set", false: "unset"}[id != ""], func(t *testing.T) {
			lock := "w/abandoned/" + id
			holder, att, o := waitOnA(t, lock, id)
			thawA(t, att, o)
			if n := queueKeys(t, lock); n != 1 {
				t.Fatalf("%d queue keys after A's clean-up, want 1 (the holder)", n)
			}
			if id != "" {
				if r, err := cli.Get(ctx, a.ks.request("", lock, id), clientv3.WithCountOnly()); err != nil || r.Count != 0 {
					t.Fatalf("request record after the clean-up: %v %v", r, err)
				}
			}
			if _, err := b.Release(ctx, lock, holder.Token, holder.Handle); err != nil {
				t.Fatal(err)
			}
		})
	}
}
