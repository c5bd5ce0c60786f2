package locktable

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
)

// End markers: how a grant ended, for the watchers of etcd's history.
//
// A grant's end is its key's delete whatever ended it, so etcd's history
// alone cannot tell a release from an expiry or a force release. A unit
// that ends grants by release or force release therefore also puts, per
// lock name, one end marker, Config.EndedPrefix + Escape(name), whose
// value lists each such grant's token with its cause: "released:12", or
// "released:12,forced:14" for two holders of a semaphore. The marker
// commits in the revision of the deletes (the unit's), so a watcher that
// sees a grant's delete at revision R reads the marker at R (MarkedEnd):
// a token it lists ended as listed, any other expired (expiries write no
// marker). One op per name, so a unit never holds two ops on one key
// (doc.go); two units that put one marker are two Txns (the committer
// never puts one key twice in a Txn).
//
// The marker is Ephemeral: the owner puts it on its member's lease, so
// markers do not pile up beyond the member's life; watchers read them at
// a revision, from etcd's history, which the lease's end does not erase.

// EndCause is how a grant ended, as its end marker tells.
type EndCause int

// End causes.
const (
	// EndExpired: its TTL or max hold ran out (no marker lists it).
	EndExpired EndCause = iota + 1
	// EndReleased: released with its handle, or by the table when nobody
	// was left to answer (Ended with no flag).
	EndReleased
	// EndForced: an administrator's ForceRelease.
	EndForced
)

func (c EndCause) String() string {
	switch c {
	case EndExpired:
		return "expired"
	case EndReleased:
		return "released"
	case EndForced:
		return "forced"
	}
	return "unknown"
}

// The causes as a marker writes them.
const (
	markReleased = "released"
	markForced   = "forced"
)

// markEnds adds to the unit being built one end marker per lock whose
// grants it releases or force-releases.
func (t *Table) markEnds() {
	if t.cfg.EndedPrefix == "" {
		return
	}
	var marked []*grant
	for _, g := range t.open.ends {
		if !g.endExpired || g.endForced {
			marked = append(marked, g)
		}
	}
	slices.SortFunc(marked, func(a, b *grant) int {
		return cmp.Or(strings.Compare(a.rec.Name, b.rec.Name), cmp.Compare(a.token, b.token))
	})
	for len(marked) > 0 {
		name := marked[0].rec.Name
		n := 1
		for n < len(marked) && marked[n].rec.Name == name {
			n++
		}
		t.openOps = append(t.openOps, Op{Key: t.cfg.EndedPrefix + t.cfg.Escape(name), Value: endMarker(marked[:n]),
			Name: name, Ephemeral: true})
		marked = marked[n:]
	}
}

// endMarker is the marker value of one lock's released and forced grants.
func endMarker(gs []*grant) string {
	var b strings.Builder
	for i, g := range gs {
		if i > 0 {
			b.WriteByte(',')
		}
		if g.endForced {
			b.WriteString(markForced)
		} else {
			b.WriteString(markReleased)
		}
		b.WriteByte(':')
		b.WriteString(strconv.FormatInt(g.token, 10))
	}
	return b.String()
}

// MarkedEnd is how the grant with token ended, from its lock's end marker
// as written in the revision of the grant's delete: marker is that value,
// or "" if the marker was not written in that revision (or there is
// none). A token the marker lists ended as listed; any other expired.
func MarkedEnd(marker string, token int64) EndCause {
	tok := strconv.FormatInt(token, 10)
	for entry := range strings.SplitSeq(marker, ",") {
		how, t, _ := strings.Cut(entry, ":")
		if t != tok {
			continue
		}
		switch how {
		case markReleased:
			return EndReleased
		case markForced:
			return EndForced
		}
	}
	return EndExpired
}
