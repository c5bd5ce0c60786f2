package shard

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// endLog collects what a WatchEnds observed.
type endLog struct {
	mu   sync.Mutex
	ends []EndedGrant
}

func (l *endLog) observe(e EndedGrant) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ends = append(l.ends, e)
}

// of waits for the end of the grant (name, token) and checks that it was
// observed once.
func (l *endLog) of(t *testing.T, name string, token int64) EndedGrant {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		l.mu.Lock()
		var seen []EndedGrant
		for _, e := range l.ends {
			if e.Name == name && e.Token == token {
				seen = append(seen, e)
			}
		}
		l.mu.Unlock()
		switch {
		case len(seen) > 1:
			t.Fatalf("the end of %s/%d observed %d times: %+v", name, token, len(seen), seen)
		case len(seen) == 1:
			return seen[0]
		case time.Now().After(deadline):
			t.Fatalf("the end of %s/%d not observed within 5s", name, token)
		}
	}
}

func (l *endLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ends)
}

// watchEnds runs WatchEnds until the test ends (or stop), and returns once
// it is registered.
func watchEnds(t *testing.T, o *Owner) (l *endLog, stop func() error) {
	t.Helper()
	l = &endLog{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- o.WatchEnds(ctx, l.observe) }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, ok := endFeeds.Load(o); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("WatchEnds did not register within 5s")
		}
	}
	var once sync.Once
	var err error
	stop = func() error { once.Do(func() { cancel(); err = <-done }); return err }
	t.Cleanup(func() { _ = stop() })
	return l, stop
}

// WatchEnds reports every end the member's tables make, once, with how it
// ended and how long the grant was held: a release, a force release, an
// expiry (no call sees it: the hold-time metrics on the shard core never
// moved without this), and the release of a grant a new table took over
// from etcd (its acquisition time is the record's). A dropped table ends
// no grant and reports nothing. Once WatchEnds returns, nothing more.
func TestWatchEndsReportsEachEndOnce(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	ends, stop := watchEnds(t, o)
	if err := o.WatchEnds(ctx, func(EndedGrant) {}); !errors.Is(err, errEndsWatched) {
		t.Fatalf("a second WatchEnds: %v, want errEndsWatched", err)
	}

	const hold = 100 * time.Millisecond
	rel, err := o.Acquire(ctx, acq("rel", 10*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(hold)
	if ok, err := o.Release(ctx, "rel", rel.Token, rel.Handle, "alice"); err != nil || !ok {
		t.Fatalf("release = %v, %v", ok, err)
	}
	if e := ends.of(t, "rel", rel.Token); e.End != GrantReleased || e.Held < hold || e.Held > 5*time.Second || !e.AcquiredAt.Equal(rel.AcquiredAt) {
		t.Fatalf("the release observed as %+v (acquired at %v), want released after %v or more", e, rel.AcquiredAt, hold)
	}

	force, err := o.Acquire(ctx, acq("force", 10*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := o.ForceRelease(ctx, "force", force.Token); err != nil || !ok {
		t.Fatalf("force release = %v, %v", ok, err)
	}
	if e := ends.of(t, "force", force.Token); e.End != GrantForced {
		t.Fatalf("the force release observed as %+v", e)
	}

	const ttl = 300 * time.Millisecond
	exp, err := o.Acquire(ctx, acq("exp", ttl, 0))
	if err != nil {
		t.Fatal(err)
	}
	if e := ends.of(t, "exp", exp.Token); e.End != GrantExpired || e.Held < ttl {
		t.Fatalf("the expiry observed as %+v, want expired after %v or more", e, ttl)
	}

	// A table dropped and loaded again: the drop ends nothing, the new
	// table ends the grant it loaded.
	kept, err := o.Acquire(ctx, acq("kept", 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	n := o.ShardOf("kept")
	s := o.shards[n]
	s.mu.Lock()
	term := s.term
	s.mu.Unlock()
	before := ends.len()
	o.lost(n)
	o.acquired(n, term)
	waitServing(t, o)
	if got := ends.len(); got != before {
		t.Fatalf("a dropped and reloaded table reported %d ends", got-before)
	}
	if ok, err := o.Release(ctx, "kept", kept.Token, kept.Handle, "alice"); err != nil || !ok {
		t.Fatalf("release of the reloaded grant = %v, %v", ok, err)
	}
	// The record keeps milliseconds.
	if e := ends.of(t, "kept", kept.Token); e.End != GrantReleased || !e.AcquiredAt.Equal(kept.AcquiredAt.Truncate(time.Millisecond)) {
		t.Fatalf("the reloaded grant's release observed as %+v (acquired at %v)", e, kept.AcquiredAt)
	}

	if err := stop(); err != nil {
		t.Fatalf("WatchEnds returned %v at its context's end, want nil", err)
	}
	before = ends.len()
	late, err := o.Acquire(ctx, acq("late", 10*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := o.Release(ctx, "late", late.Token, late.Handle, "alice"); err != nil || !ok {
		t.Fatalf("release = %v, %v", ok, err)
	}
	if got := ends.len(); got != before {
		t.Fatalf("%d ends observed after WatchEnds returned", got-before)
	}
	if _, ok := endFeeds.Load(o); ok {
		t.Fatal("the feed is still registered after WatchEnds returned")
	}
}
