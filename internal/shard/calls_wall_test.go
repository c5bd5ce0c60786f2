package shard

import (
	"testing"
	"time"

	"github.com/coordinatord/coordinatord/internal/lease"
)

// An owner whose clock runs 5% fast answers its instants (a grant's and a
// renewal's expires_at, from which the server derives safe_until, and
// Describe's) on the wall clock: never past the real instant its own table
// ends the grant. Its clock has run for a minute, so its own instants are
// 3 s ahead of the wall clock: answered as they are, a holder would be
// promised 3 s it does not have (the chaos suite's CheckSafeUntil found
// this on a member with a 5% fast clock after ~10 s of run).
func TestOwnerAnswersInstantsOnTheWallClock(t *testing.T) {
	_, cli := ownerEtcd(t)
	rate := 1.05
	clock := clockSkewed{base: time.Now().Add(-time.Minute), rate: rate}
	o := startOwner(t, cli, WithClock(clock))
	ctx := ctxT(t)
	const ttl = 5 * time.Second
	// The real instant the table ends a grant renewed at real instant at.
	end := func(at time.Time) time.Time { return at.Add(time.Duration(float64(ttl) / rate)) }
	// safe_until (expires_at - the margin) is the promise: before the real
	// end; expires_at itself is the owner's TTL from the call, on the wall
	// clock.
	check := func(what string, before, after, expires time.Time) {
		t.Helper()
		if safe := expires.Add(-lease.SafetyMargin(ttl)); safe.After(end(after)) {
			t.Errorf("%s: safe_until %v after the real instant the owner ends the grant (its clock is %v ahead)",
				what, safe.Sub(end(after)).Round(time.Millisecond), time.Until(clock.Now()).Round(time.Millisecond))
		}
		if expires.After(after.Add(ttl)) {
			t.Errorf("%s: expires_at %v past the call's end + TTL", what, expires.Sub(after.Add(ttl)).Round(time.Millisecond))
		}
		if expires.Before(before.Add(ttl / 2)) {
			t.Errorf("%s: expires_at %v from the call, want about %v", what, expires.Sub(before).Round(time.Millisecond), ttl)
		}
	}

	before := time.Now()
	g, err := o.Acquire(ctx, acq("w", ttl, 0))
	if err != nil {
		t.Fatal(err)
	}
	check("grant", before, time.Now(), g.ExpiresAt)
	if g.AcquiredAt.After(time.Now()) {
		t.Errorf("grant: acquired_at %v in the future", time.Until(g.AcquiredAt).Round(time.Millisecond))
	}

	before = time.Now()
	r, err := o.KeepAlive(ctx, "w", g.Token, g.Handle, "alice")
	if err != nil {
		t.Fatal(err)
	}
	check("renewal", before, time.Now(), r.ExpiresAt)

	hs, _, err := o.Describe("w")
	if err != nil || len(hs) != 1 {
		t.Fatalf("describe = %v, %v", hs, err)
	}
	check("describe", before, time.Now(), hs[0].ExpiresAt) // before: the renewal's
	hl, _ := o.List("")
	if len(hl) != 1 {
		t.Fatalf("list = %+v, want one holder", hl)
	}
	check("list", before, time.Now(), hl[0].ExpiresAt)
}
