package lease

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// endsRecorder runs WatchEnds until the test ends and collects its reports.
type endsRecorder struct {
	mu   sync.Mutex
	ends []GrantEnd
}

func watchEnds(t *testing.T, m *Manager, after int64) *endsRecorder {
	t.Helper()
	r := &endsRecorder{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- m.WatchEnds(ctx, after, func(e GrantEnd) {
			r.mu.Lock()
			r.ends = append(r.ends, e)
			r.mu.Unlock()
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchEnds: %v", err)
		}
	})
	return r
}

// await waits until n ends were reported and returns them.
func (r *endsRecorder) await(t *testing.T, n int) []GrantEnd {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r.mu.Lock()
		got := append([]GrantEnd(nil), r.ends...)
		r.mu.Unlock()
		if len(got) >= n || time.Now().After(deadline) {
			if len(got) != n {
				t.Fatalf("%d ends reported, want %d: %+v", len(got), n, got)
			}
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func currentRev(t *testing.T, m *Manager) int64 {
	t.Helper()
	r, err := m.cli.Get(context.Background(), "/")
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

// Each way a grant ends is reported once, with how; waiters that give up
// are not grants and are not reported.
func TestWatchEndsClassifiesEveryEnd(t *testing.T) {
	m, _ := newTestManager(t)
	ctx := context.Background()
	rec := watchEnds(t, m, currentRev(t, m))

	rel, err := m.Acquire(ctx, "ends/released", WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// A waiter that gives up behind it: not a grant.
	if _, err := m.Acquire(ctx, "ends/released", WithTTL(10*time.Second), WithWait(200*time.Millisecond)); !errors.Is(err, ErrNotGranted) {
		t.Fatal(err)
	}
	if ok, err := m.Release(ctx, "ends/released", rel.Token, rel.Handle); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	forced, err := m.Acquire(ctx, "ends/forced", WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := m.ForceRelease(ctx, "ends/forced", forced.Token); err != nil || !ok {
		t.Fatalf("force-release: %v %v", ok, err)
	}
	s, err := m.OpenSession(ctx, 10*time.Second, "")
	if err != nil {
		t.Fatal(err)
	}
	sess, err := m.Acquire(ctx, "ends/session", WithSession(s.Handle))
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := m.CloseSession(ctx, s.Handle); err != nil || !ok {
		t.Fatalf("close session: %v %v", ok, err)
	}
	exp, err := m.Acquire(ctx, "ends/expired", WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}

	want := map[string]struct {
		token  int64
		reason EndReason
	}{
		"ends/released": {rel.Token, EndReleased},
		"ends/forced":   {forced.Token, EndForced},
		"ends/session":  {sess.Token, EndReleased},
		"ends/expired":  {exp.Token, EndExpired},
	}
	for _, e := range rec.await(t, len(want)) {
		w, ok := want[e.Name]
		if !ok || e.Token != w.token || e.Reason != w.reason {
			t.Errorf("reported %+v; want %+v for %q", e, w, e.Name)
		}
		if e.Held < 0 {
			t.Errorf("%q held %v", e.Name, e.Held)
		}
	}
}

// A watch that starts behind etcd's compaction resumes from the oldest
// revision etcd has and keeps reporting.
func TestWatchEndsSurvivesCompaction(t *testing.T) {
	m, cli := newTestManager(t)
	ctx := context.Background()
	old, err := m.Acquire(ctx, "compact/old", WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Release(ctx, "compact/old", old.Token, old.Handle); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, currentRev(t, m)); err != nil {
		t.Fatal(err)
	}
	rec := watchEnds(t, m, 1)
	g, err := m.Acquire(ctx, "compact/new", WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Release(ctx, "compact/new", g.Token, g.Handle); err != nil {
		t.Fatal(err)
	}
	if got := rec.await(t, 1); got[0].Name != "compact/new" || got[0].Reason != EndReleased {
		t.Fatalf("after compaction: %+v", got)
	}
}
