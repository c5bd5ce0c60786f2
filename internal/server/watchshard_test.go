package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// Watch on both lock cores: the queue core follows a lock's queue in etcd,
// the shard-owner core the keys of its grants and, for how each ended, its
// lock's end marker (watchshard.go); both answer with one contract.

// The kinds a release, an expiry and a force release are reported with, on
// either core.
const (
	kindReleased = coordinatorv1.WatchResponse_KIND_RELEASED
	kindExpired  = coordinatorv1.WatchResponse_KIND_EXPIRED
	kindForced   = coordinatorv1.WatchResponse_KIND_FORCE_RELEASED
)

// onEachCore runs f as a subtest on each core, telling it which.
func onEachCore(t *testing.T, f func(t *testing.T, core string, e *env)) {
	for _, core := range cores {
		t.Run(core, func(t *testing.T) { f(t, core, newCoreEnv(t, core)) })
	}
}

// watchStream is an open Watch and its events, received in the background.
type watchStream struct {
	t    *testing.T
	evs  chan *coordinatorv1.WatchResponse
	errc chan error
}

// openWatchOn opens a Watch of name from start on lc, until the test ends.
func openWatchOn(t *testing.T, lc coordinatorv1.LockServiceClient, name string, start int64) *watchStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := lc.Watch(ctx, &coordinatorv1.WatchRequest{Name: name, StartRevision: start})
	if err != nil {
		t.Fatal(err)
	}
	w := &watchStream{t: t, evs: make(chan *coordinatorv1.WatchResponse, 1024), errc: make(chan error, 1)}
	go func() {
		for {
			r, err := st.Recv()
			if err != nil {
				w.errc <- err
				return
			}
			w.evs <- r
		}
	}()
	return w
}

// next is the next event; the test fails if the stream ends or nothing
// comes within 15s.
func (w *watchStream) next() *coordinatorv1.WatchResponse {
	w.t.Helper()
	select {
	case r := <-w.evs:
		return r
	case err := <-w.errc:
		w.errc <- err
		w.t.Fatalf("the watch ended: %v", err)
	case <-time.After(15 * time.Second):
		w.t.Fatal("no watch event within 15s")
	}
	return nil
}

// quiet fails the test if an event comes within d.
func (w *watchStream) quiet(d time.Duration) {
	w.t.Helper()
	select {
	case r := <-w.evs:
		w.t.Fatalf("unexpected event %v", r)
	case <-time.After(d):
	}
}

// watchFails opens a Watch that must fail before its first event.
func watchFails(t *testing.T, lc coordinatorv1.LockServiceClient, req *coordinatorv1.WatchRequest) error {
	t.Helper()
	st, err := lc.Watch(ctxT(t, 15*time.Second), req)
	if err != nil {
		return err
	}
	r, err := st.Recv()
	if err == nil {
		t.Fatalf("Watch(%v) sent %v; want a failure before any event", req, r)
	}
	return err
}

type watchEv struct {
	kind  coordinatorv1.WatchResponse_Kind
	token int64
}

// A watcher sees the grants of a name and their ends in token order, each
// with its token, how it ended and, for a grant, its revision; a resume
// from the last revision seen + 1 replays exactly what followed.
func TestWatchOnCoresGrantsAndEndsInOrder(t *testing.T) {
	onEachCore(t, func(t *testing.T, _ string, e *env) {
		w := openWatchOn(t, e.lc, "w", 0)
		first := w.next()
		if first.Kind != coordinatorv1.WatchResponse_KIND_CURRENT || first.Holder != nil || first.Revision <= 0 {
			t.Fatalf("first event %v; want current/free", first)
		}
		a, err := e.lc.Acquire(ctxT(t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: "w", Ttl: dur(30 * time.Second), Owner: "worker-a"})
		if err != nil {
			t.Fatal(err)
		}
		e.release("w", a.Token, a.Handle)
		b := e.acquire("w", time.Second) // expires
		eventually(t, 10*time.Second, "b expired", func() bool { return !e.validate("w", b.Token).Valid })
		c := e.acquire("w", 30*time.Second)
		if _, err := e.lc.ForceRelease(ctxT(t, 5*time.Second), &coordinatorv1.ForceReleaseRequest{Name: "w", Token: c.Token}); err != nil {
			t.Fatal(err)
		}
		acq := coordinatorv1.WatchResponse_KIND_ACQUIRED
		want := []watchEv{{acq, a.Token}, {kindReleased, a.Token}, {acq, b.Token}, {kindExpired, b.Token}, {acq, c.Token}, {kindForced, c.Token}}
		var got []*coordinatorv1.WatchResponse
		last := first.Revision
		for i, wnt := range want {
			r := w.next()
			if r.Kind != wnt.kind || r.GetHolder().GetToken() != wnt.token || r.GetHolder().GetName() != "w" {
				t.Fatalf("event %d = %v; want %v %d", i, r, wnt.kind, wnt.token)
			}
			if r.Revision <= last || (r.Kind == acq && r.Revision != r.Holder.Token) {
				t.Fatalf("event %d at revision %d after %d: %v", i, r.Revision, last, r)
			}
			last = r.Revision
			got = append(got, r)
		}
		if got[0].Holder.Owner != "worker-a" || got[1].Holder.Owner != "worker-a" {
			t.Fatalf("the holder's owner: %v, %v", got[0].Holder, got[1].Holder)
		}
		w.quiet(100 * time.Millisecond)
		// Resume after each event: what followed, no gap, no duplicate.
		for i := range got {
			r := openWatchOn(t, e.lc, "w", got[i].Revision+1)
			for _, wnt := range got[i+1:] {
				if ev := r.next(); ev.Kind != wnt.Kind || ev.Revision != wnt.Revision || ev.GetHolder().GetToken() != wnt.GetHolder().GetToken() {
					t.Fatalf("resumed after event %d: %v; want %v", i, ev, wnt)
				}
			}
			r.quiet(50 * time.Millisecond)
		}
	})
}

// A hand-off (a release that grants the next waiter) is one revision on the
// shard core: the end comes first, then the grant.
func TestWatchShardCoreHandOffEndsBeforeItGrants(t *testing.T) {
	e := newCoreEnv(t, "shard")
	a := e.acquire("h", 30*time.Second)
	w := openWatchOn(t, e.lc, "h", 0)
	if r := w.next(); r.Kind != coordinatorv1.WatchResponse_KIND_CURRENT || r.GetHolder().GetToken() != a.Token {
		t.Fatalf("first event %v; want current holder %d", r, a.Token)
	}
	bch := e.acquireInBackground(&coordinatorv1.AcquireRequest{Name: "h", Ttl: dur(30 * time.Second)}, 1)
	e.release("h", a.Token, a.Handle)
	b := <-bch
	end, grant := w.next(), w.next()
	if end.Kind != kindReleased || end.GetHolder().GetToken() != a.Token ||
		grant.Kind != coordinatorv1.WatchResponse_KIND_ACQUIRED || grant.GetHolder().GetToken() != b.GetToken() || end.Revision != grant.Revision {
		t.Fatalf("hand-off: %v then %v; want the end of %d and the grant of %d in one revision", end, grant, a.Token, b.GetToken())
	}
}

// On the shard core, each way a grant ends is sent with its kind, read from
// the end marker of its lock at the revision of its delete: a release (of
// a mutex, of one holder of a semaphore while another holds on), an expiry
// (of its TTL, or with a max hold), a force release.
func TestWatchShardCoreEndCauses(t *testing.T) {
	e := newCoreEnv(t, "shard")
	ctx := ctxT(t, 60*time.Second)
	acquire := func(req *coordinatorv1.AcquireRequest) *coordinatorv1.AcquireResponse {
		t.Helper()
		g, err := e.lc.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	for _, tc := range []struct {
		name string
		req  *coordinatorv1.AcquireRequest
		end  func(name string, g *coordinatorv1.AcquireResponse) // nil: it expires
		want coordinatorv1.WatchResponse_Kind
	}{
		{name: "release", req: &coordinatorv1.AcquireRequest{Ttl: dur(30 * time.Second)},
			end: func(name string, g *coordinatorv1.AcquireResponse) { e.release(name, g.Token, g.Handle) }, want: kindReleased},
		{name: "semaphore release", req: &coordinatorv1.AcquireRequest{Ttl: dur(30 * time.Second), Limit: 3},
			end: func(name string, g *coordinatorv1.AcquireResponse) { e.release(name, g.Token, g.Handle) }, want: kindReleased},
		{name: "ttl", req: &coordinatorv1.AcquireRequest{Ttl: dur(time.Second)}, want: kindExpired},
		{name: "max hold", req: &coordinatorv1.AcquireRequest{Ttl: dur(2 * time.Second), MaxHold: dur(time.Second)}, want: kindExpired},
		{name: "force release", req: &coordinatorv1.AcquireRequest{Ttl: dur(30 * time.Second)},
			end: func(name string, g *coordinatorv1.AcquireResponse) {
				if _, err := e.lc.ForceRelease(ctx, &coordinatorv1.ForceReleaseRequest{Name: name, Token: g.Token}); err != nil {
					t.Fatal(err)
				}
			}, want: kindForced},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "causes/" + tc.name
			tc.req.Name = name
			var other *coordinatorv1.AcquireResponse
			if tc.req.Limit > 1 { // another holder, who stays
				other = acquire(proto.Clone(tc.req).(*coordinatorv1.AcquireRequest))
			}
			w := openWatchOn(t, e.lc, name, 0)
			if r := w.next(); r.Kind != coordinatorv1.WatchResponse_KIND_CURRENT || r.GetHolder().GetToken() != other.GetToken() {
				t.Fatalf("first event %v; want current holder %d", r, other.GetToken())
			}
			g := acquire(tc.req)
			if tc.end != nil {
				tc.end(name, g)
			}
			if r := w.next(); r.Kind != coordinatorv1.WatchResponse_KIND_ACQUIRED || r.GetHolder().GetToken() != g.Token {
				t.Fatalf("event %v; want the grant of %d", r, g.Token)
			}
			if r := w.next(); r.Kind != tc.want || r.GetHolder().GetToken() != g.Token || r.GetHolder().GetName() != name {
				t.Fatalf("event %v; want %v of %d", r, tc.want, g.Token)
			}
			w.quiet(100 * time.Millisecond)
		})
	}
}

// A start_revision etcd compacted away answers OUT_OF_RANGE
// REVISION_COMPACTED; one of a token epoch this replica has not adopted,
// UNAVAILABLE EPOCH_PAUSED; bad input, INVALID_ARGUMENT naming the field.
func TestWatchOnCoresRefusals(t *testing.T) {
	onEachCore(t, func(t *testing.T, _ string, e *env) {
		for range 3 {
			g := e.acquire("c", 30*time.Second)
			e.release("c", g.Token, g.Handle)
		}
		rev := e.rev()
		if _, err := e.cli.Compact(ctxT(t, 10*time.Second), rev); err != nil {
			t.Fatal(err)
		}
		err := watchFails(t, e.lc, &coordinatorv1.WatchRequest{Name: "c", StartRevision: 2})
		if code(err) != codes.OutOfRange || reasonOf(err) != "REVISION_COMPACTED" {
			t.Fatalf("watch from a compacted revision: %v; want OUT_OF_RANGE REVISION_COMPACTED", err)
		}
		err = watchFails(t, e.lc, &coordinatorv1.WatchRequest{Name: "c", StartRevision: keyspace.TokenOf(1, rev)})
		if code(err) != codes.Unavailable || reasonOf(err) != "EPOCH_PAUSED" {
			t.Fatalf("watch from a revision of a later epoch: %v; want UNAVAILABLE EPOCH_PAUSED", err)
		}
		for _, tc := range []struct {
			req   *coordinatorv1.WatchRequest
			field string
		}{
			{&coordinatorv1.WatchRequest{}, "name"},
			{&coordinatorv1.WatchRequest{Name: "c", StartRevision: -1}, "start_revision"},
			{&coordinatorv1.WatchRequest{Name: "c", StartRevision: rev + 1000}, "start_revision"},
		} {
			if err := watchFails(t, e.lc, tc.req); code(err) != codes.InvalidArgument || fieldOf(err) != tc.field {
				t.Errorf("Watch(%v): %v; want INVALID_ARGUMENT on %s", tc.req, err, tc.field)
			}
		}
		// The first revision after the compaction still resumes.
		w := openWatchOn(t, e.lc, "c", rev+1)
		g := e.acquire("c", 30*time.Second)
		if r := w.next(); r.Kind != coordinatorv1.WatchResponse_KIND_ACQUIRED || r.GetHolder().GetToken() != g.Token {
			t.Fatalf("after the compaction: %v; want the grant of %d", r, g.Token)
		}
	})
}

// A watch of a name sees that name alone, not the names it is a prefix of;
// a semaphore's holders come first as one CURRENT event each, oldest first.
func TestWatchOnCoresNamesAreIndependent(t *testing.T) {
	onEachCore(t, func(t *testing.T, _ string, e *env) {
		var pool []*coordinatorv1.AcquireResponse
		for range 2 {
			g, err := e.lc.Acquire(ctxT(t, 10*time.Second), semReq("job", 3, 30*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			pool = append(pool, g)
		}
		w := openWatchOn(t, e.lc, "job", 0)
		for i, g := range pool {
			if r := w.next(); r.Kind != coordinatorv1.WatchResponse_KIND_CURRENT || r.GetHolder().GetToken() != g.Token {
				t.Fatalf("current %d: %v; want holder %d", i, r, g.Token)
			}
		}
		for _, n := range []string{"job/1", "job-1", "jobs", "jo", "Job", "job%2F1"} {
			g := e.acquire(n, 30*time.Second)
			e.release(n, g.Token, g.Handle)
		}
		w.quiet(300 * time.Millisecond)
		e.release("job", pool[0].Token, pool[0].Handle)
		if r := w.next(); r.Kind == coordinatorv1.WatchResponse_KIND_CURRENT || r.Kind == coordinatorv1.WatchResponse_KIND_ACQUIRED ||
			r.GetHolder().GetToken() != pool[0].Token || r.GetHolder().GetName() != "job" {
			t.Fatalf("after the release: %v; want the end of %d", r, pool[0].Token)
		}
	})
}

// On a cluster of two members and a relay, a Watch of a name gives the same
// events on the member that owns the name's shard, on the other member and
// on the relay (it reads etcd where it is, forwarding nothing), and a
// resume on one replica from a revision another one sent continues it.
func TestWatchShardCoreSameEventsOnEveryReplica(t *testing.T) {
	e := startEtcdForShards(t)
	a := startReplica(t, e, "/t/", "a", false)
	b := startReplica(t, e, "/t/", "b", false)
	relay := startReplica(t, e, "/t/", "relay", true)
	waitSplit(t, []*fwdReplica{a, b}, relay)
	ctx := ctxT(t, 60*time.Second)
	name := namesOn(t, b, "jobs/", 1)[0]
	acquire := func(lc coordinatorv1.LockServiceClient, owner string) *coordinatorv1.AcquireResponse {
		t.Helper()
		g, err := lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(30 * time.Second), Owner: owner, Wait: dur(20 * time.Second)})
		if err != nil {
			t.Fatalf("acquire %s: %v", name, err)
		}
		return g
	}
	release := func(lc coordinatorv1.LockServiceClient, g *coordinatorv1.AcquireResponse) {
		t.Helper()
		if r, err := lc.Release(ctx, &coordinatorv1.ReleaseRequest{Name: name, Token: g.Token, Handle: g.Handle}); err != nil || !r.Released {
			t.Fatalf("release %s %d: %v, %v", name, g.Token, r, err)
		}
	}
	g1 := acquire(a.lc, "w1")
	replicas := []*fwdReplica{b, a, relay} // the owner first
	var streams []*watchStream
	for _, r := range replicas {
		streams = append(streams, openWatchOn(t, r.lc, name, 0))
	}
	// The current holder, at the revision each replica read it: the
	// same holder everywhere.
	for i, w := range streams {
		if r := w.next(); r.Kind != coordinatorv1.WatchResponse_KIND_CURRENT || r.GetHolder().GetToken() != g1.Token || r.GetHolder().GetOwner() != "w1" {
			t.Fatalf("current on %s: %v; want holder %d", replicas[i].id, r, g1.Token)
		}
	}
	// Through A (forwarded to B) and the relay: a release, a hand-off, a
	// force release.
	release(a.lc, g1)
	g2 := acquire(relay.lc, "w2")
	g3ch := make(chan *coordinatorv1.AcquireResponse, 1)
	go func() { g3ch <- acquire(a.lc, "w3") }()
	eventually(t, 10*time.Second, "a waiter queued", func() bool {
		d, err := relay.lc.Describe(ctx, &coordinatorv1.DescribeRequest{Name: name})
		return err == nil && len(d.GetWaiters()) == 1
	})
	release(relay.lc, g2)
	g3 := <-g3ch
	if _, err := a.lc.ForceRelease(ctx, &coordinatorv1.ForceReleaseRequest{Name: name, Token: g3.Token}); err != nil {
		t.Fatal(err)
	}
	acq := coordinatorv1.WatchResponse_KIND_ACQUIRED
	want := []watchEv{{kindReleased, g1.Token}, {acq, g2.Token}, {kindReleased, g2.Token}, {acq, g3.Token}, {kindForced, g3.Token}}
	var seen [][]*coordinatorv1.WatchResponse
	for i, w := range streams {
		var got []*coordinatorv1.WatchResponse
		for j, wnt := range want {
			r := w.next()
			if r.Kind != wnt.kind || r.GetHolder().GetToken() != wnt.token {
				t.Fatalf("event %d on %s: %v; want %v %d", j, replicas[i].id, r, wnt.kind, wnt.token)
			}
			got = append(got, r)
		}
		w.quiet(100 * time.Millisecond)
		seen = append(seen, got)
	}
	for i := 1; i < len(seen); i++ {
		for j := range seen[0] {
			if !proto.Equal(seen[i][j], seen[0][j]) {
				t.Fatalf("event %d on %s: %v; on the owner: %v", j, replicas[i].id, seen[i][j], seen[0][j])
			}
		}
	}
	// Resume on every replica after the release of g1, as another replica
	// sent it.
	for i, r := range replicas {
		w := openWatchOn(t, r.lc, name, seen[(i+1)%len(seen)][0].Revision+1)
		for j, wnt := range seen[0][1:] {
			if ev := w.next(); !proto.Equal(ev, wnt) {
				t.Fatalf("resumed event %d on %s: %v; want %v", j, r.id, ev, wnt)
			}
		}
		w.quiet(50 * time.Millisecond)
	}
}

// The shard core's Watch passes the same interceptors as the queue core's:
// an identity watches only the names of its prefixes.
func TestWatchShardCoreIsAuthorized(t *testing.T) {
	e := startEtcdForShards(t)
	a := startReplica(t, e, "/t/", "a", false, authFor(t, nil)...)
	eventually(t, 30*time.Second, "the member owns every shard", func() bool {
		for s := range uint32(fwdShards) {
			if _, ok := a.own().Owned(s); !ok {
				return false
			}
		}
		return true
	})
	for _, tc := range []struct {
		id, name string
		want     codes.Code
	}{
		{"alice", "jobs/1", codes.OK},
		{"alice", "other", codes.PermissionDenied},
		{"stranger", "jobs/1", codes.Unauthenticated},
	} {
		t.Run(fmt.Sprintf("%s %s", tc.id, tc.name), func(t *testing.T) {
			st, err := a.lc.Watch(as(ctxT(t, 15*time.Second), tc.id), &coordinatorv1.WatchRequest{Name: tc.name})
			if err == nil {
				_, err = st.Recv()
			}
			if code(err) != tc.want {
				t.Fatalf("Watch %s as %s: %v; want %v", tc.name, tc.id, err, tc.want)
			}
		})
	}
}
