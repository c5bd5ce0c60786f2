package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/coordinatord/coordinatord/client"
)

// TestSemaphore: two permits of a semaphore of 2 hold at once, on slots of
// their own; a third acquisition waits until one is released and takes its
// slot with a greater token.
func TestSemaphore(t *testing.T) {
	c := client.New(mustConn(t))
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sem := c.Semaphore("sdk/sem", 2)
	a, err := sem.Acquire(ctx, client.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	b, err := sem.Acquire(ctx, client.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if a.Slot() == b.Slot() {
		t.Fatalf("both permits on slot %d", a.Slot())
	}
	var held *client.HeldError
	if _, err := sem.Acquire(ctx, client.WithWait(0)); !errors.As(err, &held) {
		t.Fatalf("a third permit: %v, want *HeldError", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	third, err := sem.Acquire(ctx, client.WithWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if third.Slot() != a.Slot() || third.Token() <= a.Token() {
		t.Fatalf("third permit: slot %d token %d; the released one was slot %d token %d", third.Slot(), third.Token(), a.Slot(), a.Token())
	}
	for _, l := range []*client.Lock{b, third} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRWMutex: readers overlap, a writer waits for them, and a reader
// waits for the writer.
func TestRWMutex(t *testing.T) {
	c := client.New(mustConn(t))
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rw := c.RWMutex("sdk/rw")
	r1, err := rw.RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := rw.RLock(ctx, client.WithWait(0))
	if err != nil || !r2.Shared() {
		t.Fatalf("a second reader: %v", err)
	}
	var held *client.HeldError
	if _, err := rw.Lock(ctx, client.WithWait(0)); !errors.As(err, &held) {
		t.Fatalf("a writer beside readers: %v, want *HeldError", err)
	}
	for _, l := range []*client.Lock{r1, r2} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w, err := rw.Lock(ctx, client.WithWait(5*time.Second))
	if err != nil || w.Shared() {
		t.Fatalf("the writer once the readers left: %v", err)
	}
	if _, err := rw.RLock(ctx, client.WithWait(0)); !errors.As(err, &held) {
		t.Fatalf("a reader beside the writer: %v, want *HeldError", err)
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
