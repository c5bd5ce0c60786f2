package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

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
	l, err := c.Hold(ctxT(t, 10*time.Second), "breakhold/x", client.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if l.Err() != nil {
		t.Fatalf("after a broken stream: %v, want held", l.Err())
	}
	kinds := faults.holdStreams("breakhold/x")
	if len(kinds) < 2 || kinds[0] != "acquire" || kinds[1] != "resume" {
		t.Fatalf("Hold streams opened: %q, want acquire then resume", kinds)
	}
	if err := l.Release(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}
