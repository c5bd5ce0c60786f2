package shard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// The per-identity lock limit on the shard-owner core: at most n locks held
// or awaited per identity, exact whatever the burst, the replica count or
// the interleaving (DESIGN.md, invariant 9), like the queue core's
// (lease.WithMaxLocksPerIdentity).
//
// An identity's locks live on many shards, so its count lives on one: the
// shard of the internal name identityName(identity), the identity's home.
// The owner of the home keeps the count as a set of slots (reservations),
// each a key <prefix>shards/identity/<home>/<identity hash>/<reservation
// id>, decided in memory under the home shard's mutex and written in its
// guarded commits before the reservation is answered: one decider, no
// decision unpersisted, so no burst and no interleaving gets more than n.
// Like a grant, a slot is renewed in memory only (RenewIdentity), and a
// new owner of the home honours every slot it loads for a full TTL from
// its load. Holding its slots apart from the lock table, under a prefix of
// their own, keeps them out of everything a client can see (List,
// Describe, Watch, marks), and out of the table's rules (waiter limits,
// lock-delay, end markers) by construction, not by a filter in each view.
//
// The other half is the holder side (identityheld.go): an Acquire of a
// limited caller takes a slot first, with wait 0 (a full count refuses it:
// TooManyLocksError, nothing written), then queues for the lock with the
// slot's id in its grant's record; the member that owns the lock's shard
// renews the slots of its grants and Acquires in progress, and frees a
// slot when its grant ends or its Acquire fails. A slot's TTL
// (newIdentityLimit) is several renewal periods plus a member's lease TTL: a
// grant's slot outlives the takeover of the grant's shard until the new
// owner, which finds the slot in the grant's reloaded record, renews it.

// WithMaxLocksPerIdentity limits each authenticated identity to n locks
// held or awaited at once on the shard core, through a session or not;
// 0, the default, means no limit. Every member of a cluster should be given
// the same n. Acquisitions without an identity are not limited.
func WithMaxLocksPerIdentity(n int64) OwnerOption { return func(o *ownerOptions) { o.maxLocks = n } }

// IdentityHomes reaches the home of an identity's count: the Owner itself
// when it serves the home shard, else the member that does (the server
// forwards, asserting the identity with the member secret). Each call acts
// on the given identity's own count only; name is a lock name of that
// identity's, for the other member's authorization of the call.
type IdentityHomes interface {
	// Reserve takes the slot id of identity's count, or renews it if it
	// is taken already; a full count refuses it with an error that is
	// lease.ErrTooManyLocks. It returns once the slot is persisted.
	Reserve(ctx context.Context, identity, name, id string) error
	// Renew renews the slots in memory and returns those not held.
	Renew(ctx context.Context, identity, name string, ids []string) (missing []string, err error)
	// Release frees the slots (those not held are ignored).
	Release(ctx context.Context, identity, name string, ids []string) error
}

// identityLimit is a member's state of the limit: the counts of the
// identities homed on its shards and the slots its grants hold, per shard
// (each under that shard's mutex), and the slots being freed.
type identityLimit struct {
	n      int64
	ttl    time.Duration // a slot's TTL without renewal
	every  time.Duration // how often slots are renewed and expired slots deleted
	homes  atomic.Pointer[identityHomesBox]
	shards []identityShard // by shard number

	relMu sync.Mutex
	rel   []freeing     // slots to free (identityheld.go)
	kick  chan struct{} // a slot was queued in rel
}

type identityHomesBox struct{ IdentityHomes }

// identityShard is one shard's part: the counts homed on it, the slots of
// its grants. Under the shard's mutex.
type identityShard struct {
	home homeCounts
	held heldSlots
}

// A slot's TTL is identityMinTTL or four member lease TTLs, whichever is
// longer, and identityRenewals renewals fall within it: a slot survives a
// crash of the member that renewed it (up to a period since its last
// renewal), the member lease TTL before its shards are taken over, the
// load, and up to a period before the new owner renews it, with half the
// TTL to spare (with the defaults, a 5 s member lease: a 20 s TTL renewed
// every 2.5 s).
const (
	identityMinTTL   = 10 * time.Second
	identityRenewals = 8
)

func newIdentityLimit(o *Owner) *identityLimit {
	if o.cfg.maxLocks <= 0 {
		return nil
	}
	ttl := max(identityMinTTL, 4*o.cfg.ttl)
	l := &identityLimit{n: o.cfg.maxLocks, ttl: ttl, every: ttl / identityRenewals,
		shards: make([]identityShard, len(o.shards)), kick: make(chan struct{}, 1)}
	l.homes.Store(&identityHomesBox{localHomes{o}})
	return l
}

// IdentityLimit is the per-identity lock limit (0: none).
func (o *Owner) IdentityLimit() int64 {
	if o.ident == nil {
		return 0
	}
	return o.ident.n
}

// SetIdentityHomes sets how the slots of identities homed on other members
// are reached (the server's forwarding); until then, and without it, only
// the homes this member serves are (localHomes).
func (o *Owner) SetIdentityHomes(h IdentityHomes) {
	if o.ident != nil && h != nil {
		o.ident.homes.Store(&identityHomesBox{h})
	}
}

func (o *Owner) identityHomes() IdentityHomes { return o.ident.homes.Load().IdentityHomes }

// identityName is the internal lock name of an identity's count, whose
// shard is the count's home: no client can send it (names with control
// characters are refused), and it names no lock of any table.
func identityName(identity string) string { return "\x00identity/" + keyspace.IdentityHash(identity) }

// IdentityHome is the home shard of the identity's count.
func (o *Owner) IdentityHome(identity string) uint32 {
	return ShardOf(identityName(identity), len(o.shards))
}

// identityPrefix is where the slots of the counts homed on a shard live.
func (o *Owner) identityPrefix(shard uint32) string {
	return fmt.Sprintf("%sshards/identity/%05d/", o.prefix, shard)
}

// homeCounts are the counts homed on a shard, as loaded (lazily: on the
// first call that needs them) for one table of the shard.
type homeCounts struct {
	gen     uint64 // the shard's table generation and term they were loaded for
	term    int64
	loaded  bool
	loading chan struct{} // while a load runs; closed when it ends
	slots   map[string]map[string]*homeSlot
}

// homeSlot is one slot of a count: taken until expires (renewals move it).
type homeSlot struct {
	expires time.Time
	written chan struct{} // closed once its put's outcome is known
	err     error         // the put's failure, set before written is closed
}

// slotValue is a slot key's value: its TTL, honoured from a load.
type slotValue struct {
	TTLms int64 `json:"ttl"`
}

// ReserveIdentity takes the slot id of the identity's count, on the home
// shard this member serves (a *NotServingError elsewhere): renewed if it
// is held already (a retry), else taken if fewer than n slots are held, and
// refused with a *lease.TooManyLocksError if not, nothing written. It
// returns once the slot's put has committed.
func (o *Owner) ReserveIdentity(ctx context.Context, identity, id string) error {
	l := o.ident
	if l == nil || identity == "" {
		return nil
	}
	s := o.shards[o.IdentityHome(identity)]
	h, err := o.homeReady(ctx, s) // s.mu held from here
	if err != nil {
		return err
	}
	now := o.clock.Now()
	ih := keyspace.IdentityHash(identity)
	mine := h.slots[ih]
	sl := mine[id]
	if sl == nil || !sl.expires.After(now) {
		if held := liveSlots(mine, now); held >= l.n {
			s.mu.Unlock()
			return &lease.TooManyLocksError{Count: held, Limit: l.n}
		}
		if mine == nil {
			mine = map[string]*homeSlot{}
			h.slots[ih] = mine
		}
		sl = &homeSlot{written: make(chan struct{})}
		mine[id] = sl
		v, _ := json.Marshal(slotValue{TTLms: l.ttl.Milliseconds()}) // a number always encodes
		put := sl
		o.submitOwn(s, []Op{{Key: o.identityPrefix(s.n) + ih + "/" + id, Value: string(v)}}, func(_ int64, err error, _ bool) {
			put.err = err
			close(put.written)
		})
	}
	if next := now.Add(l.ttl); next.After(sl.expires) {
		sl.expires = next
	}
	s.mu.Unlock()
	select {
	case <-sl.written:
	case <-ctx.Done():
		return ctx.Err()
	}
	if sl.err != nil {
		return fmt.Errorf("%w: the slot of the identity's lock count was not written (%w); retry", lease.ErrUnavailable, sl.err)
	}
	return nil
}

// RenewIdentity renews the identity's slots for their TTL, in memory, on
// the home shard this member serves, and returns the ids it holds no slot
// of.
func (o *Owner) RenewIdentity(ctx context.Context, identity string, ids []string) (missing []string, err error) {
	l := o.ident
	if l == nil || identity == "" {
		return nil, nil
	}
	s := o.shards[o.IdentityHome(identity)]
	h, err := o.homeReady(ctx, s)
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	now := o.clock.Now()
	mine := h.slots[keyspace.IdentityHash(identity)]
	for _, id := range ids {
		sl := mine[id]
		if sl == nil || !sl.expires.After(now) {
			missing = append(missing, id)
			continue
		}
		if next := now.Add(l.ttl); next.After(sl.expires) {
			sl.expires = next
		}
	}
	return missing, nil
}

// ReleaseIdentity frees the identity's slots, on the home shard this
// member serves: decided at once (the next ReserveIdentity may take them),
// their deletes committed in the background (a failed one reloads the
// shard, and the slot with it, until it expires: never more than n).
func (o *Owner) ReleaseIdentity(ctx context.Context, identity string, ids []string) error {
	if o.ident == nil || identity == "" {
		return nil
	}
	s := o.shards[o.IdentityHome(identity)]
	h, err := o.homeReady(ctx, s)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	ih := keyspace.IdentityHash(identity)
	mine := h.slots[ih]
	var ops []Op
	for _, id := range ids {
		if _, ok := mine[id]; ok {
			delete(mine, id)
			ops = append(ops, Op{Key: o.identityPrefix(s.n) + ih + "/" + id, Delete: true})
		}
	}
	if len(mine) == 0 {
		delete(h.slots, ih)
	}
	o.submitSlots(s, ops)
	return nil
}

// liveSlots counts the slots not past their expiry.
func liveSlots(mine map[string]*homeSlot, now time.Time) int64 {
	var n int64
	for _, sl := range mine {
		if sl.expires.After(now) {
			n++
		}
	}
	return n
}

// slotUnitOps bounds a unit of slot deletes well under a Txn's ops
// (etcd's --max-txn-ops, 128 by default): a larger unit is never sent.
const slotUnitOps = 64

// submitSlots commits slot deletes in the background, in units of at most
// slotUnitOps (under s.mu).
func (o *Owner) submitSlots(s *shardState, ops []Op) {
	for len(ops) > 0 {
		n := min(len(ops), slotUnitOps)
		o.submitOwn(s, ops[:n], func(int64, error, bool) {})
		ops = ops[n:]
	}
}

// homeReady returns the counts homed on s, loading them from etcd first if
// this table of the shard has not yet, with s.mu held; or why not (s not
// served here, the read failed), with s.mu not held.
func (o *Owner) homeReady(ctx context.Context, s *shardState) (*homeCounts, error) {
	for {
		s.mu.Lock()
		if err := o.serving(s); err != nil {
			s.mu.Unlock()
			return nil, err
		}
		h := &o.ident.shards[s.n].home
		if h.gen != s.gen || h.term != s.term { // another table since: load again
			*h = homeCounts{gen: s.gen, term: s.term}
		}
		if h.loaded {
			return h, nil
		}
		if h.loading != nil {
			ch := h.loading
			s.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		ch := make(chan struct{})
		h.loading = ch
		gen, term := s.gen, s.term
		s.mu.Unlock()
		slots, err := o.readSlots(s.n)
		s.mu.Lock()
		if h.gen == gen && h.term == term && h.loading == ch {
			h.loading = nil
			if err == nil {
				now := o.clock.Now()
				h.slots, h.loaded = map[string]map[string]*homeSlot{}, true
				for _, ls := range slots { // each honoured for a full TTL from now
					if h.slots[ls.ih] == nil {
						h.slots[ls.ih] = map[string]*homeSlot{}
					}
					h.slots[ls.ih][ls.id] = &homeSlot{expires: now.Add(ls.ttl), written: closedChan}
				}
			}
		}
		close(ch)
		s.mu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("%w: reading the lock counts of shard %d: %w", lease.ErrUnavailable, s.n, err)
		}
	}
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// loadedSlot is a slot as etcd keeps it.
type loadedSlot struct {
	ih, id string
	ttl    time.Duration
}

// readSlots is every slot etcd holds for the counts homed on the shard.
// Nothing of an older table of the shard is in flight then: the table
// this load is for was loaded only once none was (startLoad), and this
// table writes no slot before its counts are loaded.
func (o *Owner) readSlots(shard uint32) ([]loadedSlot, error) {
	ctx, cancel := context.WithTimeout(o.ctx, 5*time.Second)
	defer cancel()
	prefix := o.identityPrefix(shard)
	r, err := o.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := make([]loadedSlot, 0, len(r.Kvs))
	for _, kv := range r.Kvs {
		ih, id, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), prefix), "/")
		if !ok || ih == "" || id == "" {
			continue // not a slot: nothing of ours
		}
		ttl := o.ident.ttl
		var v slotValue
		if json.Unmarshal(kv.Value, &v) == nil && v.TTLms > 0 {
			ttl = max(ttl, time.Duration(v.TTLms)*time.Millisecond)
		}
		out = append(out, loadedSlot{ih: ih, id: id, ttl: ttl})
	}
	return out, nil
}

// expireSlots deletes the slots past their expiry, on the shards this
// member serves whose counts are loaded.
func (o *Owner) expireSlots() {
	for _, s := range o.shards {
		s.mu.Lock()
		h := &o.ident.shards[s.n].home
		if o.serving(s) == nil && h.loaded && h.gen == s.gen && h.term == s.term {
			now := o.clock.Now()
			var ops []Op
			for ih, mine := range h.slots {
				for id, sl := range mine {
					if !sl.expires.After(now) {
						delete(mine, id)
						ops = append(ops, Op{Key: o.identityPrefix(s.n) + ih + "/" + id, Delete: true})
					}
				}
				if len(mine) == 0 {
					delete(h.slots, ih)
				}
			}
			o.submitSlots(s, ops)
		}
		s.mu.Unlock()
	}
}

// localHomes reaches the homes this member serves only: the homes until
// the server sets its own (SetIdentityHomes). A home not served here now
// is retried briefly (a load, a hand-over), then its *NotServingError
// returned.
type localHomes struct{ o *Owner }

func (h localHomes) Reserve(ctx context.Context, identity, _, id string) error {
	return retryNotServed(ctx, func() error { return h.o.ReserveIdentity(ctx, identity, id) })
}

func (h localHomes) Renew(ctx context.Context, identity, _ string, ids []string) (missing []string, err error) {
	err = retryNotServed(ctx, func() error {
		var e error
		missing, e = h.o.RenewIdentity(ctx, identity, ids)
		return e
	})
	return missing, err
}

func (h localHomes) Release(ctx context.Context, identity, _ string, ids []string) error {
	return retryNotServed(ctx, func() error { return h.o.ReleaseIdentity(ctx, identity, ids) })
}

// retryNotServed calls f again while it fails with a *NotServingError, up
// to 5 times (20 ms doubling: 0.6 s), within ctx.
func retryNotServed(ctx context.Context, f func() error) error {
	wait := 20 * time.Millisecond
	for attempt := 0; ; attempt++ {
		err := f()
		if !errors.Is(err, ErrNotServing) || attempt >= 5 {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait *= 2
	}
}
