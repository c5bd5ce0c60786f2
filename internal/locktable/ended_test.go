package locktable

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// endedTable is a table with end markers, driven by hand: grants are
// committed at once, and a step's unit is taken without committing it.
type endedTable struct {
	t    *testing.T
	tab  *Table
	now  time.Time
	rev  int64
	call CallID
}

func newEndedTable(t *testing.T, endedPrefix string) *endedTable {
	esc := func(s string) string { return strings.ReplaceAll(s, "/", "%2F") }
	return &endedTable{t: t, now: time.Unix(1_700_000_000, 0), rev: 100,
		tab: New(Config{Prefix: "/d/", EndedPrefix: endedPrefix, Escape: esc, Term: 1, Incarnation: 1})}
}

// grant acquires name (a semaphore of limit) and commits it.
func (e *endedTable) grant(name string, ttl time.Duration, limit int32) *Grant {
	e.t.Helper()
	e.call++
	call := e.call
	e.tab.Acquire(e.now, Acquire{Call: call, Name: name, Caller: "alice", TTL: ttl, Limit: limit})
	for _, u := range e.tab.Ready().Units {
		e.commit(u)
	}
	for _, r := range e.tab.Ready().Replies {
		if r.Call == call && r.Outcome == Granted {
			return r.Grant
		}
	}
	e.t.Fatalf("acquire %s not granted", name)
	return nil
}

func (e *endedTable) commit(u Unit) {
	e.rev++
	e.tab.Committed(e.now, u.ID, e.rev)
}

func (e *endedTable) release(g *Grant) {
	e.call++
	e.tab.Release(e.now, e.call, g.Name, g.Token, g.Handle, "alice")
}

func (e *endedTable) force(g *Grant) {
	e.call++
	e.tab.ForceRelease(e.now, e.call, g.Name, g.Token)
}

// unit is the one unit the steps since the last Ready made; it checks
// that no two of its ops share a key.
func (e *endedTable) unit() Unit {
	e.t.Helper()
	units := e.tab.Ready().Units
	if len(units) != 1 {
		e.t.Fatalf("%d units, want 1: %+v", len(units), units)
	}
	keys := map[string]bool{}
	for _, op := range units[0].Ops {
		if keys[op.Key] {
			e.t.Fatalf("two ops on %s in one unit: %+v", op.Key, units[0].Ops)
		}
		keys[op.Key] = true
	}
	return units[0]
}

// markers are a unit's end markers, by key.
func markers(t *testing.T, u Unit) map[string]Op {
	t.Helper()
	out := map[string]Op{}
	for _, op := range u.Ops {
		if op.Ephemeral {
			if op.Delete {
				t.Fatalf("an ephemeral delete: %+v", op)
			}
			out[op.Key] = op
		}
	}
	return out
}

// wantMarkers checks that a unit's end markers are exactly want (key to
// value), each one op naming its lock.
func wantMarkers(t *testing.T, u Unit, want map[string]string) {
	t.Helper()
	got := markers(t, u)
	if len(got) != len(want) {
		t.Fatalf("end markers %+v, want %v", got, want)
	}
	for k, v := range want {
		if op, ok := got[k]; !ok || op.Value != v || !strings.HasSuffix(k, "/"+strings.ReplaceAll(op.Name, "/", "%2F")) {
			t.Fatalf("end marker %s = %+v, want %q", k, op, v)
		}
	}
}

// A release, a force release, an expiry and a hand-off each put the marker
// their watchers read: one op per lock, never on a key the unit also
// writes.
func TestEndMarkersPerCause(t *testing.T) {
	t.Run("release", func(t *testing.T) {
		e := newEndedTable(t, "/e/")
		g := e.grant("a/b", 30*time.Second, 0)
		e.release(g)
		u := e.unit()
		wantMarkers(t, u, map[string]string{"/e/a%2Fb": "released:" + itoa(g.Token)})
		if len(u.Ops) != 2 {
			t.Fatalf("ops %+v, want the delete and the marker", u.Ops)
		}
	})
	t.Run("force release", func(t *testing.T) {
		e := newEndedTable(t, "/e/")
		g := e.grant("a", 30*time.Second, 0)
		e.force(g)
		wantMarkers(t, e.unit(), map[string]string{"/e/a": "forced:" + itoa(g.Token)})
	})
	t.Run("expiry writes none", func(t *testing.T) {
		e := newEndedTable(t, "/e/")
		e.grant("a", time.Second, 0)
		e.now = e.now.Add(2 * time.Second)
		e.tab.Tick(e.now)
		u := e.unit()
		wantMarkers(t, u, nil)
		if len(u.Ops) != 1 || !u.Ops[0].Delete {
			t.Fatalf("ops %+v, want the delete alone", u.Ops)
		}
	})
	t.Run("hand-off", func(t *testing.T) {
		e := newEndedTable(t, "/e/")
		g := e.grant("a", 30*time.Second, 0)
		e.call++
		e.tab.Acquire(e.now, Acquire{Call: e.call, Name: "a", Caller: "bob", TTL: time.Second, Wait: time.Minute})
		e.tab.Ready() // queued: nothing to write
		e.release(g)
		u := e.unit()
		wantMarkers(t, u, map[string]string{"/e/a": "released:" + itoa(g.Token)})
		if len(u.Ops) != 3 {
			t.Fatalf("ops %+v, want the delete, the next grant's put and the marker", u.Ops)
		}
	})
	t.Run("no prefix, no markers", func(t *testing.T) {
		e := newEndedTable(t, "")
		g := e.grant("a", 30*time.Second, 0)
		e.release(g)
		wantMarkers(t, e.unit(), nil)
	})
}

// Three holders of a semaphore ending in one unit (a release, a force
// release, an expiry) and a mutex released with them: one marker per
// lock, listing the release and the force release by token, and each
// token read back as it ended.
func TestEndMarkersOnePerLockInAUnit(t *testing.T) {
	e := newEndedTable(t, "/e/")
	var sem []*Grant
	for _, ttl := range []time.Duration{30 * time.Second, 30 * time.Second, time.Second} {
		sem = append(sem, e.grant("pool", ttl, 3))
	}
	m := e.grant("mutex", 30*time.Second, 0)
	e.force(sem[1])
	e.release(m)
	e.release(sem[0])
	e.now = e.now.Add(2 * time.Second)
	e.tab.Tick(e.now) // sem[2] expires
	u := e.unit()
	pool := "released:" + itoa(sem[0].Token) + ",forced:" + itoa(sem[1].Token)
	wantMarkers(t, u, map[string]string{"/e/pool": pool, "/e/mutex": "released:" + itoa(m.Token)})
	var deletes int
	for _, op := range u.Ops {
		if op.Delete {
			deletes++
		}
	}
	if deletes != 4 || len(u.Ops) != 6 {
		t.Fatalf("ops %+v, want 4 deletes and 2 markers", u.Ops)
	}
	for g, want := range map[*Grant]EndCause{sem[0]: EndReleased, sem[1]: EndForced, sem[2]: EndExpired} {
		if got := MarkedEnd(pool, g.Token); got != want {
			t.Errorf("token %d: %v, want %v", g.Token, got, want)
		}
	}
	// The commit reports the same causes as Ended.
	e.commit(u)
	causes := map[int64]EndCause{}
	for _, end := range e.tab.Ready().Ended {
		c := EndReleased
		switch {
		case end.Forced:
			c = EndForced
		case end.Expired:
			c = EndExpired
		}
		causes[end.Token] = c
	}
	for _, g := range append(slices.Clone(sem), m) {
		marker := pool
		if g.Name == "mutex" {
			marker = "released:" + itoa(m.Token)
		}
		if got := MarkedEnd(marker, g.Token); got != causes[g.Token] {
			t.Errorf("token %d: the marker says %v, Ended %v", g.Token, got, causes[g.Token])
		}
	}
}

// MarkedEnd matches whole tokens only; no marker, or another grant's, is
// an expiry.
func TestMarkedEnd(t *testing.T) {
	for _, tc := range []struct {
		marker string
		token  int64
		want   EndCause
	}{
		{"released:12", 12, EndReleased},
		{"forced:12", 12, EndForced},
		{"released:12,forced:14", 14, EndForced},
		{"released:12,forced:14", 13, EndExpired},
		{"released:12", 1, EndExpired},
		{"released:12", 123, EndExpired},
		{"released:112", 12, EndExpired},
		{"", 12, EndExpired},
		{"garbage", 12, EndExpired},
		{"renamed:12", 12, EndExpired},
	} {
		if got := MarkedEnd(tc.marker, tc.token); got != tc.want {
			t.Errorf("MarkedEnd(%q, %d) = %v, want %v", tc.marker, tc.token, got, tc.want)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
