package locktable

import (
	"testing"
	"time"
)

// The census counts what Validate sees: a lock with a committed holder (a
// grant not committed yet is none, an ending one still is), one per lock
// however many holders, and the queued calls.
func TestCensusCountsVisibleHoldersAndWaiters(t *testing.T) {
	e := newEndedTable(t, "")
	census := func(what string, held, waiting int) {
		t.Helper()
		if h, w := e.tab.Census(); h != held || w != waiting {
			t.Fatalf("%s: census %d held, %d waiting; want %d, %d", what, h, w, held, waiting)
		}
	}
	census("empty", 0, 0)

	e.call++
	e.tab.Acquire(e.now, Acquire{Call: e.call, Name: "a", Caller: "alice", TTL: time.Minute})
	units := e.tab.Ready().Units
	census("a decided, not committed", 0, 0)
	for _, u := range units {
		e.commit(u)
	}
	e.tab.Ready()
	census("a committed", 1, 0)

	e.grant("sem", time.Minute, 2)
	e.grant("sem", time.Minute, 2)
	census("a semaphore's two holders", 2, 0)

	e.call++
	e.tab.Acquire(e.now, Acquire{Call: e.call, Name: "sem", Caller: "bob", TTL: time.Minute, Wait: time.Minute, Limit: 2})
	e.tab.Ready()
	census("a waiter on the full semaphore", 2, 1)
}

// EndsInFlight shows each grant whose delete a unit carries, with its
// acquisition time, from the Ready that hands the unit out until it
// commits; and only once per unit to a caller that passes the last unit
// back.
func TestEndsInFlightShowsEachDeleteOnce(t *testing.T) {
	e := newEndedTable(t, "")
	g := e.grant("a", time.Minute, 0)
	e.now = e.now.Add(time.Second)
	e.release(g)
	census := func(what string, held int) {
		t.Helper()
		if h, _ := e.tab.Census(); h != held {
			t.Fatalf("%s: %d held, want %d", what, h, held)
		}
	}
	census("a's end decided: still visible", 1)
	u := e.unit()
	var seen []Holder
	last := e.tab.EndsInFlight(0, func(h Holder) { seen = append(seen, h) })
	if len(seen) != 1 || seen[0].Name != "a" || seen[0].Token != g.Token || !seen[0].AcquiredAt.Equal(g.AcquiredAt) || last != u.ID {
		t.Fatalf("EndsInFlight(0) = %+v, last %d; want a's grant (token %d, acquired %v), last %d", seen, last, g.Token, g.AcquiredAt, u.ID)
	}
	seen = nil
	if again := e.tab.EndsInFlight(last, func(h Holder) { seen = append(seen, h) }); len(seen) != 0 || again != last {
		t.Fatalf("EndsInFlight(%d) = %+v, last %d; want nothing new", last, seen, again)
	}
	e.commit(u)
	if ended := e.tab.Ready().Ended; len(ended) != 1 || ended[0].Name != "a" || ended[0].Token != g.Token {
		t.Fatalf("Ended after the commit = %+v", ended)
	}
	census("a's end committed", 0)
	if e.tab.EndsInFlight(0, func(h Holder) { t.Fatalf("EndsInFlight after the commit: %+v", h) }) != last {
		t.Fatal("the last unit moved without a Ready")
	}
}
