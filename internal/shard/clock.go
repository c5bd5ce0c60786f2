package shard

// Clock is the clock a member measures its lease deadline on (lease.go).
//
// The deadline is only as safe as the clock is steady, so the clock must be
// monotonic: time.Now carries Go's monotonic reading, and Sub and Before
// between two such times use it, so a wall-clock step (NTP, an operator)
// moves nothing. What a monotonic clock cannot rule out is a rate error: a
// clock that runs slow makes the member believe less time has passed than
// etcd's leader does. Margin covers a rate error of 5% either way on both
// sides; SkewedClock lets tests (and chaos replicas) run a member at such a
// rate, since a fake time library cannot reach a pure Go binary (the
// runtime reads the clock through the vDSO, not libc).

import (
	"math"
	"time"
)

// Clock is the monotonic clock the lease deadline is measured on.
// time.Now carries a monotonic reading; tests inject skew with SkewedClock.
type Clock interface {
	Now() time.Time
	Since(t time.Time) time.Duration
}

// RealClock is the process's monotonic clock.
func RealClock() Clock { return clockReal{} }

type clockReal struct{}

func (clockReal) Now() time.Time                  { return time.Now() }
func (clockReal) Since(t time.Time) time.Duration { return time.Since(t) }

// SkewedClock runs at rate (1.05 = 5% fast, 0.95 = 5% slow) relative to the
// real clock from the moment it is made. Its times carry a monotonic
// reading, so they compare among themselves like real ones; comparing them
// with times of another clock is meaningless. It panics if rate is not a
// positive number.
func SkewedClock(rate float64) Clock {
	if rate <= 0 || math.IsNaN(rate) || math.IsInf(rate, 0) {
		panic("shard: SkewedClock rate must be positive")
	}
	return clockSkewed{base: time.Now(), rate: rate}
}

type clockSkewed struct {
	base time.Time
	rate float64
}

func (c clockSkewed) Now() time.Time {
	return c.base.Add(time.Duration(float64(time.Since(c.base)) * c.rate))
}

func (c clockSkewed) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
