package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/shard"
)

type holdStream = coordinatorv1.LockService_HoldClient

func (e *env) hold(ctx context.Context, first *coordinatorv1.HoldRequest) (holdStream, *coordinatorv1.AcquireResponse) {
	e.t.Helper()
	st, err := e.lc.Hold(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := st.Send(first); err != nil {
		e.t.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil {
		e.t.Fatalf("hold: %v", err)
	}
	if r.GetGranted() == nil {
		e.t.Fatalf("first hold event %v, want granted", r)
	}
	return st, r.GetGranted()
}

func holdAcquire(name string, ttl time.Duration, releaseOnDisconnect bool) *coordinatorv1.HoldRequest {
	return &coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Acquire{Acquire: &coordinatorv1.HoldAcquire{
		Request: &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(ttl)}, ReleaseOnDisconnect: releaseOnDisconnect}}}
}

var heartbeat = &coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Heartbeat{Heartbeat: &coordinatorv1.HoldHeartbeat{}}}

func TestHoldHeartbeatsKeepTheLockAndSilenceLosesIt(t *testing.T) {
	e := newEnv(t)
	const ttl = 2 * time.Second // heartbeats every ttl/5: robust on a slow -race run
	st, g := e.hold(ctxT(t, 30*time.Second), holdAcquire("h", ttl, false))
	if !g.SafeUntil.AsTime().Before(g.ExpiresAt.AsTime()) {
		t.Fatalf("safe_until %v not before expires_at %v", g.SafeUntil.AsTime(), g.ExpiresAt.AsTime())
	}
	for range 12 { // 4.8s: more than twice the TTL
		time.Sleep(ttl / 5)
		if err := st.Send(heartbeat); err != nil {
			t.Fatal(err)
		}
		r, err := st.Recv()
		if err != nil || r.GetRenewed() == nil {
			t.Fatalf("heartbeat answered %v, %v; want renewed", r, err)
		}
		if !r.GetRenewed().SafeUntil.AsTime().Before(r.GetRenewed().ExpiresAt.AsTime()) {
			t.Fatal("renewed safe_until not before expires_at")
		}
	}
	if v := e.validate("h", g.Token); !v.Valid {
		t.Fatalf("lock lost despite heartbeats: %v", v)
	}
	// Silence (the stream stays open): the lease ends within its TTL and the
	// stream says so.
	silent := time.Now()
	r, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if l := r.GetLost(); l == nil || l.Reason != coordinatorv1.HoldLost_REASON_EXPIRED || l.Token != g.Token {
		t.Fatalf("got %v, want lost/expired", r)
	}
	t.Logf("lost reported %v after the last heartbeat", time.Since(silent))
	if !raceEnabled && time.Since(silent) > ttl+1500*time.Millisecond {
		t.Errorf("lost reported %v after the last heartbeat; TTL is %v", time.Since(silent), ttl)
	}
	n := e.acquire("h", time.Second)
	if n.Token <= g.Token {
		t.Fatalf("new token %d not above %d", n.Token, g.Token)
	}
}

func TestHoldReleaseResumeAndDisconnect(t *testing.T) {
	e := newEnv(t)
	t.Run("release", func(t *testing.T) {
		st, g := e.hold(ctxT(t, 10*time.Second), holdAcquire("r", 30*time.Second, false))
		if err := st.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Release{Release: &coordinatorv1.HoldRelease{}}}); err != nil {
			t.Fatal(err)
		}
		r, err := st.Recv()
		if err != nil || !r.GetReleased().GetReleased() {
			t.Fatalf("release answered %v, %v", r, err)
		}
		if v := e.validate("r", g.Token); v.Valid {
			t.Fatal("still valid after release")
		}
	})
	t.Run("release_on_disconnect", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		_, g := e.hold(ctx, holdAcquire("d", 30*time.Second, true))
		cancel()
		eventually(t, 5*time.Second, "lock freed on disconnect", func() bool { return !e.validate("d", g.Token).Valid })
	})
	t.Run("disconnect_keeps_lease_until_ttl", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		_, g := e.hold(ctx, holdAcquire("k", 30*time.Second, false))
		cancel()
		time.Sleep(300 * time.Millisecond)
		if !e.validate("k", g.Token).Valid {
			t.Fatal("lock freed on disconnect without release_on_disconnect")
		}
		// Resume on a new stream (any replica) with the handle.
		st, g2 := e.hold(ctxT(t, 10*time.Second), &coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Resume{Resume: &coordinatorv1.HoldResume{Name: "k", Token: g.Token, Handle: g.Handle}}})
		if g2.Token != g.Token || g2.Handle != g.Handle || !g2.Resumed {
			t.Fatalf("resume granted %v, want token %d", g2, g.Token)
		}
		if err := st.Send(heartbeat); err != nil {
			t.Fatal(err)
		}
		if r, err := st.Recv(); err != nil || r.GetRenewed() == nil {
			t.Fatalf("heartbeat after resume: %v, %v", r, err)
		}
		// A resume with a wrong handle is refused.
		bad, _ := e.lc.Hold(ctxT(t, 5*time.Second))
		_ = bad.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Resume{Resume: &coordinatorv1.HoldResume{Name: "k", Token: g.Token + 1, Handle: g.Handle}}})
		if _, err := bad.Recv(); code(err) != codes.NotFound {
			t.Fatalf("resume with a stale token: %v, want NOT_FOUND", err)
		}
	})
	t.Run("force_release_is_reported", func(t *testing.T) {
		st, g := e.hold(ctxT(t, 10*time.Second), holdAcquire("f", 30*time.Second, false))
		r, err := e.lc.ForceRelease(ctxT(t, 5*time.Second), &coordinatorv1.ForceReleaseRequest{Name: "f", Token: g.Token})
		if err != nil || !r.Released {
			t.Fatalf("ForceRelease = %v, %v", r, err)
		}
		ev, err := st.Recv()
		if err != nil || ev.GetLost().GetReason() != coordinatorv1.HoldLost_REASON_FORCE_RELEASED {
			t.Fatalf("got %v, %v; want lost/force-released", ev, err)
		}
		r, err = e.lc.ForceRelease(ctxT(t, 5*time.Second), &coordinatorv1.ForceReleaseRequest{Name: "f", Token: g.Token})
		if err != nil || r.Released {
			t.Fatalf("second ForceRelease = %v, %v; want released=false", r, err)
		}
	})
}

// A grant that ends before its Hold stream starts watching is still
// reported with the right reason.
func TestHoldReportsAnEndThatHappenedBeforeItWatched(t *testing.T) {
	e := newEnv(t)
	g := e.acquire("early", 30*time.Second)
	if r, err := e.lc.ForceRelease(ctxT(t, 5*time.Second), &coordinatorv1.ForceReleaseRequest{Name: "early", Token: g.Token}); err != nil || !r.Released {
		t.Fatalf("ForceRelease: %v %v", r, err)
	}
	// Resume is refused (the grant is gone), so use the domain directly.
	if e.sharded() {
		w, err := e.coord.Shards().WatchGrant("early", g.Token)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		<-w.Done()
		if w.Reason() != shard.GrantForced {
			t.Fatalf("the watch of the grant after its end = %v; want force-released", w.Reason())
		}
		return
	}
	reason, err := e.mgr.AwaitEnd(ctxT(t, 5*time.Second), "early", g.Token, g.Handle)
	if err != nil || reason != lease.EndForced {
		t.Fatalf("AwaitEnd after the end = %v, %v; want force-released", reason, err)
	}
}
