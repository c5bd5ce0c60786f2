package locktable

import (
	"slices"
	"time"
)

// Committed takes the result of a unit's commit at rev: the grants it put
// become visible with token rev and are answered; the grants it deleted
// disappear and their releases are answered; the locks involved admit
// their next holders.
func (t *Table) Committed(now time.Time, unit uint64, rev int64) {
	u := t.inflight[unit]
	if u == nil || t.dead {
		return
	}
	delete(t.inflight, unit)
	for _, g := range u.ends {
		t.forgetGrant(g)
		// Hook for the owner's grant watchers: the delete committed.
		t.ended = append(t.ended, Ended{Name: g.rec.Name, Token: g.token, Expired: g.endExpired && !g.endForced, Forced: g.endForced})
		for _, c := range g.endCalls {
			t.reply(Reply{Call: c, Outcome: Released, Released: true})
		}
	}
	for _, g := range u.puts {
		t.commitGrant(now, g, rev)
	}
	for _, lk := range touched(t, u) {
		t.admit(now, lk)
	}
}

// commitGrant makes a pending grant live with its token and answers its
// callers; a grant nobody waits for any more (its caller cancelled, and no
// request id can find it) is ended at once.
func (t *Table) commitGrant(now time.Time, g *grant, rev int64) {
	g.state, g.token = live, rev
	g.expires = now.Add(time.Duration(g.rec.TTLms) * time.Millisecond)
	t.timers.push(g.expires, g, nil, nil)
	for i, c := range g.calls {
		delete(t.calls, c)
		gr := t.grantOf(g, "", nil)
		gr.Resumed = i > 0 || g.retried // a retry of its request id joined it
		t.reply(Reply{Call: c, Outcome: Granted, Grant: gr})
	}
	answered := len(g.calls) > 0
	g.calls, g.secret = nil, nil
	if !answered && g.rec.RequestID == "" {
		t.end(now, g, false)
	}
}

// forgetGrant removes an ended grant from its lock and the indexes.
func (t *Table) forgetGrant(g *grant) {
	delete(t.grants, g.rec.ID)
	if g.rec.RequestID != "" && t.requests[g.rec.RequestID] == g {
		delete(t.requests, g.rec.RequestID)
	}
	if lk := t.locks[g.rec.Name]; lk != nil {
		lk.holders = slices.DeleteFunc(lk.holders, func(x *grant) bool { return x == g })
	}
}

// touched are the locks a unit changed, each once.
func touched(t *Table, u *unitState) []*lock {
	var out []*lock
	for _, gs := range [][]*grant{u.ends, u.puts} {
		for _, g := range gs {
			if lk := t.locks[g.rec.Name]; lk != nil && !slices.Contains(out, lk) {
				out = append(out, lk)
			}
		}
	}
	return out
}
