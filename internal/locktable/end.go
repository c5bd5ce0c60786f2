package locktable

import (
	"slices"
	"time"
)

// Release ends the caller's grant: its delete joins the unit being built
// (with the grant to the next waiter, if the lock admits one) and the call
// is answered Released when that unit commits. A handle, token or identity
// that does not match a live grant ends nothing: Released false, at once.
func (t *Table) Release(now time.Time, call CallID, name string, token int64, handle, caller string) {
	if t.dead {
		t.reply(Reply{Call: call, Outcome: Unavailable})
		return
	}
	g := t.holderOf(now, name, token, handle, caller)
	if g == nil {
		t.reply(Reply{Call: call, Outcome: t.notHeld(now, name, token, handle, caller, Released)})
		return
	}
	g.endCalls = append(g.endCalls, call)
	t.end(now, g, false)
}

// KeepAlive renews the caller's grant for its TTL, in memory: a new owner
// honours every grant for a full TTL from its takeover, so a renewal needs
// no commit. A grant past its max hold is not renewed beyond it.
func (t *Table) KeepAlive(now time.Time, call CallID, name string, token int64, handle, caller string) {
	if t.dead {
		t.reply(Reply{Call: call, Outcome: Unavailable})
		return
	}
	g := t.holderOf(now, name, token, handle, caller)
	if g == nil {
		t.reply(Reply{Call: call, Outcome: t.notHeld(now, name, token, handle, caller, NotHeld)})
		return
	}
	ttl := time.Duration(g.rec.TTLms) * time.Millisecond
	next := now.Add(ttl)
	if !g.maxHoldUntil.IsZero() && !g.maxHoldUntil.After(now) {
		// Renewals end at the max hold; the grant is left to end with the
		// TTL of its last renewal (the API's max_hold).
		t.reply(Reply{Call: call, Outcome: MaxHoldReached})
		return
	}
	if next.After(g.expires) {
		g.expires = next
		t.timers.push(next, g, nil, nil)
	}
	t.reply(Reply{Call: call, Outcome: Renewed, Renewal: Renewal{TTL: ttl, ExpiresAt: g.expires}})
}

// holderOf is the live, unexpired grant of name with this token whose
// handle and identity match, or nil. (A grant past its expiry that no Tick
// has ended yet is no longer anybody's to renew or release.)
func (t *Table) holderOf(now time.Time, name string, token int64, handle, caller string) *grant {
	id, secret, ok := parseHandle(handle)
	if !ok {
		return nil
	}
	g := t.grants[id]
	if g == nil { // a session's handle names the session: the grant is found by its token
		g = sessionHolder(t.locks[name], token, id)
	}
	if g == nil || g.state != live || g.rec.Name != name || g.token != token || g.rec.Caller != caller || !g.expires.After(now) {
		return nil
	}
	if !sumMatches(secret, g.rec.Secret) {
		return nil
	}
	return g
}

// end decides the end of a live grant: it turns ending (still visible
// until its delete commits), its delete joins the unit being built, and the
// lock admits its next holder in the same unit. An expiry starts the
// grant's lock-delay.
func (t *Table) end(now time.Time, g *grant, expired bool) {
	g.state = ending
	g.endExpired = expired // for Ready.Ended
	u := t.unit()
	u.ends = append(u.ends, g)
	t.openOps = append(t.openOps, Op{Key: g.key, Delete: true, Name: g.rec.Name})
	lk := t.locks[g.rec.Name]
	if expired && g.lockDelay > 0 {
		until := now.Add(g.lockDelay)
		if lk.limit > 1 { // a semaphore's delay holds back the expired holder's slot only
			if lk.slotDelay == nil {
				lk.slotDelay = map[int32]time.Time{}
			}
			lk.slotDelay[g.rec.Slot] = until
		} else {
			lk.delayUntil = until
		}
		t.timers.push(until, nil, nil, lk)
	}
	t.admit(now, lk)
}

// Cancel withdraws a call whose caller went away. A waiter leaves the
// queue (nothing was written for it). A grant not yet committed stays
// decided; when it commits with no caller left to answer it is ended at
// once, unless a request id lets a retry find it.
func (t *Table) Cancel(now time.Time, call CallID) {
	if w := t.waiting[call]; w != nil && len(w.more) > 0 { // a retry shares the place: only this call leaves
		delete(t.waiting, call)
		calls := slices.DeleteFunc(w.callIDs(), func(c CallID) bool { return c == call })
		w.a.Call, w.more = calls[0], calls[1:]
		t.reply(Reply{Call: call, Outcome: Cancelled})
		return
	}
	if w := t.waiting[call]; w != nil {
		lk := t.locks[w.a.Name]
		lk.waiters = slices.DeleteFunc(lk.waiters, func(x *waiter) bool { return x == w })
		t.unqueue(w)
		t.reply(Reply{Call: call, Outcome: Cancelled})
		t.admit(now, lk) // the next in line may be admitted now, or refused
		return
	}
	if g := t.calls[call]; g != nil {
		delete(t.calls, call)
		g.calls = slices.DeleteFunc(g.calls, func(c CallID) bool { return c == call })
		t.reply(Reply{Call: call, Outcome: Cancelled})
	}
}

// Tick moves the table's clock: grants past their expiry end, waiters
// past their wait are refused, locks past their lock-delay admit again.
func (t *Table) Tick(now time.Time) {
	if t.dead {
		return
	}
	for {
		e, ok := t.timers.popDue(now)
		if !ok {
			return
		}
		switch {
		case e.g != nil:
			if e.g.state == live && !e.g.expires.After(now) {
				t.end(now, e.g, true)
			}
		case e.lk != nil:
			if t.locks[e.lk.name] == e.lk {
				t.admit(now, e.lk)
			}
		}
	}
}

// NextDeadline is when the table next needs a Tick (zero: nothing due).
func (t *Table) NextDeadline() time.Time { return t.timers.next() }

// ForceRelease ends the grant of name with this token whatever its handle
// (an administrator's call): its delete joins the unit being built and the
// call is answered Released when it commits. It ends the grant as an
// expiry does, so the grant's lock-delay applies. A token that is no live
// grant of name: Released false, at once.
func (t *Table) ForceRelease(now time.Time, call CallID, name string, token int64) {
	if t.dead {
		t.reply(Reply{Call: call, Outcome: Unavailable})
		return
	}
	lk := t.locks[name]
	if lk == nil {
		t.reply(Reply{Call: call, Outcome: Released})
		return
	}
	for _, g := range lk.holders {
		if g.state == live && g.token == token {
			g.endForced = true // for Ready.Ended
			g.endCalls = append(g.endCalls, call)
			t.end(now, g, true)
			return
		}
	}
	t.reply(Reply{Call: call, Outcome: Released})
}
