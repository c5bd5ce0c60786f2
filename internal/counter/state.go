package counter

import (
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"time"
)

// state is a counter's whole state, the value of its key: the value is its
// own clock (the window's end, the bucket's refill state, in unix
// nanoseconds on the deciding replica's clock), so a window that ended is a
// fresh window whatever etcd still holds.
type state struct {
	algo   Algorithm
	limit  int64         // of the last counted hit
	window time.Duration // of the last counted hit

	// Fixed window: the window ends at end (unix ns) and holds count hits.
	end   int64
	count int64

	// Token bucket: used tokens, in units of 1/window (a token is window
	// units, so a bucket holds limit*window units), as of at (unix ns); the
	// bucket refills limit units per nanosecond. Integers throughout, so
	// the bucket is exact.
	used *big.Int
	at   int64

	// leaseEnd (unix ns): the key's lease lives at least until then.
	leaseEnd int64
}

// expiry is when the state holds nothing any more (unix ns): the window's
// end, or the instant the bucket is full again.
func (s *state) expiry() int64 {
	if s.algo == FixedWindow {
		return s.end
	}
	return s.at + ceilDiv(s.used, big.NewInt(s.limit)).Int64()
}

func (s *state) live(now int64) bool { return s != nil && now < s.expiry() }

func (s *state) encode() string {
	if s.algo == FixedWindow {
		return fmt.Sprintf("fw %d %d %d %d %d", s.limit, int64(s.window), s.end, s.count, s.leaseEnd)
	}
	return fmt.Sprintf("tb %d %d %s %d %d", s.limit, int64(s.window), s.used.String(), s.at, s.leaseEnd)
}

func decodeState(v []byte) (*state, error) {
	f := strings.Fields(string(v))
	if len(f) != 6 {
		return nil, fmt.Errorf("counter value %q: want 6 fields", v)
	}
	n := make([]int64, 6)
	s := &state{}
	for i, x := range f[1:] {
		if f[0] == "tb" && i == 2 {
			u, ok := new(big.Int).SetString(x, 10)
			if !ok || u.Sign() < 0 {
				return nil, fmt.Errorf("counter value %q: bad bucket level", v)
			}
			s.used = u
			continue
		}
		var err error
		if n[i+1], err = strconv.ParseInt(x, 10, 64); err != nil {
			return nil, fmt.Errorf("counter value %q: %w", v, err)
		}
	}
	s.limit, s.window, s.leaseEnd = n[1], time.Duration(n[2]), n[5]
	switch f[0] {
	case "fw":
		s.algo, s.end, s.count = FixedWindow, n[3], n[4]
	case "tb":
		s.algo, s.at = TokenBucket, n[4]
	default:
		return nil, fmt.Errorf("counter value %q: unknown algorithm", v)
	}
	if s.limit < 1 || s.window <= 0 {
		return nil, fmt.Errorf("counter value %q: bad limit or window", v)
	}
	return s, nil
}

// apply decides hit h at now on st (nil: no counter): the answer, and the
// state after it (st itself when nothing changes, nil for no counter).
func apply(st *state, h *Hit, now int64) (*state, Result, error) {
	if !st.live(now) {
		st = nil
	}
	if st != nil && st.algo != h.Algorithm {
		return st, Result{}, &AlgorithmMismatchError{Name: h.Name, Algorithm: st.algo}
	}
	if h.Algorithm == TokenBucket {
		next, r := applyBucket(st, h, now)
		return next, r, nil
	}
	next, r := applyWindow(st, h, now)
	return next, r, nil
}

func applyWindow(st *state, h *Hit, now int64) (*state, Result) {
	if st == nil {
		if h.Hits == 0 {
			return nil, Result{Allowed: true, Remaining: h.Limit}
		}
		next := &state{algo: FixedWindow, limit: h.Limit, window: h.Window, end: now + int64(h.Window), count: h.Hits}
		return next, Result{Allowed: true, Count: h.Hits, Remaining: h.Limit - h.Hits, ResetAt: time.Unix(0, next.end)}
	}
	r := Result{Count: st.count, ResetAt: time.Unix(0, st.end)}
	if st.count+h.Hits > h.Limit || (h.Hits == 0 && st.count >= h.Limit) {
		r.Remaining = max(0, h.Limit-st.count)
		r.RetryAfter = time.Duration(st.end - now)
		return st, r
	}
	r.Allowed = true
	if h.Hits == 0 {
		r.Remaining = h.Limit - st.count
		return st, r
	}
	next := *st
	next.count += h.Hits
	next.limit, next.window = h.Limit, h.Window
	r.Count, r.Remaining = next.count, h.Limit-next.count
	return &next, r
}

func applyBucket(st *state, h *Hit, now int64) (*state, Result) {
	w := big.NewInt(int64(h.Window))
	capacity := new(big.Int).Mul(big.NewInt(h.Limit), w)
	used, at := new(big.Int), now
	if st != nil {
		used = st.usedAt(now, h)
		at = max(st.at, now)
	}
	cost := new(big.Int).Mul(big.NewInt(h.Hits), w)
	after := new(big.Int).Add(used, cost)
	if after.Cmp(capacity) > 0 || (h.Hits == 0 && new(big.Int).Add(used, w).Cmp(capacity) > 0) {
		if h.Hits == 0 {
			after.Add(used, w)
		}
		wait := ceilDiv(after.Sub(after, capacity), big.NewInt(h.Limit)).Int64()
		return st, bucketResult(false, used, h, at, time.Duration(wait))
	}
	if h.Hits == 0 {
		return st, bucketResult(true, used, h, at, 0)
	}
	next := &state{algo: TokenBucket, limit: h.Limit, window: h.Window, used: after, at: at}
	if st != nil {
		next.leaseEnd = st.leaseEnd
	}
	return next, bucketResult(true, after, h, at, 0)
}

// usedAt is the bucket's level at now in the units of hit h's window:
// refilled since st.at, rescaled (rounding up: never in the caller's
// favour) when the hit brings another window.
func (st *state) usedAt(now int64, h *Hit) *big.Int {
	used := new(big.Int).Set(st.used)
	if elapsed := now - st.at; elapsed > 0 {
		used.Sub(used, new(big.Int).Mul(big.NewInt(elapsed), big.NewInt(st.limit)))
		if used.Sign() < 0 {
			used.SetInt64(0)
		}
	}
	if st.window != h.Window {
		tokens := ceilDiv(used, big.NewInt(int64(st.window)))
		used = tokens.Mul(tokens, big.NewInt(int64(h.Window)))
	}
	return used
}

func bucketResult(allowed bool, used *big.Int, h *Hit, at int64, wait time.Duration) Result {
	w := big.NewInt(int64(h.Window))
	count := ceilDiv(used, w).Int64()
	r := Result{Allowed: allowed, Count: count, Remaining: max(0, h.Limit-count), RetryAfter: wait}
	if used.Sign() > 0 {
		r.ResetAt = time.Unix(0, at+ceilDiv(used, big.NewInt(h.Limit)).Int64())
	}
	return r
}

// ceilDiv is ⌈a/b⌉ for a ≥ 0, b > 0.
func ceilDiv(a, b *big.Int) *big.Int {
	q, m := new(big.Int).QuoRem(a, b, new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	return q
}

// view is what Get answers of st at now.
func view(st *state, now int64) Counter {
	if !st.live(now) {
		return Counter{}
	}
	c := Counter{Exists: true, Algorithm: st.algo, Limit: st.limit, Window: st.window}
	if st.algo == FixedWindow {
		c.Count, c.ResetAt = st.count, time.Unix(0, st.end)
	} else {
		r := bucketResult(true, st.usedAt(now, &Hit{Window: st.window}), &Hit{Limit: st.limit, Window: st.window}, max(st.at, now), 0)
		c.Count, c.ResetAt = r.Count, r.ResetAt
	}
	c.Remaining = max(0, c.Limit-c.Count)
	return c
}
