package shard

// Tests of the member's lease against a real embedded etcd: the deadline
// moves with renewals, stops when they stop, comes before etcd's expiry
// (also with a clock 5% fast or slow), and Lost tells of a revoked lease.

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/embedetcd"
)

// leaseEtcd is a fresh embedded etcd (minimum lease TTL 1s).
func leaseEtcd(t *testing.T) *embedetcd.Server {
	t.Helper()
	e, err := embedetcd.Start(context.Background(), t.TempDir(), embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// leaseClient is a client of e, closed at the end of the test (a test may
// close it earlier to cut a member off).
func leaseClient(t *testing.T, e *embedetcd.Server) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// leaseNew grants a lease closed (revoked) at the end of the test.
func leaseNew(t *testing.T, cli *clientv3.Client, ttl time.Duration, clock Clock) *Lease {
	t.Helper()
	l, err := NewLease(context.Background(), cli, ttl, clock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l.Close(ctx)
	})
	return l
}

// leaseWait polls cond every few milliseconds until it holds, or fails
// the test after timeout.
func leaseWait(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// leaseExists tells whether etcd still has lease id.
func leaseExists(t *testing.T, cli *clientv3.Client, id clientv3.LeaseID) bool {
	t.Helper()
	resp, err := cli.TimeToLive(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return resp.TTL != -1
}

func TestLeaseMarginCoversRateSkew(t *testing.T) {
	for _, ttl := range []time.Duration{100 * time.Millisecond, time.Second, 2 * time.Second, 10 * time.Second, time.Minute} {
		m := Margin(ttl)
		if m < ttl/10 || m < 100*time.Millisecond {
			t.Errorf("Margin(%v) = %v: want at least ttl/10 and 100ms", ttl, m)
		}
		// A member clock 5% slow and a leader clock 5% fast: the member's
		// ttl-m must end (in real time) before the leader's ttl does.
		if ttl >= time.Second && float64(ttl-m)/0.95 > float64(ttl)/1.05 {
			t.Errorf("Margin(%v) = %v does not cover 5%% skew on both sides", ttl, m)
		}
	}
}

func TestLeaseDeadlineAdvancesWithRenewals(t *testing.T) {
	e := leaseEtcd(t)
	cli := leaseClient(t, e)
	before := time.Now()
	l := leaseNew(t, cli, time.Second, nil)
	if l.TTL() != time.Second {
		t.Fatalf("TTL = %v, want 1s", l.TTL())
	}
	d0 := l.Deadline()
	if d0.Before(before.Add(time.Second-Margin(time.Second))) || d0.After(time.Now().Add(time.Second)) {
		t.Fatalf("first deadline %v after grant: want grant's t_sent + ttl - margin", d0.Sub(before))
	}
	if !l.Valid() {
		t.Fatal("a fresh lease is not Valid")
	}
	leaseWait(t, 3*time.Second, "a renewal to move the deadline", func() bool { return l.Deadline().After(d0) })
	// Renewals keep it valid past the first deadline.
	time.Sleep(time.Until(d0) + 200*time.Millisecond)
	if !l.Valid() {
		t.Fatalf("lease not Valid %v after its first deadline, renewals running", 200*time.Millisecond)
	}
	if !leaseExists(t, cli, l.ID()) {
		t.Fatal("etcd lost a renewed lease")
	}
}

// Renewals stop (the member's client is closed, etcd is fine): the lease
// becomes invalid at its deadline, while etcd still holds it.
func TestLeaseInvalidWhenRenewalsStop(t *testing.T) {
	e := leaseEtcd(t)
	observer := leaseClient(t, e)
	member := leaseClient(t, e)
	l := leaseNew(t, member, time.Second, nil)
	d0 := l.Deadline()
	leaseWait(t, 3*time.Second, "a first renewal", func() bool { return l.Deadline().After(d0) })
	_ = member.Close()
	leaseWait(t, 3*time.Second, "the lease to become invalid", func() bool { return !l.Valid() })
	d := l.Deadline()
	if now := time.Now(); now.Before(d) {
		t.Fatalf("invalid %v before its deadline", d.Sub(now))
	}
	if !leaseExists(t, observer, l.ID()) {
		t.Fatal("etcd dropped the lease before the member's deadline passed")
	}
	time.Sleep(300 * time.Millisecond) // three retries' worth
	if !l.Deadline().Equal(d) {
		t.Fatalf("deadline moved without renewals: %v -> %v", d, l.Deadline())
	}
	select {
	case <-l.Lost():
		t.Fatal("Lost closed although etcd never said the lease is gone")
	default:
	}
}

func TestLeaseLostWhenRevoked(t *testing.T) {
	e := leaseEtcd(t)
	cli := leaseClient(t, e)
	l := leaseNew(t, cli, time.Second, nil)
	if _, err := cli.Revoke(context.Background(), l.ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost not closed after the lease was revoked")
	}
	if l.Valid() {
		t.Fatal("a lost lease is Valid")
	}
}

func TestLeaseCloseRevokesAndIsIdempotent(t *testing.T) {
	e := leaseEtcd(t)
	cli := leaseClient(t, e)
	l := leaseNew(t, cli, 2*time.Second, nil)
	ctx := context.Background()
	l.Close(ctx)
	l.Close(ctx)
	select {
	case <-l.Lost():
	default:
		t.Fatal("Lost not closed by Close")
	}
	if l.Valid() || leaseExists(t, cli, l.ID()) {
		t.Fatal("a closed lease is still valid or still in etcd")
	}
}

// The deadline passes (in real time) before etcd expires the lease, with
// the member's clock 5% fast or 5% slow; a clock 15% slow, beyond what
// Margin covers, would pass etcd's earliest expiry (the check has teeth).
// The real instant of the skewed deadline is computed from the clock's
// rate, so a slow poll cannot blur it; the poll of Valid and of etcd's
// TimeToLive then confirms the order.
func TestLeaseSkewedClockStopsBeforeExpiry(t *testing.T) {
	for _, tc := range []struct {
		name string
		rate float64
		safe bool
	}{{"fast5pct", 1.05, true}, {"slow5pct", 0.95, true}, {"slow15pct", 0.85, false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := leaseEtcd(t)
			observer := leaseClient(t, e)
			member := leaseClient(t, e)
			start := time.Now()
			l := leaseNew(t, member, time.Second, SkewedClock(tc.rate))
			_ = member.Close()             // no renewal: the Grant's t_sent is the last
			earliest := start.Add(l.TTL()) // etcd expires no earlier than t_received + TTL
			stop := leaseRealDeadline(l)
			if !tc.safe {
				if !stop.After(earliest) {
					t.Fatalf("a clock at rate %v stops %v before etcd's earliest expiry: the margin test has no teeth", tc.rate, earliest.Sub(stop))
				}
				return
			}
			t.Logf("rate %v: the deadline passes %v before etcd's earliest expiry", tc.rate, earliest.Sub(stop))
			if !stop.Before(earliest) {
				t.Fatalf("rate %v: the deadline passes %v after etcd's earliest expiry", tc.rate, stop.Sub(earliest))
			}
			leaseWait(t, 5*time.Second, "the skewed deadline", func() bool { return !l.Valid() })
			if now := time.Now(); now.Before(stop.Add(-time.Millisecond)) {
				t.Fatalf("rate %v: invalid %v before the deadline", tc.rate, stop.Sub(now))
			}
			if !leaseExists(t, observer, l.ID()) { // still there now, so also when the member stopped
				t.Fatalf("rate %v: etcd expired the lease before the member stopped", tc.rate)
			}
			leaseWait(t, 5*time.Second, "etcd to expire the lease", func() bool { return !leaseExists(t, observer, l.ID()) })
			t.Logf("rate %v: etcd had expired the lease %v after the member stopped", tc.rate, time.Since(stop))
		})
	}
}

// leaseRealDeadline is the real instant at which l's skewed clock reaches
// its deadline.
func leaseRealDeadline(l *Lease) time.Time {
	c := l.clock.(clockSkewed)
	return c.base.Add(time.Duration(float64(l.Deadline().Sub(c.base)) / c.rate))
}
