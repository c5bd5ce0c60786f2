package locktable

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// A grant's reservation is written into its record, read back by
// DecodeRecord, and seen by Reservations and ReservedBy in every state
// (pending, live, ending) and in the table of the next owner (Load).
func TestReservationRoundTrip(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	tab := New(Config{Prefix: "/d/", Term: 1, Incarnation: 1})
	tab.Acquire(now, Acquire{Call: 1, Name: "jobs/a", Caller: "alice", TTL: time.Minute, Reservation: "r1"})
	tab.Acquire(now, Acquire{Call: 2, Name: "jobs/b", Caller: "alice", TTL: time.Minute}) // none
	units := tab.Ready().Units
	if len(units) != 1 || len(units[0].Ops) != 2 {
		t.Fatalf("units %+v, want one with two puts", units)
	}
	var put Op
	for _, op := range units[0].Ops {
		if op.Name == "jobs/a" {
			put = op
		}
	}
	rec, err := DecodeRecord([]byte(put.Value))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Reservation != "r1" || rec.Caller != "alice" {
		t.Fatalf("record %+v, want reservation r1 of alice", rec)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(put.Value), &raw); err != nil || raw["rv"] != "r1" {
		t.Fatalf("record %s: want the reservation under \"rv\"", put.Value)
	}
	if got := reservations(tab); len(got) != 1 || got[0] != (Reserved{Name: "jobs/a", Caller: "alice", Reservation: "r1"}) {
		t.Fatalf("pending: %+v, want jobs/a's r1 without a token", got)
	}

	tab.Committed(now, units[0].ID, 42)
	var g *Grant
	for _, r := range tab.Ready().Replies {
		if r.Call == 1 {
			g = r.Grant
		}
	}
	live := Reserved{Name: "jobs/a", Caller: "alice", Reservation: "r1", Token: 42}
	if r, ok := tab.ReservedBy("jobs/a", "r1"); !ok || r != live {
		t.Fatalf("ReservedBy after the commit: %+v %v, want %+v", r, ok, live)
	}
	if _, ok := tab.ReservedBy("jobs/a", "r2"); ok {
		t.Fatal("ReservedBy found a reservation nobody holds")
	}
	if _, ok := tab.ReservedBy("jobs/b", ""); ok {
		t.Fatal("ReservedBy found the empty reservation")
	}

	tab.Release(now, 3, "jobs/a", g.Token, g.Handle, "alice")
	end := tab.Ready().Units
	if got := reservations(tab); len(got) != 1 || got[0] != live {
		t.Fatalf("ending: %+v, want %+v until its delete commits", got, live)
	}
	tab.Committed(now, end[0].ID, 43)
	if got := reservations(tab); len(got) != 0 {
		t.Fatalf("after the delete committed: %+v, want none", got)
	}

	// The next owner finds it in what it loads.
	next := New(Config{Prefix: "/d/", Term: 2, Incarnation: 1})
	next.Load(now, []Loaded{{Key: put.Key, Token: 42, Record: rec}})
	if got := reservations(next); len(got) != 1 || got[0] != live {
		t.Fatalf("loaded: %+v, want %+v", got, live)
	}
}

// A record without a reservation (written before the field existed, or by
// an unlimited caller) decodes with none.
func TestRecordWithoutReservation(t *testing.T) {
	rec, err := DecodeRecord([]byte(`{"n":"x","id":"1-1-1","ttl":1000,"at":1,"h":"ab"}`))
	if err != nil || rec.Reservation != "" {
		t.Fatalf("%+v %v, want no reservation", rec, err)
	}
	if v := (Record{Name: "x", ID: "1", TTLms: 1, Secret: "ab"}).encode(); strings.Contains(v, `"rv"`) {
		t.Fatalf("%s: an empty reservation is written", v)
	}
}

// A request id derives the same reservation on every try (one slot per
// request, whichever owner the retry reaches), another caller, name or id
// another one; without a request id it is the random bytes.
func TestReservationID(t *testing.T) {
	r1, r2 := [16]byte{1}, [16]byte{2}
	a := ReservationID("req", "alice", "jobs/a", r1)
	if b := ReservationID("req", "alice", "jobs/a", r2); a != b || len(a) != 32 {
		t.Fatalf("%q and %q: want one 32-digit id for one request", a, b)
	}
	for _, other := range []string{ReservationID("req", "bob", "jobs/a", r1), ReservationID("req", "alice", "jobs/b", r1),
		ReservationID("req2", "alice", "jobs/a", r1)} {
		if other == a {
			t.Fatalf("another caller, name or request id derived %q too", a)
		}
	}
	if x, y := ReservationID("", "alice", "jobs/a", r1), ReservationID("", "alice", "jobs/a", r2); x == y || len(x) != 32 {
		t.Fatalf("%q %q: want the random bytes", x, y)
	}
}

func reservations(tab *Table) []Reserved {
	var out []Reserved
	tab.Reservations(func(r Reserved) { out = append(out, r) })
	return out
}
