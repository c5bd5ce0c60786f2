package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/coordinatord/coordinatord/internal/embedetcd"
)

// testEtcd starts an embedded etcd for tb and returns a client of it.
func testEtcd(tb testing.TB, opts ...embedetcd.Option) *clientv3.Client {
	tb.Helper()
	e, err := embedetcd.Start(context.Background(), tb.TempDir(), opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(e.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), Logger: zap.NewNop()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// holdCommits makes m's batcher keep every transaction pending, as if two
// commits were in flight; the returned func waits until n are pending and
// returns the batches take() makes of them (not launched yet).
func holdCommits(t *testing.T, m *Manager) func(n int) [][]*txnReq {
	m.batch.mu.Lock()
	m.batch.inflight = maxInflight
	m.batch.mu.Unlock()
	return func(n int) [][]*txnReq {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			m.batch.mu.Lock()
			queued := len(m.batch.pending)
			if queued == n {
				m.batch.inflight = 0
				batches := m.batch.take()
				m.batch.mu.Unlock()
				return batches
			}
			m.batch.mu.Unlock()
			if time.Now().After(deadline) {
				t.Fatalf("only %d of %d transactions pending", queued, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

func newTestManager(t *testing.T) (*Manager, *clientv3.Client) {
	t.Helper()
	cli := testEtcd(t, embedetcd.WithFastElection())
	m, err := New(cli)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m, cli
}

// Concurrent joins share one etcd transaction, each with its own outcome,
// and two joins of one lock never share one (they would both see it free).
func TestGroupCommitSharesATxnButNeverOneLock(t *testing.T) {
	m, cli := newTestManager(t)
	// Hold back every commit until all joins are pending.
	pending := holdCommits(t, m)

	const n = 30
	type result struct {
		name string
		g    *Grant
		err  error
	}
	results := make(chan result, n+1)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("gc/%d", i)
			opts := []AcquireOption{WithTTL(10 * time.Second), WithWait(0)}
			if i%3 == 0 {
				opts = append(opts, WithRequestID(fmt.Sprintf("request-id-%016d", i)))
			}
			if i == n-1 {
				name = "gc/0" // a second join of gc/0 in the same burst
			}
			g, err := m.Acquire(context.Background(), name, opts...)
			results <- result{name, g, err}
		}()
	}
	m.batch.launch(pending(n))
	wg.Wait()
	close(results)

	byToken := map[int64]int{}
	granted := map[string]int{}
	for r := range results {
		switch {
		case r.err == nil:
			granted[r.name]++
			byToken[r.g.Token]++
		case errors.Is(r.err, ErrNotGranted) && r.name == "gc/0":
		default:
			t.Fatalf("%s: %v", r.name, r.err)
		}
	}
	if granted["gc/0"] != 1 {
		t.Fatalf("gc/0 granted %d times in one burst", granted["gc/0"])
	}
	if len(granted) != n-1 {
		t.Fatalf("%d names granted, want %d", len(granted), n-1)
	}
	shared := 0
	for _, c := range byToken {
		shared = max(shared, c)
	}
	if shared < n-4 {
		t.Fatalf("at most %d joins shared a transaction; want most of the %d", shared, n)
	}
	for name := range granted {
		r, err := cli.Get(context.Background(), m.ks.Queue(name), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil || r.Count != 1 {
			t.Fatalf("%s has %d queue keys (%v), want 1", name, r.Count, err)
		}
	}
}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"))
}

// A release and joins of the same lock may share one transaction (only two
// joins of one lock may not): the joiners queue behind the released holder,
// find themselves at the head, and hold one at a time.
func TestReleaseAndJoinsOfOneLockShareATxn(t *testing.T) {
	m, cli := newTestManager(t)
	ctx := context.Background()
	h, err := m.Acquire(ctx, "share", WithTTL(10*time.Second), WithWait(0))
	if err != nil {
		t.Fatal(err)
	}
	// Hold back every commit until all four are pending.
	pending := holdCommits(t, m)

	const joiners = 3
	var (
		wg      sync.WaitGroup
		holders atomic.Int32
		tokens  = make(chan int64, joiners)
		errs    = make(chan error, joiners+1)
	)
	wg.Add(joiners + 1)
	go func() {
		defer wg.Done()
		if ok, err := m.Release(ctx, h.Name, h.Token, h.Handle); err != nil || !ok {
			errs <- fmt.Errorf("release: %v %w", ok, err)
		}
	}()
	for range joiners {
		go func() {
			defer wg.Done()
			g, err := m.Acquire(ctx, "share", WithTTL(10*time.Second), WithWait(10*time.Second))
			if err != nil {
				errs <- err
				return
			}
			if n := holders.Add(1); n != 1 {
				errs <- fmt.Errorf("%d holders at once", n)
			}
			time.Sleep(20 * time.Millisecond)
			holders.Add(-1)
			tokens <- g.Token
			if ok, err := m.Release(ctx, g.Name, g.Token, g.Handle); err != nil || !ok {
				errs <- fmt.Errorf("release of %d: %v %w", g.Token, ok, err)
			}
		}()
	}
	batches := pending(joiners + 1)
	if len(batches[0]) != 2 {
		t.Fatalf("first batch has %d transactions, want the release and one join", len(batches[0]))
	}
	m.batch.launch(batches)
	wg.Wait()
	close(errs)
	close(tokens)
	for err := range errs {
		t.Error(err)
	}
	// The release's revision (where its end marker was written) is the
	// token of the join that shared its transaction.
	var released int64
	for rev := h.Token + 1; rev < h.Token+20 && released == 0; rev++ {
		r, err := cli.Get(ctx, m.ks.ended("share"), clientv3.WithRev(rev))
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Kvs) == 1 && r.Kvs[0].ModRevision == rev && string(r.Kvs[0].Value) == fmt.Sprintf("released:%d", h.Token) {
			released = rev
		}
	}
	shared := false
	n := 0
	for tok := range tokens {
		n++
		shared = shared || tok == released
	}
	if n != joiners {
		t.Fatalf("%d of %d joiners held the lock", n, joiners)
	}
	if !shared {
		t.Fatalf("no join shared the release's transaction (revision %d)", released)
	}
}
