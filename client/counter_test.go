package client_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordinatord/coordinatord/client"
)

func TestHitCounterAndReset(t *testing.T) {
	c := client.New(mustConn(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i, want := range []bool{true, true, false} {
		r, err := c.Hit(ctx, "sdk-counter/a", 2, time.Minute)
		if err != nil || r.Allowed != want {
			t.Fatalf("hit %d: %+v, %v; want allowed %v", i, r, err, want)
		}
		if !want && (r.RetryAfter <= 0 || r.Count != 2 || r.ResetAt.IsZero()) {
			t.Fatalf("refused hit: %+v", r)
		}
	}
	s, err := c.Counter(ctx, "sdk-counter/a")
	if err != nil || !s.Exists || s.Count != 2 || s.Limit != 2 || s.Window != time.Minute {
		t.Fatalf("Counter = %+v, %v", s, err)
	}
	if existed, err := c.ResetCounter(ctx, "sdk-counter/a"); err != nil || !existed {
		t.Fatalf("ResetCounter = %v, %v", existed, err)
	}
	if s, err := c.Counter(ctx, "sdk-counter/a"); err != nil || s.Exists {
		t.Fatalf("Counter after reset = %+v, %v", s, err)
	}
	// A retry with the caller's request id is answered, not counted.
	for i := range 2 {
		r, err := c.Hit(ctx, "sdk-counter/b", 5, time.Minute, client.WithHitRequestID("sdk-retry-0123456789"), client.WithHits(2))
		if err != nil || r.Count != 2 || r.Replayed != (i == 1) {
			t.Fatalf("hit %d with one request id: %+v, %v", i, r, err)
		}
	}
	if _, err := c.Hit(ctx, "sdk-counter/c", 0, time.Minute); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("limit 0: %v; want INVALID_ARGUMENT", err)
	}
}

func TestLimiterAllowAndWait(t *testing.T) {
	c := client.New(mustConn(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l := c.Limiter("sdk-limiter/a", 2, 300*time.Millisecond, client.WithTokenBucket())
	var got []bool
	for range 3 {
		got = append(got, l.Allow(ctx))
	}
	if !got[0] || !got[1] || got[2] {
		t.Fatalf("Allow x3 = %v: a bucket of 2 allows exactly 2 at once", got)
	}
	if err := l.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	short, cancelShort := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancelShort()
	if err := l.Wait(short); err == nil {
		t.Fatal("Wait on an empty bucket returned before its deadline without error")
	}
}
