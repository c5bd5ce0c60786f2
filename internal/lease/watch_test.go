package lease

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A Watch whose etcd watch closes under it (the etcd client shut down, as
// when a replica stops) answers ErrUnavailable (retry elsewhere), not an
// unclassified error that the server maps to INTERNAL. Found by the chaos
// suite's answer check (TestReplicaCrashMidAcquire).
func TestWatchClosedUnderItIsUnavailable(t *testing.T) {
	m, cli := newTestManager(t)
	current := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- m.Watch(context.Background(), "closed/under", 0, func(ev Event) error {
			if ev.Kind == EventCurrent {
				close(current)
			}
			return nil
		})
	}()
	<-current
	time.Sleep(50 * time.Millisecond) // the etcd watch is open
	cli.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Watch after its etcd client closed: %v, want ErrUnavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Watch did not end after its etcd client closed")
	}
}

// The lock-end watch catches up with a compaction that keeps moving (a
// compactor that keeps little history): resuming from the compacted
// revision at once, not after a backoff during which etcd compacts again.
// Found by the chaos suite (TestQuorumLoss with its compactor: after the
// quorum came back, a replica's lock-end watch never reported an end again).
func TestWatchEndsCatchesUpWithMovingCompaction(t *testing.T) {
	m, cli := newTestManager(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := currentRev(t, m)
	// A write and a compaction to the current revision every 20 ms.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if r, err := cli.Put(ctx, "/other", "x"); err == nil {
				_, _ = cli.Compact(ctx, r.Header.Revision)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	defer func() { cancel(); <-done }()
	time.Sleep(100 * time.Millisecond) // start is compacted away
	rec := watchEnds(t, m, start)
	// Grants end one after another; one ending after the watch caught up
	// must be reported.
	deadline := time.Now().Add(30 * time.Second) // a bound against a hang, not a speed target
	for {
		g, err := m.Acquire(ctx, "moving/compaction", WithTTL(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Release(ctx, "moving/compaction", g.Token, g.Handle); err != nil {
			t.Fatal(err)
		}
		rec.mu.Lock()
		n := len(rec.ends)
		rec.mu.Unlock()
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no end reported within 30s: the lock-end watch never caught up with the compaction")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
