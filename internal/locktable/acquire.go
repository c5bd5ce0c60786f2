package locktable

import "time"

// Acquire queues a call for a lock; the lock is granted to it (by a unit
// that puts its key) as soon as it is first in line and the lock admits it,
// or it is refused when its wait elapses. A retry with the request id of a
// grant or a waiter takes that over instead.
func (t *Table) Acquire(now time.Time, a Acquire) {
	if t.dead {
		t.reply(Reply{Call: a.Call, Outcome: Unavailable})
		return
	}
	reqKey := requestDigest(a.Caller, a.RequestID)
	if reqKey != "" && t.retry(now, a, reqKey) {
		return
	}
	lk := t.lockOf(a.Name)
	if a.Session != "" && sessionIn(lk, a.Session) {
		t.reply(Reply{Call: a.Call, Outcome: SessionBusy})
		t.forget(lk, now)
		return
	}
	if r, ok := mismatch(lk, a); ok {
		t.reply(r)
		t.forget(lk, now)
		return
	}
	if t.cfg.MaxWaiters > 0 && len(lk.waiters) >= t.cfg.MaxWaiters && a.Wait > 0 { // a try-lock is refused NotGranted below
		t.reply(Reply{Call: a.Call, Outcome: TooManyWaiters, InForce: int32(t.cfg.MaxWaiters)})
		return
	}
	lk.limit = max(a.Limit, 1)
	w := &waiter{a: a, since: now, deadline: now.Add(a.Wait), reqKey: reqKey}
	lk.waiters = append(lk.waiters, w)
	t.waiting[a.Call] = w
	if reqKey != "" {
		t.queued[reqKey] = w
	}
	t.timers.push(w.deadline, nil, w, lk)
	t.admit(now, lk)
}

// mismatch refuses an acquisition that asks a lock in force for another
// limit, or a semaphore for a reader.
func mismatch(lk *lock, a Acquire) (Reply, bool) {
	asked := max(a.Limit, 1)
	if len(lk.holders) == 0 && len(lk.waiters) == 0 {
		if a.Shared && asked > 1 {
			return Reply{Call: a.Call, Outcome: LimitMismatch, InForce: asked, Shared: true}, true
		}
		return Reply{}, false
	}
	if asked != lk.limit || (a.Shared && lk.limit > 1) {
		return Reply{Call: a.Call, Outcome: LimitMismatch, InForce: lk.limit, Shared: a.Shared}, true
	}
	return Reply{}, false
}

// retry takes over the grant or the waiter of a request id, and says
// whether it did (false: the id is new here).
func (t *Table) retry(now time.Time, a Acquire, reqKey string) bool {
	if g := t.requests[reqKey]; g != nil && g.state != ending {
		if !sameRequest(g.rec, a) {
			t.reply(Reply{Call: a.Call, Outcome: RequestIDReused})
			return true
		}
		if g.state == pending {
			g.retried = true
			g.calls = append(g.calls, a.Call)
			t.calls[a.Call] = g
			return true
		}
		gr := t.grantOf(g, a.RequestID, a.Secret[:])
		gr.Resumed = true
		t.reply(Reply{Call: a.Call, Outcome: Granted, Grant: gr})
		return true
	}
	if w := t.queued[reqKey]; w != nil {
		if !sameWaiter(w.a, a) {
			t.reply(Reply{Call: a.Call, Outcome: RequestIDReused})
			return true
		}
		// A retry while the first call still waits (its caller may have
		// given up on it, a lost acknowledgment, or not): both share the
		// place in line and get the same answer; a caller that goes away
		// withdraws its call only (Cancel).
		w.more = append(w.more, a.Call)
		w.retried = true
		t.waiting[a.Call] = w
		return true
	}
	return false
}

func sameRequest(r Record, a Acquire) bool {
	return r.Name == a.Name && r.Session == a.Session && r.Owner == a.Owner && r.TTLms == millis(a.TTL) &&
		r.Limit == max(a.Limit, 1) && r.Shared == a.Shared && r.MaxHoldMs == millis(a.MaxHold) &&
		r.LockDelayMs == millis(a.LockDelay)
}

func sameWaiter(w, a Acquire) bool {
	return w.Name == a.Name && w.Session == a.Session && w.Owner == a.Owner && w.TTL == a.TTL && max(w.Limit, 1) == max(a.Limit, 1) &&
		w.Shared == a.Shared && w.MaxHold == a.MaxHold && w.LockDelay == a.LockDelay
}

// admit grants the lock to the first waiter if the lock admits it now. One
// new grant per lock at a time: while one is pending, the next is decided
// when it commits (a unit holds at most one new grant per name, since keys
// of one revision share their create revision, and every holder has a
// token of its own). Waiters whose wait elapsed are refused, unless a
// pending grant may still let them in.
func (t *Table) admit(now time.Time, lk *lock) {
	if !t.hasPending(lk) && len(lk.waiters) > 0 && t.admits(now, lk, lk.waiters[0]) {
		w := lk.waiters[0]
		lk.waiters = lk.waiters[1:]
		t.unqueue(w)
		t.grant(now, lk, w)
	}
	if t.hasPending(lk) {
		return
	}
	t.refuseElapsed(now, lk)
	t.forget(lk, now)
}

// admits says whether the lock takes w now: ending holders no longer
// count (their delete commits before or with w's grant).
func (t *Table) admits(now time.Time, lk *lock, w *waiter) bool {
	if now.Before(lk.delayUntil) {
		return false
	}
	var n int32
	exclusive := false
	for _, g := range lk.holders {
		if g.state == ending {
			continue
		}
		n++
		exclusive = exclusive || !g.rec.Shared
	}
	switch {
	case lk.limit > 1:
		return n < lk.limit && freeSlot(lk, now) >= 0
	case w.a.Shared:
		return !exclusive
	default:
		return n == 0
	}
}

func (t *Table) hasPending(lk *lock) bool {
	for _, g := range lk.holders {
		if g.state == pending {
			return true
		}
	}
	return false
}

// refuseElapsed answers NotGranted to every waiter whose wait elapsed.
func (t *Table) refuseElapsed(now time.Time, lk *lock) {
	kept := lk.waiters[:0]
	for _, w := range lk.waiters {
		if w.deadline.After(now) {
			kept = append(kept, w)
			continue
		}
		t.unqueue(w)
		for _, c := range w.callIDs() {
			t.reply(Reply{Call: c, Outcome: NotGranted, HolderToken: holderToken(lk)})
		}
	}
	clear(lk.waiters[len(kept):])
	lk.waiters = kept
}

func (t *Table) unqueue(w *waiter) {
	for _, c := range w.callIDs() {
		delete(t.waiting, c)
	}
	if w.reqKey != "" && t.queued[w.reqKey] == w {
		delete(t.queued, w.reqKey)
	}
}

// holderToken is the newest visible holder's token, 0 if none.
func holderToken(lk *lock) int64 {
	var tok int64
	for _, g := range lk.holders {
		if g.state != pending {
			tok = max(tok, g.token)
		}
	}
	return tok
}

// grant makes w a pending holder: its put joins the unit being built, with
// the deletes of the holders that ended before it (the hand-off commit).
func (t *Table) grant(now time.Time, lk *lock, w *waiter) {
	a := w.a
	id := t.newGrantID()
	secret := a.Secret[:]
	if a.RequestID != "" && a.Session == "" {
		secret = derivedSecret(a.RequestID, a.Caller, a.Name, id)
	}
	g := &grant{
		rec: Record{Name: a.Name, ID: id, Caller: a.Caller, Owner: a.Owner, RequestID: w.reqKey,
			TTLms: millis(a.TTL), MaxHoldMs: millis(a.MaxHold), AcquiredMs: now.UnixMilli(),
			Limit: lk.limit, Slot: max(freeSlot(lk, now), 0), Shared: a.Shared, Secret: secretSum(secret),
			LockDelayMs: millis(a.LockDelay), Session: a.Session, Reservation: a.Reservation},
		key: t.cfg.Prefix + t.cfg.Escape(a.Name) + "/" + id, state: pending, acquiredAt: now,
		lockDelay: a.LockDelay, calls: w.callIDs(), secret: secret, retried: w.retried,
	}
	if a.MaxHold > 0 {
		g.maxHoldUntil = now.Add(a.MaxHold)
	}
	lk.holders = append(lk.holders, g)
	t.grants[id] = g
	for _, c := range g.calls {
		t.calls[c] = g
	}
	if w.reqKey != "" {
		t.requests[w.reqKey] = g
	}
	u := t.unit()
	u.puts = append(u.puts, g)
	t.openOps = append(t.openOps, Op{Key: g.key, Value: g.rec.encode(), Name: a.Name})
}

// freeSlot is the lowest slot below the limit that no holder but an
// ending one uses and that is past its lock-delay; -1 if none.
func freeSlot(lk *lock, now time.Time) int32 {
	if lk.limit <= 1 {
		return 0
	}
	used := make(map[int32]bool, len(lk.holders))
	for _, g := range lk.holders {
		if g.state != ending {
			used[g.rec.Slot] = true
		}
	}
	for s := range lk.limit {
		if !used[s] && !lk.slotDelay[s].After(now) {
			return s
		}
	}
	return -1
}

// grantOf is the grant as its holder sees it; requestID re-derives the
// handle of a retried request (sessionSecret, the retry's, is a session
// grant's).
func (t *Table) grantOf(g *grant, requestID string, sessionSecret []byte) *Grant {
	secret, id := g.secret, g.rec.ID
	switch {
	case g.rec.Session != "":
		id = g.rec.Session
		if secret == nil {
			secret = sessionSecret
		}
	case requestID != "":
		secret = derivedSecret(requestID, g.rec.Caller, g.rec.Name, g.rec.ID)
	}
	gr := &Grant{Name: g.rec.Name, Token: g.token, TTL: time.Duration(g.rec.TTLms) * time.Millisecond,
		ExpiresAt: g.expires, AcquiredAt: g.acquiredAt, Slot: g.rec.Slot, Shared: g.rec.Shared, Limit: g.rec.Limit}
	if secret != nil {
		gr.Handle = formatHandle(id, secret)
	}
	return gr
}
