package shard

// Lease is a member's one etcd lease and the deadline until which the
// member may still act on what it owns: rule S2, a deposed owner answers
// nothing and grants nothing once another member may own its shards.
//
// The safety argument, in four steps:
//
//  1. Lease renews itself, one KeepAliveOnce at a time, never through
//     clientv3's background KeepAlive, so that it knows t_sent, the instant
//     (on its Clock) just before it sent each renewal that etcd
//     acknowledged (and the Grant). KeepAliveOnce may retry internally; every
//     retry is sent after t_sent, so t_sent stays a lower bound.
//  2. etcd expires a lease no earlier than t_received + TTL, where
//     t_received is when its leader applied the Grant or received the
//     renewal (lessor.Grant/Renew), and t_sent <= t_received. A lease that
//     has expired cannot be renewed back (lessor.Renew waits for its
//     revocation and answers ErrLeaseNotFound).
//  3. A leader change only extends leases: the new leader's lessor.Promote
//     gives every lease a fresh expiry from the promotion (its remaining TTL
//     if checkpointed, which is no earlier than the old expiry).
//  4. So etcd can delete this member's keys (and another member can own
//     its shards) no earlier than t_sent + TTL on etcd's leader's clock.
//     The member stops at Deadline = t_sent + TTL - Margin(TTL) on its own
//     clock; Margin covers the two clocks' rate difference (see Margin).
//
// Renewals go every TTL/3 after the last acknowledged one; a failed one
// (etcd unreachable, a leader election) moves nothing, and retries follow
// every TTL/10 until one is acknowledged. Once the deadline has passed the
// member acts on nothing (Valid is false) but keeps trying: if etcd has
// expired the lease meanwhile, the next renewal that reaches it says so
// (ErrLeaseNotFound) and Lost closes.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Margin is how long before etcd's earliest expiry a member stops acting
// on its lease: max(ttl/10, 100ms).
//
// Why 10%: the member measures TTL on its clock and etcd's leader on
// its own. If the member's clock runs 5% slow, its ttl-m takes
// (ttl-m)/0.95 of real time; if the leader's runs 5% fast, the lease
// expires after ttl/1.05 of real time. Stopping first needs
// (ttl-m)/0.95 <= ttl/1.05, that is m >= 0.095*ttl: 10% covers a 5% rate
// error either way on both sides (crystal oscillators are off by 10^-4;
// 5% is a VM whose clock source misbehaves). Why 100ms: short TTLs need a
// floor for timer and scheduling latency between a check of Valid and the
// answer it allows.
func Margin(ttl time.Duration) time.Duration {
	return max(ttl/leaseMarginPart, leaseMinMargin)
}

const (
	leaseMarginPart = 10
	leaseMinMargin  = 100 * time.Millisecond
)

// Lease is a member's etcd lease, renewed by this type itself so that it
// knows t_sent of every renewal etcd acknowledged. It owns one goroutine,
// stopped by Close.
type Lease struct {
	cli   *clientv3.Client
	id    clientv3.LeaseID
	ttl   time.Duration
	clock Clock
	log   *slog.Logger

	ack      atomic.Pointer[leaseAck] // the last acknowledged renewal
	lost     chan struct{}
	lostOnce sync.Once

	failures int // consecutive failed renewals; the renewal goroutine's

	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
}

// leaseAck is an acknowledged Grant or renewal: when it was sent, and the
// TTL etcd reported for it.
type leaseAck struct {
	sent time.Time
	ttl  time.Duration
}

// NewLease grants a lease of ttl (rounded up to whole seconds, as etcd
// counts them; etcd may raise it to its minimum TTL, and TTL reports what
// etcd granted) and starts its renewal goroutine. clock nil is RealClock.
func NewLease(ctx context.Context, cli *clientv3.Client, ttl time.Duration, clock Clock) (*Lease, error) {
	if ttl <= 0 {
		return nil, fmt.Errorf("shard lease: ttl %v: must be positive", ttl)
	}
	if clock == nil {
		clock = RealClock()
	}
	sent := clock.Now()
	resp, err := cli.Grant(ctx, int64((ttl+time.Second-1)/time.Second))
	if err != nil {
		return nil, fmt.Errorf("shard lease: grant: %w", err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	l := &Lease{cli: cli, id: resp.ID, ttl: time.Duration(resp.TTL) * time.Second, clock: clock,
		log:  slog.Default().With("lease", fmt.Sprintf("%x", int64(resp.ID))),
		lost: make(chan struct{}), cancel: cancel, done: make(chan struct{})}
	l.ack.Store(&leaseAck{sent: sent, ttl: l.ttl})
	go l.renew(rctx)
	return l, nil
}

// ID is the etcd lease ID.
func (l *Lease) ID() clientv3.LeaseID { return l.id }

// TTL is the lease's TTL as etcd granted it.
func (l *Lease) TTL() time.Duration { return l.ttl }

// Deadline is until when this member may still answer from memory, on its
// Clock: t_sent of the last acknowledged renewal (or of the Grant) + TTL -
// Margin(TTL). It stays where it is once the lease is lost; Valid is then
// false.
func (l *Lease) Deadline() time.Time {
	a := l.ack.Load()
	return a.sent.Add(a.ttl - Margin(l.ttl))
}

// Valid tells whether the Clock is before Deadline and the lease is not
// known to be lost.
func (l *Lease) Valid() bool {
	select {
	case <-l.lost:
		return false
	default:
		return l.clock.Now().Before(l.Deadline())
	}
}

// Lost is closed when etcd says the lease is gone (a renewal answered
// ErrLeaseNotFound or TTL <= 0), or by Close.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Close stops renewing (waiting for the renewal goroutine), marks the
// lease lost, then revokes it, best effort: within ctx and at most TTL,
// since without renewals etcd expires it by then anyway. Idempotent.
func (l *Lease) Close(ctx context.Context) {
	l.closeOnce.Do(func() {
		l.cancel()
		<-l.done
		l.markLost()
		ctx, cancel := context.WithTimeout(ctx, l.ttl)
		defer cancel()
		if _, err := l.cli.Revoke(ctx, l.id); err != nil && !leaseGone(err) {
			l.log.Debug("shard lease: revoke failed; it will expire", "err", err)
		}
	})
}

// renew is the renewal goroutine: one renewal at a time, at the interval
// nextRenewal gives, until Close or until etcd says the lease is gone.
func (l *Lease) renew(ctx context.Context) {
	defer close(l.done)
	timer := time.NewTimer(l.ttl / 3)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		if gone := l.renewOnce(ctx); gone {
			l.markLost()
			return
		}
		timer.Reset(l.nextRenewal())
	}
}

// renewOnce sends one renewal and moves the deadline if etcd acknowledged
// it; it reports whether etcd said the lease is gone. An attempt is bounded
// by TTL/3, since KeepAliveOnce retries an unreachable etcd until its
// context ends.
func (l *Lease) renewOnce(ctx context.Context) (gone bool) {
	actx, cancel := context.WithTimeout(ctx, l.ttl/3)
	defer cancel()
	sent := l.clock.Now()
	resp, err := l.cli.KeepAliveOnce(actx, l.id)
	switch {
	case err == nil:
		l.ack.Store(&leaseAck{sent: sent, ttl: min(time.Duration(resp.TTL)*time.Second, l.ttl)})
		if l.failures > 0 {
			l.log.Info("shard lease: renewed again", "failed", l.failures)
		}
		l.failures = 0
		return false
	case leaseGone(err):
		l.log.Warn("shard lease: etcd says the lease is gone")
		return true
	case ctx.Err() == nil:
		l.failures++
		l.logFailure(err)
	}
	return false
}

// logFailure logs the first failed renewal of a run as a warning and the
// others, every TTL/10, at debug level.
func (l *Lease) logFailure(err error) {
	level := slog.LevelDebug
	if l.failures == 1 {
		level = slog.LevelWarn
	}
	l.log.Log(context.Background(), level, "shard lease: renewal failed; the deadline does not move",
		"err", err, "failed", l.failures, "valid", l.Valid())
}

// nextRenewal is the wait before the next renewal: until TTL/3 after the
// last acknowledged one's t_sent; once that has passed (renewals failed),
// TTL/10.
func (l *Lease) nextRenewal() time.Duration {
	if wait := l.ttl/3 - l.clock.Since(l.ack.Load().sent); wait > 0 {
		return wait
	}
	return l.ttl / 10
}

func (l *Lease) markLost() { l.lostOnce.Do(func() { close(l.lost) }) }

// leaseGone tells whether err is etcd saying the lease does not exist.
func leaseGone(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrGRPCLeaseNotFound)
}
