package counter

import (
	"errors"
	"testing"
	"time"
)

// The token bucket is exact: a full bucket allows exactly limit hits at
// once, refills limit per window continuously, and tells how long until a
// refused hit would be allowed.
func TestTokenBucketArithmetic(t *testing.T) {
	const w = 300 * time.Millisecond
	h := func(n int64) *Hit { return &Hit{Name: "b", Hits: n, Limit: 3, Window: w, Algorithm: TokenBucket} }
	t0 := time.Now().UnixNano()
	var st *state
	for i := range 3 {
		next, r, err := apply(st, h(1), t0)
		if err != nil || !r.Allowed || r.Count != int64(i+1) || r.Remaining != int64(2-i) {
			t.Fatalf("hit %d: %+v, %v", i, r, err)
		}
		st = next
	}
	if _, r, _ := apply(st, h(1), t0); r.Allowed || r.RetryAfter != 100*time.Millisecond || r.Count != 3 {
		t.Fatalf("4th hit: %+v; want refused, retry after 100ms", r)
	}
	if _, r, _ := apply(st, h(1), t0+int64(100*time.Millisecond)-1); r.Allowed || r.RetryAfter != 1 {
		t.Fatalf("1ns early: %+v; want refused, retry after 1ns", r)
	}
	next, r, _ := apply(st, h(1), t0+int64(100*time.Millisecond))
	if !r.Allowed || r.Count != 3 {
		t.Fatalf("after 100ms: %+v; want one token back", r)
	}
	if _, r, _ := apply(next, h(0), t0+int64(400*time.Millisecond)); !r.Allowed || r.Count != 0 || r.Remaining != 3 {
		t.Fatalf("peek after a full refill: %+v; want an empty count", r)
	}
	if next.live(t0 + int64(400*time.Millisecond)) {
		t.Fatal("a full bucket is still live")
	}
	if _, _, err := apply(next, &Hit{Name: "b", Hits: 1, Limit: 3, Window: w, Algorithm: FixedWindow}, t0); !errors.As(err, new(*AlgorithmMismatchError)) {
		t.Fatalf("fixed-window hit on a live bucket: %v", err)
	}
}

func TestFixedWindowArithmetic(t *testing.T) {
	h := func(n int64) *Hit {
		return &Hit{Name: "w", Hits: n, Limit: 5, Window: time.Second, Algorithm: FixedWindow}
	}
	t0 := int64(1_000_000_000_000)
	st, r, _ := apply(nil, h(3), t0)
	if !r.Allowed || r.Count != 3 || st.end != t0+int64(time.Second) {
		t.Fatalf("first: %+v %+v", r, st)
	}
	if _, r, _ := apply(st, h(3), t0+1); r.Allowed || r.Count != 3 || r.RetryAfter != time.Second-1 {
		t.Fatalf("over the limit: %+v; want refused, count unchanged", r)
	}
	st2, r, _ := apply(st, h(2), t0+2)
	if !r.Allowed || r.Count != 5 || r.Remaining != 0 {
		t.Fatalf("up to the limit: %+v", r)
	}
	if _, r, _ := apply(st2, h(0), t0+3); r.Allowed || r.Remaining != 0 {
		t.Fatalf("peek at a full window: %+v; want not allowed", r)
	}
	if _, r, _ := apply(st2, h(1), st2.end); !r.Allowed || r.Count != 1 {
		t.Fatalf("at the window's end: %+v; want a fresh window", r)
	}
}

func TestStateEncoding(t *testing.T) {
	t0 := time.Now().UnixNano()
	w, _, _ := apply(nil, &Hit{Name: "w", Hits: 2, Limit: 5, Window: time.Second, Algorithm: FixedWindow}, t0)
	b, _, _ := apply(nil, &Hit{Name: "b", Hits: 2, Limit: 5, Window: time.Second, Algorithm: TokenBucket}, t0)
	for _, st := range []*state{w, b} {
		st.leaseEnd = 42
		got, err := decodeState([]byte(st.encode()))
		if err != nil || got.encode() != st.encode() {
			t.Fatalf("%q decodes to %+v, %v", st.encode(), got, err)
		}
	}
	for _, bad := range []string{"", "fw 1 2 3", "xx 1 1 1 1 1", "fw 0 1 1 1 1", "tb 1 1 -5 1 1"} {
		if _, err := decodeState([]byte(bad)); err == nil {
			t.Errorf("%q decoded", bad)
		}
	}
}
