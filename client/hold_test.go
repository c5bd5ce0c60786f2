package client_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordinatord/coordinatord/client"
)

// A Lock held by a Hold stream ends as soon as the coordinator pushes the
// grant's end: well before its next heartbeat (a third of a 30s TTL).
func TestHoldNoticesAForceReleaseAtOnce(t *testing.T) {
	c := dial(t)
	l, err := c.Hold(ctxT(t, 10*time.Second), "hold/forced", client.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := c.ForceRelease(ctxT(t, 10*time.Second), "hold/forced", l.Token()); err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v; want true", ok, err)
	}
	waitDone(t, l, 5*time.Second)
	if !errors.Is(l.Err(), client.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", l.Err())
	}
	ctx := l.Context()
	if ctx.Err() == nil || !errors.Is(context.Cause(ctx), client.ErrLost) {
		t.Fatalf("Context: err %v cause %v; want cancelled by ErrLost", ctx.Err(), context.Cause(ctx))
	}
	if err := l.Release(ctxT(t, 10*time.Second)); err != nil {
		t.Fatalf("Release of a lost lock: %v", err)
	}
}

// Heartbeats on the stream keep the lock past its TTL; Release on the
// stream frees it for the next holder at once; a second holder is refused
// with the holder's token.
func TestHoldKeepsAndReleases(t *testing.T) {
	c1, c2 := dial(t), dial(t)
	l, err := c1.Hold(ctxT(t, 10*time.Second), "hold/keep", client.WithTTL(time.Second), client.WithOwner("holder"))
	if err != nil {
		t.Fatal(err)
	}
	var held *client.HeldError
	if _, err := c2.Hold(ctxT(t, 10*time.Second), "hold/keep", client.WithWait(0)); !errors.As(err, &held) || held.HolderToken != l.Token() {
		t.Fatalf("second Hold: %v, want a HeldError with token %d", err, l.Token())
	}
	time.Sleep(2500 * time.Millisecond)
	if l.Err() != nil {
		t.Fatalf("after 2.5 TTLs: %v, want held (heartbeats on the stream)", l.Err())
	}
	d, err := c2.Describe(ctxT(t, 10*time.Second), "hold/keep")
	if err != nil || d.Holder == nil || d.Holder.Token != l.Token() {
		t.Fatalf("Describe = %+v, %v; want holder token %d", d, err, l.Token())
	}
	if err := l.Release(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(l.Err(), client.ErrReleased) || !errors.Is(context.Cause(l.Context()), client.ErrReleased) {
		t.Fatalf("after Release: Err %v, cause %v", l.Err(), context.Cause(l.Context()))
	}
	l2, err := c2.TryAcquire(ctxT(t, 10*time.Second), "hold/keep")
	if err != nil {
		t.Fatalf("TryAcquire after the stream's release: %v", err)
	}
	_ = l2.Release(ctxT(t, 10*time.Second))
}

// A broken stream is resumed on a new one: the lock stays held, with the
// same token, and the resumed stream carries the heartbeats.
func TestHoldResumesABrokenStream(t *testing.T) {
	c := dial(t, client.WithBackoff(10*time.Millisecond, 50*time.Millisecond))
	name := uniqueName("breakhold/x") // the fault breaks a name's stream once
	l, err := c.Hold(ctxT(t, 10*time.Second), name, client.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if l.Err() != nil {
		t.Fatalf("after a broken stream: %v, want held", l.Err())
	}
	kinds := faults.holdStreams(name)
	if len(kinds) < 2 || kinds[0] != "acquire" || kinds[1] != "resume" {
		t.Fatalf("Hold streams opened: %q, want acquire then resume", kinds)
	}
	if err := l.Release(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// A Hold that waits past its context's deadline answers DEADLINE_EXCEEDED
// and leaves no waiter behind.
func TestHoldDeadlineWhileWaiting(t *testing.T) {
	c1, c2 := dial(t), dial(t)
	l, err := c1.Hold(ctxT(t, 10*time.Second), "hold/wait", client.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := c2.Hold(ctx, "hold/wait"); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("Hold past its deadline: %v, want DEADLINE_EXCEEDED", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, err := c1.Describe(ctxT(t, 10*time.Second), "hold/wait")
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Waiters) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiters 10s after the Hold gave up: %+v", d.Waiters)
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = l.Release(ctxT(t, 10*time.Second))
}

// With WithReleaseOnDisconnect, the coordinator releases the lock when the
// stream breaks: the Lock is lost (its resume finds the grant gone, or the
// resumed stream is told) and the lock is free for others.
func TestHoldReleaseOnDisconnect(t *testing.T) {
	c1, c2 := dial(t, client.WithBackoff(10*time.Millisecond, 50*time.Millisecond)), dial(t)
	name := uniqueName("breakhold/rod")
	l, err := c1.Hold(ctxT(t, 10*time.Second), name, client.WithTTL(6*time.Second), client.WithReleaseOnDisconnect())
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, l, 10*time.Second) // the first heartbeat, ~2s in, breaks the stream
	if !errors.Is(l.Err(), client.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", l.Err())
	}
	l2, err := c2.TryAcquire(ctxT(t, 10*time.Second), name)
	if err != nil {
		t.Fatalf("TryAcquire after the stream broke: %v (release_on_disconnect should free it)", err)
	}
	_ = l2.Release(ctxT(t, 10*time.Second))
	_ = l.Release(ctxT(t, 10*time.Second))
}

// uniqueName is prefix with a suffix of its own, so that a fault that
// strikes a name once strikes again under go test -count.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
}
