package shard

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/locktable"
)

// watchRun is one Watch running in the background.
type watchRun struct {
	t      *testing.T
	evs    chan WatchEvent
	errc   chan error
	cancel context.CancelFunc
}

// startWatch runs o.Watch(f, start) until the test ends.
func startWatch(t *testing.T, o *Owner, f WatchFilter, start int64) *watchRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &watchRun{t: t, evs: make(chan WatchEvent, 1024), errc: make(chan error, 1), cancel: cancel}
	go func() {
		r.errc <- o.Watch(ctx, f, start, func(ev WatchEvent) error {
			select {
			case r.evs <- ev:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-r.errc; !errors.Is(err, context.Canceled) && !errors.Is(err, lease.ErrShuttingDown) {
			t.Errorf("the watch ended with %v", err)
		}
	})
	return r
}

// next is the next event, failing the test if the watch ends or none
// comes within 10s.
func (r *watchRun) next() WatchEvent {
	r.t.Helper()
	select {
	case ev := <-r.evs:
		return ev
	case err := <-r.errc:
		r.errc <- err
		r.t.Fatalf("the watch ended: %v", err)
	case <-time.After(10 * time.Second):
		r.t.Fatal("no watch event within 10s")
	}
	return WatchEvent{}
}

// quiet fails the test if an event comes within d.
func (r *watchRun) quiet(d time.Duration) {
	r.t.Helper()
	select {
	case ev := <-r.evs:
		r.t.Fatalf("unexpected event %s", evString(ev))
	case <-time.After(d):
	}
}

func evString(ev WatchEvent) string {
	if ev.Holder == nil {
		return fmt.Sprintf("%s@%d (free)", ev.Kind, ev.Revision)
	}
	return fmt.Sprintf("%s@%d %s#%d", ev.Kind, ev.Revision, ev.Holder.Name, ev.Holder.Token)
}

// watchErr runs a Watch that must fail before any event and returns its
// error.
func watchErr(t *testing.T, o *Owner, f WatchFilter, start int64) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := o.Watch(ctx, f, start, func(ev WatchEvent) error {
		t.Errorf("an event %s from a watch that must fail", evString(ev))
		return nil
	})
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Watch(%+v, %d) = %v; want a failure before any event", f, start, err)
	}
	return err
}

// wantEvent checks an event's kind, name and token.
func wantEvent(t *testing.T, ev WatchEvent, kind WatchKind, name string, token int64) {
	t.Helper()
	if ev.Kind != kind || ev.Holder == nil || ev.Holder.Name != name || ev.Holder.Token != token {
		t.Fatalf("event %s, want %s %s#%d", evString(ev), kind, name, token)
	}
	switch kind {
	case WatchGranted:
		if ev.Revision != token {
			t.Fatalf("grant %s at revision %d, want its token", evString(ev), ev.Revision)
		}
	case WatchEnded:
		if ev.Revision <= token {
			t.Fatalf("end %s, want a revision after its token", evString(ev))
		}
	}
}

// wantEnd checks an event is the end of name's grant token, as end.
func wantEnd(t *testing.T, ev WatchEvent, name string, token int64, end GrantEnd) {
	t.Helper()
	wantEvent(t, ev, WatchEnded, name, token)
	if ev.End != end {
		t.Fatalf("end %s: %v, want %v", evString(ev), ev.End, end)
	}
}

// A watch of one name sees its grants and their ends (release, hand-off,
// expiry, force release) in revision order with their tokens and how each
// ended, and nothing
// of the names that share its prefix; a resume from the revision after
// any event replays exactly what followed it.
func TestWatchNameGrantsAndEnds(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	w := startWatch(t, o, WatchFilter{Name: "w"}, 0)
	if ev := w.next(); ev.Kind != WatchCurrent || ev.Holder != nil || ev.Revision <= 0 {
		t.Fatalf("first event %s, want current/free", evString(ev))
	}
	noise := func() { // names that share a prefix with "w", on other shards or not
		for _, n := range []string{"w/x", "w-1", "ww", "W"} {
			g, err := o.Acquire(ctx, acq(n, 5*time.Second, 0))
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := o.Release(ctx, n, g.Token, g.Handle, "alice"); err != nil || !ok {
				t.Fatalf("release %s = %v, %v", n, ok, err)
			}
		}
	}
	var events []WatchEvent
	take := func(kind WatchKind, token int64, end ...GrantEnd) {
		t.Helper()
		ev := w.next()
		wantEvent(t, ev, kind, "w", token)
		if kind == WatchEnded && ev.End != end[0] {
			t.Fatalf("end %s: %v, want %v", evString(ev), ev.End, end[0])
		}
		if n := len(events); n > 0 && ev.Revision < events[n-1].Revision {
			t.Fatalf("revision %d after %d", ev.Revision, events[n-1].Revision)
		}
		events = append(events, ev)
	}

	// Released.
	a, err := o.Acquire(ctx, locktable.Acquire{Name: "w", Caller: "alice", Owner: "worker-a", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	noise()
	if ok, err := o.Release(ctx, "w", a.Token, a.Handle, "alice"); err != nil || !ok {
		t.Fatalf("release = %v, %v", ok, err)
	}
	take(WatchGranted, a.Token)
	if h := events[0].Holder; h.Owner != "worker-a" || h.TTL != 5*time.Second || h.AcquiredAt.IsZero() || h.Limit > 1 || h.Shared {
		t.Fatalf("granted holder %+v, want the record's owner, TTL and time", h)
	}
	take(WatchEnded, a.Token, GrantReleased)
	if events[1].Holder.Owner != "worker-a" {
		t.Fatalf("ended holder %+v, want the record's owner", events[1].Holder)
	}

	// A hand-off: the end and the next grant in one revision, the end first.
	b, err := o.Acquire(ctx, acq("w", 5*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	cch := make(chan *locktable.Grant, 1)
	go func() {
		g, err := o.Acquire(ctx, acq("w", 5*time.Second, 10*time.Second))
		if err != nil {
			t.Error(err)
		}
		cch <- g
	}()
	for {
		if _, ws, _ := o.Describe("w"); len(ws) == 1 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if ok, err := o.Release(ctx, "w", b.Token, b.Handle, "alice"); err != nil || !ok {
		t.Fatalf("release = %v, %v", ok, err)
	}
	c := <-cch
	if c == nil {
		t.FailNow()
	}
	take(WatchGranted, b.Token)
	take(WatchEnded, b.Token, GrantReleased)
	take(WatchGranted, c.Token)
	if events[3].Revision != events[4].Revision {
		t.Fatalf("the hand-off's end at %d and grant at %d, want one revision", events[3].Revision, events[4].Revision)
	}
	if ok, err := o.Release(ctx, "w", c.Token, c.Handle, "alice"); err != nil || !ok {
		t.Fatalf("release = %v, %v", ok, err)
	}
	take(WatchEnded, c.Token, GrantReleased)

	// Expired.
	d, err := o.Acquire(ctx, acq("w", 300*time.Millisecond, 0))
	if err != nil {
		t.Fatal(err)
	}
	take(WatchGranted, d.Token)
	take(WatchEnded, d.Token, GrantExpired)

	// Force-released.
	e, err := o.Acquire(ctx, acq("w", 5*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	noise()
	if ok, err := o.ForceRelease(ctx, "w", e.Token); err != nil || !ok {
		t.Fatalf("force release = %v, %v", ok, err)
	}
	take(WatchGranted, e.Token)
	take(WatchEnded, e.Token, GrantForced)
	w.quiet(100 * time.Millisecond)

	// Resume after each complete revision: exactly what followed.
	for i := -1; i < len(events)-1; i++ {
		start := events[0].Revision
		if i >= 0 {
			if events[i+1].Revision == events[i].Revision {
				continue // the middle of a revision is no resume point
			}
			start = events[i].Revision + 1
		}
		r := startWatch(t, o, WatchFilter{Name: "w"}, start)
		for _, want := range events[i+1:] {
			if got := r.next(); got.Kind != want.Kind || got.Revision != want.Revision || got.Holder.Token != want.Holder.Token || got.End != want.End {
				t.Fatalf("resumed from %d: %s, want %s", start, evString(got), evString(want))
			}
		}
		r.quiet(50 * time.Millisecond)
		r.cancel()
	}
}

// A watch from the current state shows every holder of a semaphore, oldest
// first, with its slot; a read-write lock's readers are shared.
func TestWatchCurrentHolders(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	var sem []*locktable.Grant
	for i := range 2 {
		g, err := o.Acquire(ctx, locktable.Acquire{Name: "pool", Caller: "alice", Owner: fmt.Sprint("s", i), TTL: 30 * time.Second, Limit: 3})
		if err != nil {
			t.Fatal(err)
		}
		sem = append(sem, g)
	}
	r, err := o.Acquire(ctx, locktable.Acquire{Name: "rw", Caller: "alice", TTL: 30 * time.Second, Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	w := startWatch(t, o, WatchFilter{Name: "pool"}, 0)
	var rev int64
	for i, g := range sem {
		ev := w.next()
		if ev.Kind != WatchCurrent || ev.Holder == nil || ev.Holder.Token != g.Token || ev.Holder.Slot != g.Slot ||
			ev.Holder.Limit != 3 || ev.Holder.Owner != fmt.Sprint("s", i) || ev.Revision < g.Token {
			t.Fatalf("current %d: %s %+v, want token %d slot %d", i, evString(ev), ev.Holder, g.Token, g.Slot)
		}
		if i > 0 && ev.Revision != rev {
			t.Fatalf("current events at revisions %d and %d, want one", rev, ev.Revision)
		}
		rev = ev.Revision
	}
	w.quiet(50 * time.Millisecond)
	rw := startWatch(t, o, WatchFilter{Name: "rw"}, 0)
	if ev := rw.next(); ev.Kind != WatchCurrent || ev.Holder == nil || ev.Holder.Token != r.Token || !ev.Holder.Shared {
		t.Fatalf("current of the read-write lock: %s %+v", evString(ev), ev.Holder)
	}
}

// A prefix watch sees the locks of its prefix on every shard and nothing
// else; a watch of every lock sees them all.
func TestWatchPrefixAndAllSpanShards(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	// Names of the prefix on at least two shards.
	var jobs []string
	shards := map[uint32]bool{}
	for i := 0; len(jobs) < 3 || len(shards) < 2; i++ {
		n := fmt.Sprintf("jobs/%d", i)
		jobs = append(jobs, n)
		shards[o.ShardOf(n)] = true
	}
	held, err := o.Acquire(ctx, acq(jobs[1], 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	first, err := o.Acquire(ctx, acq(jobs[0], 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	other, err := o.Acquire(ctx, acq("other", 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	pw := startWatch(t, o, WatchFilter{Prefix: "jobs/"}, 0)
	aw := startWatch(t, o, WatchFilter{All: true}, 0)
	// The current holders by name.
	wantEvent(t, pw.next(), WatchCurrent, jobs[0], first.Token)
	wantEvent(t, pw.next(), WatchCurrent, jobs[1], held.Token)
	wantEvent(t, aw.next(), WatchCurrent, jobs[0], first.Token)
	wantEvent(t, aw.next(), WatchCurrent, jobs[1], held.Token)
	wantEvent(t, aw.next(), WatchCurrent, "other", other.Token)

	var grants []*locktable.Grant
	for _, n := range append(jobs[2:], "jobsx", "other/jobs/1", jobs[0]) {
		if n == jobs[0] {
			if ok, err := o.Release(ctx, n, first.Token, first.Handle, "alice"); err != nil || !ok {
				t.Fatalf("release = %v, %v", ok, err)
			}
			continue
		}
		g, err := o.Acquire(ctx, acq(n, 30*time.Second, 0))
		if err != nil {
			t.Fatal(err)
		}
		g.Name = n
		grants = append(grants, g)
	}
	for _, g := range grants {
		if g.Name == "jobsx" || g.Name == "other/jobs/1" {
			continue
		}
		wantEvent(t, pw.next(), WatchGranted, g.Name, g.Token)
	}
	wantEnd(t, pw.next(), jobs[0], first.Token, GrantReleased)
	pw.quiet(100 * time.Millisecond)
	for _, g := range grants {
		wantEvent(t, aw.next(), WatchGranted, g.Name, g.Token)
	}
	wantEnd(t, aw.next(), jobs[0], first.Token, GrantReleased)
	aw.quiet(50 * time.Millisecond)

	// With nothing held under the prefix, the current state is one
	// event without a holder.
	nw := startWatch(t, o, WatchFilter{Prefix: "none/"}, 0)
	if ev := nw.next(); ev.Kind != WatchCurrent || ev.Holder != nil {
		t.Fatalf("current of an empty prefix: %s", evString(ev))
	}
}

// A start revision etcd compacted away answers lease.ErrCompacted before
// any event; one beyond etcd's revision is a field error; the first
// revision after the compaction resumes.
func TestWatchCompactedAndFutureStartRevisions(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	var last *locktable.Grant
	for range 3 {
		g, err := o.Acquire(ctx, acq("c", 30*time.Second, 0))
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := o.Release(ctx, "c", g.Token, g.Handle, "alice"); err != nil || !ok {
			t.Fatalf("release = %v, %v", ok, err)
		}
		last = g
	}
	resp, err := cli.Get(ctx, "/nothing")
	if err != nil {
		t.Fatal(err)
	}
	compacted := resp.Header.Revision
	if _, err := cli.Compact(ctx, compacted, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	for _, start := range []int64{2, last.Token, compacted - 1} {
		if err := watchErr(t, o, WatchFilter{Name: "c"}, start); !errors.Is(err, lease.ErrCompacted) {
			t.Fatalf("watch from compacted revision %d: %v, want lease.ErrCompacted", start, err)
		}
		if err := watchErr(t, o, WatchFilter{All: true}, start); !errors.Is(err, lease.ErrCompacted) {
			t.Fatalf("watch of every lock from compacted revision %d: %v, want lease.ErrCompacted", start, err)
		}
	}
	var fe *keyspace.FieldError
	if err := watchErr(t, o, WatchFilter{Name: "c"}, compacted+1000); !errors.As(err, &fe) || fe.Field != "start_revision" {
		t.Fatalf("watch from a future revision: %v, want a start_revision field error", err)
	}
	// From the compaction on, and from now: both work.
	w := startWatch(t, o, WatchFilter{Name: "c"}, compacted+1)
	cur := startWatch(t, o, WatchFilter{Name: "c"}, 0)
	if ev := cur.next(); ev.Kind != WatchCurrent || ev.Holder != nil {
		t.Fatalf("current after the compaction: %s", evString(ev))
	}
	g, err := o.Acquire(ctx, acq("c", 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	wantEvent(t, w.next(), WatchGranted, "c", g.Token)
	wantEvent(t, cur.next(), WatchGranted, "c", g.Token)
}

// Bad filters and start revisions are field errors.
func TestWatchRefusesBadInput(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	for _, tc := range []struct {
		f     WatchFilter
		start int64
		field string
	}{
		{WatchFilter{}, 0, "name"},
		{WatchFilter{Name: "bad\x00name"}, 0, "name"},
		{WatchFilter{Name: "ok"}, -1, "start_revision"},
		{WatchFilter{Name: "a", Prefix: "b"}, 0, "prefix"},
		{WatchFilter{All: true, Name: "a"}, 0, "name"},
	} {
		var fe *keyspace.FieldError
		if err := watchErr(t, o, tc.f, tc.start); !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("Watch(%+v, %d) = %v, want a %s field error", tc.f, tc.start, err, tc.field)
		}
	}
}

// A relay, which owns nothing, watches as the owner does; a graceful
// hand-over to another member changes nothing in etcd and so shows
// nothing; the closing owner's own watches end (ErrShuttingDown), the
// relay's go on and see the new owner's release.
func TestWatchOnARelayAndAcrossAHandOver(t *testing.T) {
	_, cli := ownerEtcd(t)
	o1 := startOwner(t, cli, WithMember("m1", "a1"))
	rctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	relay, err := NewOwner(rctx, cli, "/t/", WithShards(8), WithLeaseTTL(2*time.Second), WithMember("r", "ar"), AsRelay())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		relay.Close(cctx)
	})
	ctx := ctxT(t)
	g, err := o1.Acquire(ctx, locktable.Acquire{Name: "kept", Caller: "alice", TTL: 10 * time.Second, RequestID: "request-kept-1"})
	if err != nil {
		t.Fatal(err)
	}
	ow := startWatch(t, o1, WatchFilter{Name: "kept"}, 0)
	rw := startWatch(t, relay, WatchFilter{Name: "kept"}, 0)
	for _, w := range []*watchRun{ow, rw} {
		wantEvent(t, w.next(), WatchCurrent, "kept", g.Token)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	o1.Close(cctx)
	ccancel()
	select {
	case err := <-ow.errc:
		ow.errc <- err
		if !errors.Is(err, lease.ErrShuttingDown) {
			t.Fatalf("the closed owner's watch ended with %v, want lease.ErrShuttingDown", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the closed owner's watch goes on")
	}
	o2 := startOwner(t, cli, WithMember("m2", "a2"))
	rw.quiet(100 * time.Millisecond)
	if ok, err := o2.Release(ctx, "kept", g.Token, g.Handle, "alice"); err != nil || !ok {
		t.Fatalf("release on the new owner = %v, %v", ok, err)
	}
	wantEnd(t, rw.next(), "kept", g.Token, GrantReleased)
}

// Watches that start from the current state while the lock changes hands
// all the time each see a consistent history: the holder of the snapshot,
// then every change after it once (no grant shown both as current and as
// granted, no end of a holder it did not show), at most one holder at a
// time, and nobody left holding once the churn stops.
func TestWatchFromNowUnderChurn(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	stop := make(chan struct{})
	churned := make(chan struct{})
	go func() {
		defer close(churned)
		for w := range 3 {
			go func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					g, err := o.Acquire(ctx, locktable.Acquire{Name: "hot", Caller: fmt.Sprint(w), TTL: 5 * time.Second, Wait: 5 * time.Second})
					if err != nil {
						t.Error(err)
						return
					}
					if ok, err := o.Release(ctx, "hot", g.Token, g.Handle, fmt.Sprint(w)); err != nil || !ok {
						t.Errorf("release = %v, %v", ok, err)
						return
					}
				}
			}()
		}
		<-stop
	}()
	var watches []*watchRun
	for range 30 {
		watches = append(watches, startWatch(t, o, WatchFilter{Name: "hot"}, 0))
		time.Sleep(3 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	close(stop)
	<-churned
	deadline := time.Now().Add(10 * time.Second)
	for {
		if hs, _, err := o.Describe("hot"); err == nil && len(hs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the churn did not stop")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // every watch has its events by now
	for i, w := range watches {
		live := map[int64]bool{}
		seen := map[int64]bool{}
		var rev int64
	events:
		for {
			var ev WatchEvent
			select {
			case ev = <-w.evs:
			default:
				break events
			}
			if ev.Revision < rev {
				t.Fatalf("watch %d: %s after revision %d", i, evString(ev), rev)
			}
			rev = ev.Revision
			switch ev.Kind {
			case WatchCurrent:
				if ev.Holder != nil {
					live[ev.Holder.Token], seen[ev.Holder.Token] = true, true
				}
			case WatchGranted:
				if seen[ev.Holder.Token] || ev.Holder.Token != ev.Revision {
					t.Fatalf("watch %d: %s again or not at its token", i, evString(ev))
				}
				live[ev.Holder.Token], seen[ev.Holder.Token] = true, true
			case WatchEnded:
				if !live[ev.Holder.Token] {
					t.Fatalf("watch %d: %s of a holder it did not show", i, evString(ev))
				}
				delete(live, ev.Holder.Token)
			}
			if len(live) > 1 {
				t.Fatalf("watch %d: holders %v at once", i, live)
			}
		}
		if len(live) != 0 || len(seen) == 0 {
			t.Fatalf("watch %d: %d holders left, %d seen", i, len(live), len(seen))
		}
	}
}

// How a watch tells the ends of one revision apart, from an etcd history
// written by hand as owners write it: a semaphore whose holders end in one
// revision (a release, an expiry, a force release) and a mutex released in
// the same revision (one read of both markers); a marker that names the
// token but was written before its delete (an expiry, whatever it says);
// and, once that revision is compacted away, GrantEndUnknown.
func TestWatchEndCausesFromMarkers(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	grantKey := func(name, id string) string { return o.dataPrefix(o.ShardOf(name)) + keyspace.Escape(name) + "/" + id }
	markerKey := func(name string) string { return o.endedPrefix(o.ShardOf(name)) + keyspace.Escape(name) }
	put := func(key, value string, opts ...clientv3.OpOption) int64 {
		t.Helper()
		r, err := cli.Put(ctx, key, value, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	sem, mx := "raw/sem", "raw/mx"
	var tok []int64
	for i, n := range []string{sem, sem, sem, mx, mx} {
		tok = append(tok, put(grantKey(n, fmt.Sprint("g", i)), "not a record"))
	}
	r, err := cli.Txn(ctx).Then(
		clientv3.OpDelete(grantKey(sem, "g0")), clientv3.OpDelete(grantKey(sem, "g1")), clientv3.OpDelete(grantKey(sem, "g2")),
		clientv3.OpDelete(grantKey(mx, "g3")),
		clientv3.OpPut(markerKey(sem), fmt.Sprintf("released:%d,forced:%d", tok[0], tok[2])),
		clientv3.OpPut(markerKey(mx), fmt.Sprintf("released:%d", tok[3])),
	).Commit()
	if err != nil {
		t.Fatal(err)
	}
	both := r.Header.Revision
	put(markerKey(mx), fmt.Sprintf("released:%d", tok[4])) // not in the revision of the delete
	late, err := cli.Delete(ctx, grantKey(mx, "g4"))
	if err != nil {
		t.Fatal(err)
	}

	want := []struct {
		name  string
		token int64
		rev   int64
		end   GrantEnd
	}{
		{mx, tok[3], both, GrantReleased},
		{sem, tok[0], both, GrantReleased},
		{sem, tok[1], both, GrantExpired},
		{sem, tok[2], both, GrantForced},
		{mx, tok[4], late.Header.Revision, GrantExpired},
	}
	all := startWatch(t, o, WatchFilter{Prefix: "raw/"}, tok[0])
	one := startWatch(t, o, WatchFilter{Name: sem}, tok[0])
	for range tok {
		all.next() // the grants
	}
	for range 3 {
		one.next()
	}
	for _, w := range want {
		ev := all.next()
		wantEnd(t, ev, w.name, w.token, w.end)
		if ev.Revision != w.rev {
			t.Fatalf("end %s, want revision %d", evString(ev), w.rev)
		}
		if w.name == sem {
			wantEnd(t, one.next(), w.name, w.token, w.end)
		}
	}

	// Compacted before the markers are read: not known.
	if _, err := cli.Compact(ctx, late.Header.Revision); err != nil {
		t.Fatal(err)
	}
	gw := &grantWatch{o: o, data: o.prefix + "shards/data/"}
	h := &WatchHolder{Name: sem, Token: tok[0]}
	how, err := gw.endsAt(ctx, both, []*WatchHolder{h}, map[*WatchHolder]string{h: gw.markerOf(grantKey(sem, "g0"))})
	if err != nil || how[h] != GrantEndUnknown {
		t.Fatalf("ends at a compacted revision: %v, %v; want GrantEndUnknown", how, err)
	}
}
