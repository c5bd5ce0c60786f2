package client

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// HitResult is the answer of Hit (CounterService.Hit).
type HitResult struct {
	// Allowed: the hits were counted (unless Uncounted) and may go ahead.
	Allowed bool
	// Count is the counter after the call (unchanged by a refused call);
	// Remaining is limit - Count.
	Count, Remaining int64
	// ResetAt is when the window ends (the bucket is full again); zero
	// when the counter holds nothing.
	ResetAt time.Time
	// RetryAfter: for a refused call, how long until the same hits may be
	// allowed.
	RetryAfter time.Duration
	// Uncounted: etcd was unavailable and the FAIL_OPEN policy let the hits
	// through without counting them.
	Uncounted bool
	// Replayed: the recorded answer of an earlier call with the same
	// request id (a retry); nothing was counted now.
	Replayed bool
}

// HitOption configures a Hit.
type HitOption func(*coordinatorv1.HitRequest)

// WithHits counts n hits instead of 1 (0 reads the counter without
// counting).
func WithHits(n int64) HitOption {
	return func(r *coordinatorv1.HitRequest) { r.Hits = wrapperspb.Int64(n) }
}

// WithTokenBucket counts with a token bucket (limit tokens, refilled at
// limit per window) instead of the default anchored fixed window.
func WithTokenBucket() HitOption {
	return func(r *coordinatorv1.HitRequest) { r.Algorithm = coordinatorv1.Algorithm_ALGORITHM_TOKEN_BUCKET }
}

// WithFailOpen lets the hits through, uncounted, when the coordinator
// cannot reach etcd (default: the server's policy, FAIL_CLOSED unless the
// daemon runs with -counter-fail-open).
func WithFailOpen() HitOption {
	return func(r *coordinatorv1.HitRequest) {
		r.OnUnavailable = coordinatorv1.UnavailablePolicy_UNAVAILABLE_POLICY_FAIL_OPEN
	}
}

// WithFailClosed refuses the hits with UNAVAILABLE when the coordinator
// cannot reach etcd, whatever the server's default.
func WithFailClosed() HitOption {
	return func(r *coordinatorv1.HitRequest) {
		r.OnUnavailable = coordinatorv1.UnavailablePolicy_UNAVAILABLE_POLICY_FAIL_CLOSED
	}
}

// WithHitRequestID sets the hit's request id (16 to 128 printable ASCII
// bytes), for a caller that retries across processes; by default Hit makes
// a fresh one per call and keeps it across its own retries.
func WithHitRequestID(id string) HitOption {
	return func(r *coordinatorv1.HitRequest) { r.RequestId = id }
}

// Hit counts one hit (WithHits: n) against the counter name, which allows
// limit hits per window, and answers whether it is allowed. A hit that
// would take the count above limit is refused and not counted. UNAVAILABLE
// is retried until ctx ends, with the same request id: a retried hit is
// never counted twice.
func (c *Client) Hit(ctx context.Context, name string, limit int64, window time.Duration, opts ...HitOption) (HitResult, error) {
	req := &coordinatorv1.HitRequest{Name: name, Limit: limit, Window: durationpb.New(window), RequestId: newRequestID()}
	for _, o := range opts {
		o(req)
	}
	var resp *coordinatorv1.HitResponse
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.cc.Hit(ctx, req)
		return err
	})
	if err != nil {
		return HitResult{}, err
	}
	r := HitResult{Allowed: resp.GetAllowed(), Count: resp.GetCount(), Remaining: resp.GetRemaining(),
		RetryAfter: resp.GetRetryAfter().AsDuration(), Uncounted: resp.GetUncounted(), Replayed: resp.GetReplayed()}
	if resp.GetResetAt() != nil {
		r.ResetAt = resp.GetResetAt().AsTime()
	}
	return r, nil
}

// CounterState is the answer of Counter (CounterService.Get).
type CounterState struct {
	Exists    bool // false: the counter holds nothing (no hit in a live window)
	Algorithm coordinatorv1.Algorithm
	Count     int64
	Limit     int64
	Remaining int64
	Window    time.Duration
	ResetAt   time.Time
}

// Counter reads the counter name without counting. UNAVAILABLE is retried
// until ctx ends.
func (c *Client) Counter(ctx context.Context, name string) (CounterState, error) {
	var resp *coordinatorv1.GetResponse
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.cc.Get(ctx, &coordinatorv1.GetRequest{Name: name})
		return err
	})
	if err != nil || !resp.GetExists() {
		return CounterState{}, err
	}
	return CounterState{Exists: true, Algorithm: resp.GetAlgorithm(), Count: resp.GetCount(), Limit: resp.GetLimit(),
		Remaining: resp.GetRemaining(), Window: resp.GetWindow().AsDuration(), ResetAt: resp.GetResetAt().AsTime()}, nil
}

// ResetCounter deletes the counter name (its next hit starts afresh) and
// tells whether it held anything. UNAVAILABLE is retried until ctx ends.
func (c *Client) ResetCounter(ctx context.Context, name string) (existed bool, err error) {
	err = c.retry(ctx, func(ctx context.Context) error {
		resp, err := c.cc.Reset(ctx, &coordinatorv1.ResetRequest{Name: name})
		existed = resp.GetExisted()
		return err
	})
	return existed, err
}

// Limiter is a ready rate limiter on one counter, shaped like
// golang.org/x/time/rate's: Allow for "may I, now?", Wait for "let me
// through when I may". It is exact across every process and replica that
// share the counter's name, and safe for concurrent use.
type Limiter struct {
	c      *Client
	name   string
	limit  int64
	window time.Duration
	opts   []HitOption
}

// Limiter returns a limiter of limit hits per window on the counter name
// (opts: WithTokenBucket, WithFailOpen, ...).
func (c *Client) Limiter(name string, limit int64, window time.Duration, opts ...HitOption) *Limiter {
	return &Limiter{c: c, name: name, limit: limit, window: window, opts: opts}
}

// Allow counts one hit and reports whether it is allowed. An error (the
// coordinator unreachable until ctx ended, a bad name) answers false: a
// limiter that cannot count refuses, unless it was made WithFailOpen.
func (l *Limiter) Allow(ctx context.Context) bool {
	r, err := l.c.Hit(ctx, l.name, l.limit, l.window, l.opts...)
	return err == nil && r.Allowed
}

// Wait counts one hit, waiting for as long as the counter says a refused
// hit must (its RetryAfter) and trying again, until the hit is allowed or
// ctx ends (ctx's error).
func (l *Limiter) Wait(ctx context.Context) error {
	for {
		r, err := l.c.Hit(ctx, l.name, l.limit, l.window, l.opts...)
		if err != nil || r.Allowed {
			return err
		}
		t := time.NewTimer(max(r.RetryAfter, time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
