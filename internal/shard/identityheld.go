package shard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/locktable"
)

// The holder side of the per-identity limit (identity.go): the member that
// serves a lock's shard holds the slots of that shard's grants and of the
// Acquires in progress on it. It takes a slot before an Acquire queues
// (AcquireCounted), frees it when the Acquire fails or its grant ends
// (identityEnded, from the table's ends), and renews every slot it holds
// in the background (keepSlots). The grant's record names its slot, so a
// member that loads the shard after a failover finds the slots of the
// grants it took over (syncHeld) and renews them from then on. A waiter
// lost in a failover never reached etcd: its slot is renewed by nobody
// and expires, which errs towards fewer locks, never more.

// heldSlots are the slots held for one shard's grants and Acquires in
// progress (under the shard's mutex).
type heldSlots struct {
	gen       uint64                     // the table generation grants was last synced with
	claims    map[string]*slotClaim      // by slot (reservation) id
	grants    map[grantKey]string        // committed grants known to hold a slot: its id
	releasing map[grantKey]chan struct{} // ended grants whose slot is being freed
}

// slotClaim is one slot this member holds: for its Acquires in progress
// (calls; several for retries of one request id), or for a grant of the
// shard's table.
type slotClaim struct {
	identity string
	name     string // a lock of the identity (the other member authorizes the call by it)
	calls    int
	reserved bool // the home has answered for it (only those are renewed)
}

// freeing is a slot to free at its home; key is the grant whose end freed
// it, if a Release may wait for it (AwaitIdentityRelease).
type freeing struct {
	shard              uint32
	key                grantKey
	identity, name, id string
}

// identityCallTimeout bounds the background calls on a home (renewals,
// frees), so that one unreachable member delays none of the others much.
const identityCallTimeout = 5 * time.Second

// AcquireCounted is Acquire under the per-identity limit: for a caller
// with an identity, it first takes a slot of the identity's count at its
// home, with wait 0 (a full count: *lease.TooManyLocksError, nothing
// queued or written), then queues with the slot's id in the grant's record.
// If the Acquire ends without a grant that holds the slot (refused,
// cancelled, timed out), the slot is freed before it returns. Only the
// member serving the name's shard counts an Acquire: elsewhere it fails
// with the *NotServingError that forwards it there.
func (o *Owner) AcquireCounted(ctx context.Context, a locktable.Acquire) (*locktable.Grant, error) {
	if o.ident == nil || a.Caller == "" {
		return o.Acquire(ctx, a)
	}
	s := o.shards[o.ShardOf(a.Name)]
	a.Reservation = locktable.ReservationID(a.RequestID, a.Caller, a.Name, randomSecret())
	if err := o.claimSlot(s, a); err != nil {
		return nil, err
	}
	homes := o.identityHomes()
	if err := homes.Reserve(ctx, a.Caller, a.Name, a.Reservation); err != nil {
		// Refused: nothing was taken. Any other failure: the slot may
		// have been taken, so it is freed (a slot not held frees nothing).
		if o.unclaimSlot(s, a, false) && !errors.Is(err, lease.ErrTooManyLocks) {
			o.freeNow(a)
		}
		return nil, o.homeNotServed(a.Caller, err)
	}
	o.slotReserved(s, a)
	g, err := o.Acquire(ctx, a)
	if o.unclaimSlot(s, a, !errors.Is(err, ErrNotServing)) {
		o.freeNow(a)
	}
	return g, err
}

// homeNotServed is err, unless it says the count's home is served by no
// member that could be reached: then a *NotServingError of the home
// naming no owner, which is not the name's shard's (a caller forwarding
// on it would forward the Acquire to the home's owner instead): retry.
func (o *Owner) homeNotServed(identity string, err error) error {
	var ns *NotServingError
	if !errors.As(err, &ns) {
		return err
	}
	home := o.IdentityHome(identity)
	return &NotServingError{Shard: home, Reason: fmt.Sprintf("the count of the caller's locks (-max-locks-per-identity) lives on shard %d, "+
		"which no member serves now (%s)", home, ns.Reason)}
}

// claimSlot registers an Acquire in progress that holds (or is about to
// take) a slot, on the shard that serves its name; if the shard is not
// served here, the *NotServingError that forwards the Acquire.
func (o *Owner) claimSlot(s *shardState, a locktable.Acquire) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := o.serving(s); err != nil {
		return err
	}
	h := o.held(s)
	c := h.claims[a.Reservation]
	if c == nil {
		c = &slotClaim{identity: a.Caller, name: a.Name}
		h.claims[a.Reservation] = c
	}
	c.calls++
	return nil
}

// slotReserved marks the Acquire's slot taken at its home: renewed from now.
func (o *Owner) slotReserved(s *shardState, a locktable.Acquire) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := o.held(s).claims[a.Reservation]; c != nil {
		c.reserved = true
	}
}

// unclaimSlot ends an Acquire's claim, and says whether its slot must be
// freed now: no other call with it is in progress and no grant of the
// table holds it (one of an earlier call with the same request id may).
// queued: the Acquire reached the table. While the shard's table is away
// (dropped, reloading, moved) nobody here can tell whether a grant holds a
// slot that one may: it is left to the table that loads the grant, if one
// holds it, else to its expiry.
func (o *Owner) unclaimSlot(s *shardState, a locktable.Acquire, queued bool) (free bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := o.held(s)
	c := h.claims[a.Reservation]
	if c != nil && c.calls > 0 {
		c.calls--
	}
	if c != nil && c.calls > 0 {
		return false // a retry of its request id is in progress
	}
	switch {
	case s.tab != nil && !s.tab.Dead():
		if r, ok := s.tab.ReservedBy(a.Name, a.Reservation); ok {
			if r.Token > 0 {
				h.grants[grantKey{r.Name, r.Token}] = a.Reservation
			}
			if c == nil {
				h.claims[a.Reservation] = &slotClaim{identity: a.Caller, name: a.Name, reserved: true}
			}
			return false
		}
	case queued || a.RequestID != "":
		delete(h.claims, a.Reservation)
		return false
	}
	delete(h.claims, a.Reservation)
	return true
}

// freeNow frees the Acquire's slot at its home, whatever the caller's
// context (a cancelled caller's slot is freed too).
func (o *Owner) freeNow(a locktable.Acquire) {
	ctx, cancel := context.WithTimeout(o.ctx, identityCallTimeout)
	defer cancel()
	if err := o.identityHomes().Release(ctx, a.Caller, a.Name, []string{a.Reservation}); err != nil {
		o.log.Debug("shard: freeing the slot of an Acquire that holds no lock failed; it expires", "name", a.Name, "err", err)
	}
}

// held is s's holder side, its maps made (under s.mu).
func (o *Owner) held(s *shardState) *heldSlots {
	h := &o.ident.shards[s.n].held
	if h.claims == nil {
		h.claims, h.grants, h.releasing = map[string]*slotClaim{}, map[grantKey]string{}, map[grantKey]chan struct{}{}
	}
	return h
}

// identityEnded frees the slots of the grants whose end the table made
// final (grantsEnded, under s.mu). A table just loaded is synced first:
// the slots of the grants it took over are held from now on.
func (o *Owner) identityEnded(s *shardState, ends []locktable.Ended) {
	if o.ident == nil || s.tab == nil || s.tab.Dead() {
		return // a dropped table's grants may live on: the next table says
	}
	h := o.held(s)
	if h.gen != s.gen {
		o.syncHeld(s, h)
	}
	for _, e := range ends {
		k := grantKey{e.Name, e.Token}
		id, ok := h.grants[k]
		if !ok {
			continue
		}
		delete(h.grants, k)
		if c := h.claims[id]; c != nil && c.calls == 0 {
			delete(h.claims, id)
			o.queueFree(h, freeing{shard: s.n, key: k, identity: c.identity, name: c.name, id: id})
		}
	}
}

// syncHeld makes the claims of s match its table (under s.mu, the table
// live): every slot a grant holds is claimed, and a claim that neither a
// grant nor an Acquire in progress holds any more is freed (its grant
// ended unseen: committed after its caller left, or gone in a reload).
func (o *Owner) syncHeld(s *shardState, h *heldSlots) {
	inTable := map[string]bool{}
	grants := map[grantKey]string{}
	s.tab.Reservations(func(r locktable.Reserved) {
		inTable[r.Reservation] = true
		if r.Token > 0 {
			grants[grantKey{r.Name, r.Token}] = r.Reservation
		}
		if c := h.claims[r.Reservation]; c == nil {
			h.claims[r.Reservation] = &slotClaim{identity: r.Caller, name: r.Name, reserved: true}
		} else {
			c.reserved = true
		}
	})
	for id, c := range h.claims {
		if c.calls == 0 && !inTable[id] {
			delete(h.claims, id)
			o.queueFree(h, freeing{shard: s.n, identity: c.identity, name: c.name, id: id})
		}
	}
	h.grants, h.gen = grants, s.gen
}

// queueFree hands a slot to freeSlots (under s.mu).
func (o *Owner) queueFree(h *heldSlots, f freeing) {
	if f.key != (grantKey{}) {
		h.releasing[f.key] = make(chan struct{})
	}
	l := o.ident
	l.relMu.Lock()
	l.rel = append(l.rel, f)
	l.relMu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// AwaitIdentityRelease waits (until ctx ends) for the slot of the grant
// of name with token, whose end this member's table made final, to be
// freed at its home: a Release answered after it leaves its caller's
// count one lower at once. A grant that held no slot returns at once.
func (o *Owner) AwaitIdentityRelease(ctx context.Context, name string, token int64) {
	if o.ident == nil {
		return
	}
	s := o.shards[o.ShardOf(name)]
	s.mu.Lock()
	ch := o.held(s).releasing[grantKey{name, token}]
	s.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// startIdentityLimit starts the limit's goroutines: they stop with o.ctx.
func (o *Owner) startIdentityLimit() {
	if o.ident == nil {
		return
	}
	o.wg.Add(2)
	go func() {
		defer o.wg.Done()
		o.freeSlots()
	}()
	go func() {
		defer o.wg.Done()
		o.keepSlots()
	}()
}

// freeSlots frees the slots queued by queueFree, one call per identity,
// and wakes the Releases waiting for them.
func (o *Owner) freeSlots() {
	l := o.ident
	for {
		select {
		case <-o.ctx.Done():
			l.relMu.Lock()
			batch := l.rel
			l.rel = nil
			l.relMu.Unlock()
			o.freed(batch) // nothing is freed any more: their slots expire
			return
		case <-l.kick:
		}
		l.relMu.Lock()
		batch := l.rel
		l.rel = nil
		l.relMu.Unlock()
		byIdentity := map[string][]freeing{}
		for _, f := range batch {
			byIdentity[f.identity] = append(byIdentity[f.identity], f)
		}
		homes := o.identityHomes()
		var wg sync.WaitGroup
		for identity, fs := range byIdentity {
			wg.Go(func() {
				ids := make([]string, len(fs))
				for i, f := range fs {
					ids[i] = f.id
				}
				ctx, cancel := context.WithTimeout(o.ctx, identityCallTimeout)
				defer cancel()
				if err := homes.Release(ctx, identity, fs[0].name, ids); err != nil {
					o.log.Debug("shard: freeing the slots of ended grants failed; they expire", "slots", len(ids), "err", err)
				}
			})
		}
		wg.Wait()
		o.freed(batch)
	}
}

// freed wakes the Releases waiting for the slots of batch.
func (o *Owner) freed(batch []freeing) {
	for _, f := range batch {
		if f.key == (grantKey{}) {
			continue
		}
		s := o.shards[f.shard]
		s.mu.Lock()
		h := o.held(s)
		if ch := h.releasing[f.key]; ch != nil {
			close(ch)
			delete(h.releasing, f.key)
		}
		s.mu.Unlock()
	}
}

// keepSlots renews, every period, the slots this member holds, and deletes
// the expired slots of the counts homed on its shards.
func (o *Owner) keepSlots() {
	t := time.NewTicker(o.ident.every)
	defer t.Stop()
	for {
		select {
		case <-o.ctx.Done():
			return
		case <-t.C:
		}
		o.expireSlots()
		o.renewSlots()
	}
}

// renewal is the slots of one identity to renew, and where each is held.
type renewal struct {
	name  string
	ids   []string
	shard map[string]uint32
}

// renewSlots renews every slot this member holds: one call per identity,
// a few at a time. A slot its home no longer holds (it expired: the home
// was cut off from this member longer than its TTL) is taken again if the
// count has room; if not, the identity holds more locks than its limit
// until some end, which is logged.
func (o *Owner) renewSlots() {
	byIdentity := map[string]*renewal{}
	for _, s := range o.shards {
		s.mu.Lock()
		h := o.held(s)
		if s.tab == nil || s.tab.Dead() {
			// Not this member's table (any more): whoever loads it holds
			// the slots of its grants; the Acquires in progress end here.
			for id, c := range h.claims {
				if c.calls == 0 {
					delete(h.claims, id)
				}
			}
			clear(h.grants)
		} else {
			o.syncHeld(s, h)
		}
		for id, c := range h.claims {
			if !c.reserved {
				continue
			}
			r := byIdentity[c.identity]
			if r == nil {
				r = &renewal{name: c.name, shard: map[string]uint32{}}
				byIdentity[c.identity] = r
			}
			r.ids = append(r.ids, id)
			r.shard[id] = s.n
		}
		s.mu.Unlock()
	}
	homes := o.identityHomes()
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for identity, r := range byIdentity {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			o.renewIdentity(homes, identity, r)
		})
	}
	wg.Wait()
}

// renewIdentity renews one identity's slots, and takes again those its
// home lost if they are still held here.
func (o *Owner) renewIdentity(homes IdentityHomes, identity string, r *renewal) {
	ctx, cancel := context.WithTimeout(o.ctx, min(identityCallTimeout, o.ident.every))
	defer cancel()
	missing, err := homes.Renew(ctx, identity, r.name, r.ids)
	if err != nil {
		o.log.Debug("shard: renewing the slots of an identity's lock count failed; retried next period", "slots", len(r.ids), "err", err)
		return
	}
	for _, id := range missing {
		s := o.shards[r.shard[id]]
		s.mu.Lock()
		c := o.held(s).claims[id]
		s.mu.Unlock()
		if c == nil {
			continue // freed meanwhile
		}
		err := homes.Reserve(ctx, identity, c.name, id)
		switch {
		case errors.Is(err, lease.ErrTooManyLocks):
			o.log.Warn("shard: a lock's slot of its identity's lock count expired unrenewed and the count is full: "+
				"the identity holds more locks than -max-locks-per-identity until some end", "name", c.name)
		case err != nil:
			o.log.Debug("shard: taking again an expired slot of an identity's lock count failed; retried next period", "name", c.name, "err", err)
		}
	}
}
