package fence

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
)

func acquire(t *testing.T, m *lease.Manager, name string) *lease.Grant {
	t.Helper()
	g, err := m.Acquire(context.Background(), name, lease.WithTTL(30*time.Second))
	if err != nil {
		t.Fatalf("acquire %q: %v", name, err)
	}
	return g
}

func release(t *testing.T, m *lease.Manager, g *lease.Grant) {
	t.Helper()
	if ok, err := m.Release(context.Background(), g.Name, g.Token, g.Handle); !ok || err != nil {
		t.Fatalf("release %q: %v, %v", g.Name, ok, err)
	}
}

// count is the identity's mark counter as stored.
func count(t *testing.T, v *Validator, id string) int64 {
	t.Helper()
	c, err := v.readCount(context.Background(), identityHash(id))
	if err != nil {
		t.Fatal(err)
	}
	return c.n
}

func expectValid(t *testing.T, v *Validator, g *lease.Grant, resource string, opts ...ValidateOption) {
	t.Helper()
	verdict, err := v.Validate(context.Background(), g.Name, g.Token, resource, opts...)
	if err != nil || !verdict.Valid {
		t.Fatalf("validate %q %d at %q = %+v, %v; want valid", g.Name, g.Token, resource, verdict, err)
	}
}

// The cap counts per identity, refuses the creation beyond it (writing
// nothing), never refuses validations against marks that exist, and a
// deleted mark frees its place.
func TestMarkCapPerIdentity(t *testing.T) {
	m, v := setup(t, WithMarkLimit(2))
	ctx := context.Background()
	a := acquire(t, m, "l")
	asA, asB := AsIdentity("a"), AsIdentity("b")
	expectValid(t, v, a, "r1", asA)
	expectValid(t, v, a, "r2", asA)
	_, err := v.Validate(ctx, "l", a.Token, "r3", asA)
	var tm *TooManyMarksError
	if !errors.As(err, &tm) || tm.Limit != 2 || tm.Count != 2 {
		t.Fatalf("a third mark by a: %v, want *TooManyMarksError 2/2", err)
	}
	if _, err := v.GetMark(ctx, MarkID{Resource: "r3"}); !errors.Is(err, ErrNoMark) {
		t.Fatalf("a refused creation wrote a mark: %v", err)
	}
	// Existing marks are not creations: a (and anyone) still validates them.
	expectValid(t, v, a, "r1", asA)
	expectValid(t, v, a, "r2", asB)
	// Another identity has its own cap.
	expectValid(t, v, a, "r3", asB)
	if ca, cb := count(t, v, "a"), count(t, v, "b"); ca != 2 || cb != 1 {
		t.Fatalf("counts a=%d b=%d, want 2 and 1", ca, cb)
	}
	// Advancing a mark keeps its creator: deleting it frees the creator's
	// place, not the advancer's.
	release(t, m, a)
	a2 := acquire(t, m, "l")
	expectValid(t, v, a2, "r1", asB)
	if _, err := v.DeleteMark(ctx, MarkID{Resource: "r1"}); err != nil {
		t.Fatal(err)
	}
	if ca, cb := count(t, v, "a"), count(t, v, "b"); ca != 1 || cb != 1 {
		t.Fatalf("counts after deleting r1: a=%d b=%d, want 1 and 1", ca, cb)
	}
	expectValid(t, v, a2, "r4", asA)
	if _, err := v.DeleteMark(ctx, MarkID{Resource: "r1"}); !errors.Is(err, ErrNoMark) {
		t.Fatalf("deleting a deleted mark: %v, want ErrNoMark", err)
	}
}

// Retention deletes a mark only after its lock's queue was seen empty at
// two sweeps a retention apart with nothing in between, and the deletion
// lets no stale token through: the lock check alone refuses it.
func TestMarkRetention(t *testing.T) {
	m, v := setup(t)
	ctx := context.Background()
	const retention = time.Hour
	t0 := time.Now()
	sweep := func(at time.Duration, want Sweep) {
		t.Helper()
		got, err := v.SweepMarks(ctx, t0.Add(at), retention)
		if err != nil || got != want {
			t.Fatalf("sweep at +%v = %+v, %v; want %+v", at, got, err, want)
		}
	}
	a := acquire(t, m, "l")
	expectValid(t, v, a, "r")
	// Held: never idle, however old the mark.
	sweep(0, Sweep{Marks: 1})
	sweep(10*retention, Sweep{Marks: 1})

	release(t, m, a)
	sweep(0, Sweep{Marks: 1, Idle: 1})
	sweep(retention-time.Second, Sweep{Marks: 1})
	// A holder (or waiter) seen in between starts the idle period again,
	// even one that never validated against the resource.
	b := acquire(t, m, "l")
	sweep(retention, Sweep{Marks: 1, Revived: 1})
	release(t, m, b)
	sweep(retention, Sweep{Marks: 1, Idle: 1})
	sweep(2*retention-time.Second, Sweep{Marks: 1})
	// An advance starts it again too.
	c := acquire(t, m, "l")
	expectValid(t, v, c, "r")
	release(t, m, c)
	sweep(2*retention, Sweep{Marks: 1, Idle: 1})
	if mk, err := v.GetMark(ctx, MarkID{Resource: "r"}); err != nil || mk.Token != c.Token {
		t.Fatalf("mark before deletion: %+v, %v; want token %d", mk, err, c.Token)
	}
	sweep(3*retention, Sweep{Marks: 1, Deleted: 1})
	if _, err := v.GetMark(ctx, MarkID{Resource: "r"}); !errors.Is(err, ErrNoMark) {
		t.Fatalf("mark after retention: %v, want ErrNoMark", err)
	}
	if n := count(t, v, ""); n != 0 {
		t.Fatalf("count after retention = %d, want 0", n)
	}
	// The proof, checked: every token the mark refused (and the mark's own)
	// is refused by the lock check alone, on the resource and off it, and a
	// refused token creates no mark.
	for _, g := range []*lease.Grant{a, b, c} {
		for _, res := range []string{"r", ""} {
			verdict, err := v.Validate(ctx, "l", g.Token, res)
			if err != nil || verdict.Valid {
				t.Fatalf("token %d at %q after the mark's deletion: %+v, %v; want refused", g.Token, res, verdict, err)
			}
		}
	}
	d := acquire(t, m, "l")
	for _, g := range []*lease.Grant{a, b, c} {
		if verdict, err := v.Validate(ctx, "l", g.Token, "r"); err != nil || verdict.Reason != Superseded {
			t.Fatalf("token %d with a newer holder: %+v, %v; want superseded", g.Token, verdict, err)
		}
	}
	if _, err := v.GetMark(ctx, MarkID{Resource: "r"}); !errors.Is(err, ErrNoMark) {
		t.Fatalf("refused tokens created a mark: %v", err)
	}
	// The next current token starts a new mark.
	expectValid(t, v, d, "r")
	if mk, err := v.GetMark(ctx, MarkID{Resource: "r"}); err != nil || mk.Token != d.Token || mk.Lock != "l" {
		t.Fatalf("new mark: %+v, %v", mk, err)
	}
}

// The deletion's transaction asserts the queue is still empty: a holder
// that arrives between the sweep's read and its transaction keeps the mark.
func TestMarkRetentionRacesANewHolder(t *testing.T) {
	m, v := setup(t)
	ctx := context.Background()
	a := acquire(t, m, "l")
	expectValid(t, v, a, "r")
	release(t, m, a)
	t0 := time.Now()
	if s, err := v.SweepMarks(ctx, t0, time.Hour); err != nil || s.Idle != 1 {
		t.Fatalf("first sweep: %+v, %v", s, err)
	}
	var b *lease.Grant
	testHookBeforeRetain = func() {
		testHookBeforeRetain = nil // once
		b = acquire(t, m, "l")
	}
	defer func() { testHookBeforeRetain = nil }()
	if s, err := v.SweepMarks(ctx, t0.Add(2*time.Hour), time.Hour); err != nil || s.Deleted != 0 {
		t.Fatalf("sweep racing a new holder: %+v, %v; want nothing deleted", s, err)
	}
	if mk, err := v.GetMark(ctx, MarkID{Resource: "r"}); err != nil || mk.Token != a.Token {
		t.Fatalf("mark after the race: %+v, %v", mk, err)
	}
	expectValid(t, v, b, "r")
}

// TestMarkIDKeysRoundTrip: every mark's key names it back, a resource's own
// mark apart from the marks of its semaphore slots, whatever the resource
// holds ('/', '%', digits).
func TestMarkIDKeysRoundTrip(t *testing.T) {
	ks := keyspace.New("/p/")
	for _, id := range []MarkID{
		{Resource: "db"},
		{Resource: "db", PerSlot: true},
		{Resource: "db", PerSlot: true, Slot: 7},
		{Resource: "db/0"},
		{Resource: "db/0", PerSlot: true, Slot: 1},
		{Resource: "a%2Fb/%", PerSlot: true, Slot: 2147483647},
	} {
		t.Run(fmt.Sprintf("%+v", id), func(t *testing.T) {
			key := id.key(ks)
			if got := markIDOf(ks, []byte(key)); got != id {
				t.Fatalf("key %q names %+v, want %+v", key, got, id)
			}
		})
	}
	if (MarkID{Resource: "db"}).key(ks) == (MarkID{Resource: "db", PerSlot: true}).key(ks) {
		t.Fatal("a resource's own mark and its slot 0's share a key")
	}
}
