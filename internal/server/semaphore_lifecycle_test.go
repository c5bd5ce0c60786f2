package server_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// TestSemaphoreLifecycle: every lifecycle feature with three holders of a
// semaphore of 3 (a Hold stream, a request id, a session): Describe and
// List show them all with their slots, a retry of the request id gets the
// same permit, KeepAlive renews one, ForceRelease of a holder that is not
// the oldest hands its slot to the waiter, Watch reports every holder's
// start and end, Hold's release and the session's close end theirs.
func TestSemaphoreLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := e.lc.Watch(ctx, &coordinatorv1.WatchRequest{Name: "pool"})
	if err != nil {
		t.Fatal(err)
	}
	if first, err := w.Recv(); err != nil || first.GetKind() != coordinatorv1.WatchResponse_KIND_CURRENT || first.GetHolder() != nil {
		t.Fatalf("first event %v, %v; want current/free", first, err)
	}
	hreq := holdAcquire("pool", 30*time.Second, false)
	hreq.GetAcquire().Request.Limit = 3
	st, a := e.hold(ctxT(t, 30*time.Second), hreq)
	breq := semReq("pool", 3, 30*time.Second)
	breq.RequestId = "semaphore-lifecycle-request-1"
	b, err := e.lc.Acquire(ctxT(t, 10*time.Second), breq)
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.lc.Acquire(ctxT(t, 10*time.Second), breq)
	if err != nil || again.GetToken() != b.GetToken() || again.GetSlot() != b.GetSlot() || !again.GetResumed() {
		t.Fatalf("retry of the request id: %v, %v; want the same permit resumed", again, err)
	}
	other := semReq("pool", 2, 30*time.Second)
	other.RequestId = breq.RequestId
	if _, err := e.lc.Acquire(ctxT(t, 10*time.Second), other); code(err) != codes.FailedPrecondition || infoOf(err).GetReason() != "REQUEST_ID_REUSED" {
		t.Fatalf("the request id with another limit: %v, want REQUEST_ID_REUSED", err)
	}
	s, err := e.lc.OpenSession(ctxT(t, 10*time.Second), &coordinatorv1.OpenSessionRequest{Ttl: dur(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := e.lc.Acquire(ctxT(t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: "pool", Limit: 3, SessionHandle: s.GetHandle()})
	if err != nil {
		t.Fatal(err)
	}
	slots := []int32{a.GetSlot(), b.GetSlot(), c.GetSlot()}
	if sorted := slices.Sorted(slices.Values(slots)); !slices.Equal(sorted, []int32{0, 1, 2}) {
		t.Fatalf("slots %v, want 0, 1, 2", slots)
	}
	dreq := semReq("pool", 3, 30*time.Second)
	dreq.Owner = "d"
	dch := e.acquireInBackground(dreq, 1)

	d := e.describe("pool")
	if len(d.GetHolders()) != 3 || d.GetHolder().GetToken() != a.GetToken() || len(d.GetWaiters()) != 1 || d.GetWaiters()[0].GetOwner() != "d" {
		t.Fatalf("describe: %v", d)
	}
	for i, h := range d.GetHolders() {
		if h.GetToken() != []int64{a.GetToken(), b.GetToken(), c.GetToken()}[i] || h.GetSlot() != slots[i] || h.GetLimit() != 3 ||
			h.GetMode() != coordinatorv1.LockMode_LOCK_MODE_EXCLUSIVE || h.GetExpiresAt() == nil {
			t.Errorf("describe holder %d: %v", i, h)
		}
	}
	l, err := e.lc.List(ctxT(t, 10*time.Second), &coordinatorv1.ListRequest{Prefix: "pool"})
	if err != nil || len(l.GetHolders()) != 3 {
		t.Fatalf("list: %v, %v; want 3 holders", l, err)
	}
	if _, err := e.lc.KeepAlive(ctxT(t, 10*time.Second), &coordinatorv1.KeepAliveRequest{Name: "pool", Token: b.GetToken(), Handle: b.GetHandle()}); err != nil {
		t.Fatalf("keepalive of a permit: %v", err)
	}
	// Force-release the middle holder: its slot passes to the waiter.
	fr, err := e.lc.ForceRelease(ctxT(t, 10*time.Second), &coordinatorv1.ForceReleaseRequest{Name: "pool", Token: b.GetToken()})
	if err != nil || !fr.GetReleased() {
		t.Fatalf("force release of a permit: %v, %v", fr, err)
	}
	var dg *coordinatorv1.AcquireResponse
	select {
	case dg = <-dch:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not granted the force-released permit")
	}
	if dg == nil || dg.GetSlot() != b.GetSlot() {
		t.Fatalf("the waiter got %v; want slot %d", dg, b.GetSlot())
	}
	if err := st.Send(heartbeat); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Recv(); err != nil || r.GetRenewed() == nil {
		t.Fatalf("hold heartbeat: %v, %v", r, err)
	}
	if err := st.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Release{Release: &coordinatorv1.HoldRelease{}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Recv(); err != nil || r.GetReleased() == nil {
		t.Fatalf("hold release: %v, %v", r, err)
	}
	if r, err := e.lc.CloseSession(ctxT(t, 10*time.Second), &coordinatorv1.CloseSessionRequest{Handle: s.GetHandle()}); err != nil || len(r.GetReleased()) != 1 {
		t.Fatalf("close session: %v, %v", r, err)
	}
	e.release("pool", dg.GetToken(), dg.GetHandle())

	type ev struct {
		kind  coordinatorv1.WatchResponse_Kind
		token int64
	}
	acq, rel := coordinatorv1.WatchResponse_KIND_ACQUIRED, coordinatorv1.WatchResponse_KIND_RELEASED
	want := []ev{
		{acq, a.GetToken()}, {acq, b.GetToken()}, {acq, c.GetToken()},
		{coordinatorv1.WatchResponse_KIND_FORCE_RELEASED, b.GetToken()}, {acq, dg.GetToken()},
		{rel, a.GetToken()}, {rel, c.GetToken()}, {rel, dg.GetToken()},
	}
	for i, wnt := range want {
		r, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if r.GetKind() != wnt.kind || r.GetHolder().GetToken() != wnt.token {
			t.Fatalf("watch event %d = %v %d, want %v %d", i, r.GetKind(), r.GetHolder().GetToken(), wnt.kind, wnt.token)
		}
	}
	if k := e.queueKeys("pool"); k != 0 {
		t.Errorf("%d queue keys left behind", k)
	}
}

// TestSemaphoreLockDelayHoldsBackItsSlot: a permit force-released with a
// lock delay holds back its own slot for the delay, not the other slot.
func TestSemaphoreLockDelayHoldsBackItsSlot(t *testing.T) {
	e := newEnv(t)
	xreq := semReq("sem", 2, 2*time.Second) // the delay's lease outlives the grant's by the delay
	xreq.LockDelay = dur(2 * time.Second)
	x, err := e.lc.Acquire(ctxT(t, 10*time.Second), xreq)
	if err != nil {
		t.Fatal(err)
	}
	y, err := e.lc.Acquire(ctxT(t, 10*time.Second), semReq("sem", 2, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.lc.ForceRelease(ctxT(t, 10*time.Second), &coordinatorv1.ForceReleaseRequest{Name: "sem", Token: x.GetToken()}); err != nil {
		t.Fatal(err)
	}
	short := semReq("sem", 2, 30*time.Second)
	short.Wait = dur(300 * time.Millisecond)
	if _, err := e.lc.Acquire(ctxT(t, 10*time.Second), short); code(err) != codes.Aborted {
		t.Fatalf("acquire while the free slot is delayed: %v, want ABORTED", err)
	}
	e.release("sem", y.GetToken(), y.GetHandle())
	z, err := e.lc.Acquire(ctxT(t, 10*time.Second), short)
	if err != nil || z.GetSlot() != y.GetSlot() {
		t.Fatalf("acquire once the undelayed slot is free: %v, %v; want slot %d", z, err, y.GetSlot())
	}
	late, err := e.lc.Acquire(ctxT(t, 15*time.Second), semReq("sem", 2, 30*time.Second))
	if err != nil || late.GetSlot() != x.GetSlot() {
		t.Fatalf("acquire after the delay: %v, %v; want slot %d", late, err, x.GetSlot())
	}
}
