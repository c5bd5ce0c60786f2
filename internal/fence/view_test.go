package fence

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// follow runs v.Follow until the test ends and waits for the view to be
// live.
func follow(t *testing.T, v *Validator) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- v.Follow(ctx, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Follow: %v", err)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if w := v.view.Load(); w != nil {
			w.mu.Lock()
			live := w.live
			w.mu.Unlock()
			if live {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the view never went live")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Answers from the view are as fresh as a read: right after a grant, a
// release, or a hand-off returns, every validation sees it — also when the
// last writes were outside the locks (the view must then ask etcd for
// progress) — and no validation had to read etcd itself.
func TestViewAnswersAreLinearizable(t *testing.T) {
	m, v := setup(t)
	follow(t, v)
	ctx := context.Background()
	check := func(name string, token int64, want Reason) {
		t.Helper()
		got, err := v.Validate(ctx, name, token, "")
		if err != nil || got.Reason != want {
			t.Fatalf("Validate(%s, %d) = %+v, %v; want %v", name, token, got, err, want)
		}
	}
	for i := range 50 {
		name := fmt.Sprintf("view/%d", i%5)
		g, err := m.Acquire(ctx, name, lease.WithTTL(10*time.Second), lease.WithWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		check(name, g.Token, Current)
		if i%2 == 0 {
			// A write outside the locks moves the revision past the view's
			// last event: the barrier is ahead, and only a progress
			// notification can bring the view there.
			if _, err := v.cli.Put(ctx, fmt.Sprintf("/t/elsewhere/%d", i), "x"); err != nil {
				t.Fatal(err)
			}
			check(name, g.Token, Current)
		}
		if ok, err := m.Release(ctx, name, g.Token, g.Handle); err != nil || !ok {
			t.Fatalf("release: %v %v", ok, err)
		}
		check(name, g.Token, NotHeld)
		check(name, g.Token-1, NotHeld)
	}
	if v.readBack.Load() != 0 || v.viewed.Load() == 0 {
		t.Fatalf("%d validations from the view, %d read etcd; want all from the view", v.viewed.Load(), v.readBack.Load())
	}
}

// Under concurrent hand-offs, a validation that starts after a grant
// returned never calls an older token current, and the token just granted
// is current until its holder releases.
func TestViewUnderConcurrentHandOffs(t *testing.T) {
	m, v := setup(t)
	follow(t, v)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 15 {
				g, err := m.Acquire(ctx, "handoff", lease.WithTTL(10*time.Second))
				if err != nil {
					errs <- err
					return
				}
				for range 3 {
					if got, err := v.Validate(ctx, "handoff", g.Token, ""); err != nil || !got.Valid {
						errs <- fmt.Errorf("worker %d: holder's token %d: %+v %w", w, g.Token, got, err)
					}
				}
				if _, err := m.Release(ctx, "handoff", g.Token, g.Handle); err != nil {
					errs <- err
				}
				if got, err := v.Validate(ctx, "handoff", g.Token, ""); err != nil || got.Valid {
					errs <- fmt.Errorf("worker %d: released token %d still valid: %+v %w", w, g.Token, got, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if v.viewed.Load() == 0 {
		t.Fatal("no validation was answered from the view")
	}
}

// Without the view (not following, or stopped), validations read etcd and
// are just as right; a second Follow is refused.
func TestViewStoppedFallsBack(t *testing.T) {
	m, v := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- v.Follow(ctx, nil) }()
	for v.view.Load() == nil {
		time.Sleep(time.Millisecond)
	}
	if err := v.Follow(context.Background(), nil); err == nil {
		t.Fatal("a second Follow was accepted")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	g, err := m.Acquire(context.Background(), "stopped", lease.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := v.Validate(context.Background(), "stopped", g.Token, ""); err != nil || !got.Valid {
		t.Fatalf("validate without the view: %+v %v", got, err)
	}
	if v.viewed.Load() != 0 {
		t.Fatal("answered from a stopped view")
	}
}

// A view that lags behind the barrier (a write it has not seen) does not
// answer: it waits, asks etcd for progress, and gives up to a read after
// viewWait; it never answers from the past.
func TestViewNeverAnswersBehindTheBarrier(t *testing.T) {
	_, v := setup(t)
	w := newView(v.cli, v.ks.Locks())
	w.mu.Lock()
	w.live, w.rev = true, 5
	w.queues.put("q/", "q/a", 3, keyspace.Shape{})
	asked := 0
	w.request = func() { asked++ }
	w.mu.Unlock()
	if hs, ok := w.holders(context.Background(), "q/", 5); !ok || hs.oldest != 3 {
		t.Fatalf("holders at the view's revision = %v, %v", hs, ok)
	}
	start := time.Now()
	if _, ok := w.holders(context.Background(), "q/", 6); ok {
		t.Fatal("answered for a revision the view has not reached")
	}
	if asked != 1 || time.Since(start) < viewWait {
		t.Fatalf("asked for progress %d times, gave up after %v", asked, time.Since(start))
	}
}

// TestViewBackoffResetsAfterAWorkingFollow: the wait before the holder view
// follows etcd again doubles while follows break at once, and is back to
// the minimum after a follow that worked for a while.
func TestViewBackoffResetsAfterAWorkingFollow(t *testing.T) {
	for _, tc := range []struct {
		name      string
		prev, ran time.Duration
		want      time.Duration
	}{
		{"first break", 0, time.Millisecond, minViewBackoff},
		{"breaking at once", 200 * time.Millisecond, time.Millisecond, 400 * time.Millisecond},
		{"capped", 4 * time.Second, time.Millisecond, maxViewBackoff},
		{"after a working follow", maxViewBackoff, followedLong, minViewBackoff},
		{"after a short follow", maxViewBackoff, followedLong - time.Second, maxViewBackoff},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := viewBackoff(tc.prev, tc.ran); got != tc.want {
				t.Fatalf("viewBackoff(%v, %v) = %v, want %v", tc.prev, tc.ran, got, tc.want)
			}
		})
	}
}
