package epoch_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// TestRestoreTwoRunningReplicasAgree: two replicas keep running across a
// restore without a bump. Both find it; one raises the epoch, the other
// adopts it (or raises it once more): they end in the same epoch, neither
// accepts a token of the lost history meanwhile, and a token granted
// through one validates through the other.
func TestRestoreTwoRunningReplicasAgree(t *testing.T) {
	ctx, m := runningMember(t)
	a, b := startCoord(t, m), startCoord(t, m)
	defer a.close()
	defer b.close()

	var old []grant
	for range 20 {
		g := a.acquire(t, ctx, "a")
		b.mustValidate(t, ctx, g, "db")
		a.release(t, ctx, g)
		old = append(old, g)
	}
	held := a.acquire(t, ctx, "b")
	for _, c := range []*coord{a, b} {
		if err := c.c.Epochs().Check(ctx); err != nil {
			t.Fatal(err)
		}
	}
	snap, _ := m.saveSnapshot(t, ctx)
	b.release(t, ctx, held)
	var lost []grant
	for range 10 {
		g := b.acquire(t, ctx, "a")
		a.mustValidate(t, ctx, g, "db")
		b.release(t, ctx, g)
		lost = append(lost, g)
	}
	lost = append(lost, a.acquire(t, ctx, "b"), held)

	m.stop()
	for _, c := range []*coord{a, b} { // a restore takes longer than a check interval
		eventually(t, 10*time.Second, "paused while etcd is away", func() bool { return c.c.Epochs().Status().Paused != "" })
	}
	m.start(t, m.restore(t, snap, 0))
	for deadline := time.Now().Add(20 * time.Second); ; {
		a.refused(t, ctx, lost, true)
		b.refused(t, ctx, lost, true)
		sa, sb := a.c.Epochs().Status(), b.c.Epochs().Status()
		if sa.Epoch >= 1 && sa.Epoch == sb.Epoch && sa.Paused == "" && sb.Paused == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas did not agree on a raised epoch: %+v, %+v", sa, sb)
		}
		time.Sleep(20 * time.Millisecond)
	}
	a.refused(t, ctx, append(old, lost...), true)
	b.refused(t, ctx, append(old, lost...), true)

	maxOld := int64(0)
	for _, g := range append(old, lost...) {
		maxOld = max(maxOld, g.token)
	}
	g := a.acquire(t, ctx, "a")
	if g.token <= maxOld {
		t.Fatalf("new token %d not above %d", g.token, maxOld)
	}
	b.mustValidate(t, ctx, g, "db")
	a.mustValidate(t, ctx, g, "")
}

// TestRestoreNotSeenInAPlainRestart: etcd stopped and started again on its
// own data is no restore. While it is away the replica pauses (UNAVAILABLE,
// EPOCH_PAUSED, once its last check is too old); when it is back the epoch
// is still 0 and the holder keeps its lock.
func TestRestoreNotSeenInAPlainRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m := newMember(t)
	dir := t.TempDir()
	m.start(t, dir)
	defer m.stop()
	c := startCoord(t, m)
	defer c.close()
	for range 20 {
		c.release(t, ctx, c.acquire(t, ctx, "a"))
	}
	held := c.acquire(t, ctx, "b")

	m.stop()
	eventually(t, 10*time.Second, "paused while etcd is away", func() bool { return c.c.Epochs().Status().Paused != "" })
	_, err := c.validate(ctx, held, "")
	if info := errorInfo(err); status.Code(err) != codes.Unavailable || info.GetReason() != "EPOCH_PAUSED" {
		t.Fatalf("validate while etcd is away: %v (%v); want UNAVAILABLE, EPOCH_PAUSED", err, info)
	}
	m.start(t, dir)
	eventually(t, 10*time.Second, "serving again", func() bool { return c.c.Epochs().Status().Paused == "" })
	if st := c.c.Epochs().Status(); st.Epoch != 0 || st.Bumps != 0 {
		t.Fatalf("a plain restart raised the epoch: %+v", st)
	}
	c.mustValidate(t, ctx, held, "")
	if _, err := unavailable(ctx, func() (*coordinatorv1.KeepAliveResponse, error) {
		return c.lock.KeepAlive(ctx, &coordinatorv1.KeepAliveRequest{Name: held.name, Token: held.token, Handle: held.handle})
	}); err != nil {
		t.Fatalf("KeepAlive after a plain restart: %v", err)
	}
}

func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not true after %v: %s", d, what)
		}
	}
}

func errorInfo(err error) *errdetails.ErrorInfo {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

// TestRestoreEndsHoldStreams: a Hold stream open across a restore, whose
// key comes back with the snapshot, is never renewed after it: its next
// heartbeat ends the stream (Lost, or UNAVAILABLE while the replica is
// paused), and its token does not validate.
func TestRestoreEndsHoldStreams(t *testing.T) {
	ctx, m := runningMember(t)
	c := startCoord(t, m)
	defer c.close()
	for range 20 {
		c.release(t, ctx, c.acquire(t, ctx, "a"))
	}
	hctx, hcancel := context.WithCancel(ctx)
	defer hcancel()
	stream, err := c.lock.Hold(hctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Acquire{Acquire: &coordinatorv1.HoldAcquire{
		Request: &coordinatorv1.AcquireRequest{Name: "h", Ttl: durationpb.New(30 * time.Second)}}}}); err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || first.GetGranted() == nil {
		t.Fatalf("Hold: %v, %v; want granted", first, err)
	}
	g := grant{name: "h", token: first.GetGranted().GetToken(), handle: first.GetGranted().GetHandle()}
	if err := c.c.Epochs().Check(ctx); err != nil {
		t.Fatal(err)
	}
	snap, _ := m.saveSnapshot(t, ctx)
	m.stop()
	eventually(t, 10*time.Second, "paused while etcd is away", func() bool { return c.c.Epochs().Status().Paused != "" })
	m.start(t, m.restore(t, snap, 0))
	eventually(t, 20*time.Second, "epoch raised", func() bool { st := c.c.Epochs().Status(); return st.Epoch >= 1 && st.Paused == "" })

	// The server may have ended the stream already (Send then answers
	// io.EOF, and Recv how it ended).
	_ = stream.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Heartbeat{Heartbeat: &coordinatorv1.HoldHeartbeat{}}})
	r, err := stream.Recv()
	switch {
	case err == nil && r.GetLost() != nil:
	case err != nil && status.Code(err) == codes.Unavailable:
	default:
		t.Fatalf("heartbeat of a Hold across the restore: %v, %v; want Lost", r, err)
	}
	t.Logf("the Hold stream ended with %v, %v", r, err)
	c.refused(t, ctx, []grant{g}, false)
}
