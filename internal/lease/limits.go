package lease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Exact limits: at most n waiters per lock, at most n locks held or awaited
// per identity, whatever the burst, the replica count or the interleaving
// (DESIGN.md, invariant 9).
//
// How: a limit of n is n slot keys, and a join claims a free slot of each
// limited scope in the very transaction that writes its queue key: the
// transaction compares the slot's create revision with 0 and puts the slot
// on the entry's lease. etcd serialises transactions, so no two entries
// ever hold one slot, and there are n slots. A slot shares its entry's fate:
// on the same lease, it ends with the entry's expiry or revocation without
// any decrement path (etcd deletes both in one revision); the transactions
// that end an entry otherwise (release, force-release, a session's
// withdrawal) delete its slots with it.
//
// Why not a counter. etcd's Compare cannot count keys, so the alternative is
// a counter key updated by compare-and-swap on its mod revision. It makes
// every join of a scope contend on one key (a burst of 500 retries O(n²)
// times), and it needs a decrement for every end, expiry included, which no
// coordinator observes in time (a replica may be down when a lease
// expires): it drifts. Slots need neither.
//
// Choosing a slot: a join first guesses one at random (no read: while a
// scope is far from full, the guess is free almost always, and the join
// costs what it cost without limits). If the slot is taken, the failed
// transaction's Else branch returns the scope's occupancy, and the join
// picks at random among the free slots, or is refused if there is none.
// Each failed guess means another join took that slot, so a burst settles
// within a few rounds. Group commit keeps two claims of one slot out of one
// transaction: etcd evaluates every nested compare before any write, so both
// would find the slot free (etcd also refuses a Txn that writes a key twice;
// the batch would then be committed one by one).
//
// A limit lowered while entries hold slots above it does not evict them:
// joins then claim only slots below the new limit, so the scope shrinks to
// it as those entries end. Every replica sharing a key prefix should be
// given the same limits.

// WithMaxWaitersPerLock limits each lock to n waiters (its holder not
// counted); 0, the default, means no limit. A join beyond it fails with a
// *TooManyWaitersError, or, for a try-lock (WithWait(0)), with a
// *NotGrantedError, as the lock is held.
func WithMaxWaitersPerLock(n int64) Option { return func(o *options) { o.maxWaiters = n } }

// WithMaxLocksPerIdentity limits each identity (WithIdentity) to n locks
// held or awaited at once, through a session or not; 0, the default, means
// no limit. A join beyond it fails with a *TooManyLocksError. Acquisitions
// without an identity are not limited.
func WithMaxLocksPerIdentity(n int64) Option { return func(o *options) { o.maxOwned = n } }

// ErrTooManyWaiters: the lock already has as many waiters as allowed
// (WithMaxWaitersPerLock). Returned as *TooManyWaitersError.
var ErrTooManyWaiters = errors.New("lease: too many waiters for this lock")

// TooManyWaitersError reports a join refused by WithMaxWaitersPerLock;
// nothing of it is left in etcd.
type TooManyWaitersError struct {
	Name  string
	Limit int64
}

func (e *TooManyWaitersError) Error() string {
	return fmt.Sprintf("lease: lock %q already has %d waiters, the most allowed (--max-waiters-per-lock); retry later, or try once (wait 0)", e.Name, e.Limit)
}

// Is makes errors.Is(err, ErrTooManyWaiters) true.
func (e *TooManyWaitersError) Is(target error) bool { return target == ErrTooManyWaiters }

// maxSlotRounds bounds how often one join picks a slot again after losing
// it to another join; beyond, it answers ErrUnavailable (retry).
const maxSlotRounds = 64

// waiterSlots is the prefix of a lock's waiter slots.
func (k Keyspace) waiterSlots(name string) string { return k.WaiterSlots(name) }

// slotScope is one limited scope: the slot keys prefix+"0" to
// prefix+"<size-1>", and the one a join is about to claim.
type slotScope struct {
	prefix string
	size   int64
	at     int64 // the slot to claim
	taken  int64 // slots seen taken by the last failed claim
}

func (s *slotScope) key() string { return s.prefix + strconv.FormatInt(s.at, 10) }

// slots are the scopes a join claims a slot of: its lock's waiters and its
// identity's locks, each if limited (nil otherwise).
type slots struct {
	waiters, owned *slotScope
	ident          string // the identity's hash, if owned is set
}

// slotsFor returns the scopes of a join of name with o, each with a
// random first guess.
func (m *Manager) slotsFor(name string, o acquireOptions) slots {
	var s slots
	if m.maxWaiters > 0 {
		// The holder has a slot too (a waiter keeps its slot when it
		// becomes the holder): n waiters and a holder.
		s.waiters = &slotScope{prefix: m.ks.waiterSlots(name), size: m.maxWaiters + 1}
	}
	if m.maxOwned > 0 && o.identity != "" {
		s.ident = identityHash(o.identity)
		s.owned = &slotScope{prefix: m.ks.ownersOf(s.ident), size: m.maxOwned}
	}
	for _, sc := range s.scopes() {
		sc.at = rand.Int64N(sc.size)
	}
	return s
}

// scopes are the limited scopes, waiters first.
func (s slots) scopes() []*slotScope {
	var out []*slotScope
	for _, sc := range []*slotScope{s.waiters, s.owned} {
		if sc != nil {
			out = append(out, sc)
		}
	}
	return out
}

func (s slots) limited() bool { return s.waiters != nil || s.owned != nil }

// stamp records the slots about to be claimed in the entry's record, which
// is how the transactions that end the entry find them.
func (s slots) stamp(rec *record) {
	if s.waiters != nil {
		rec.WaiterSlot = s.waiters.at + 1
	}
	if s.owned != nil {
		rec.Ident, rec.OwnedSlot = s.ident, s.owned.at+1
	}
}

// cmps require every slot to claim to be free.
func (s slots) cmps() []clientv3.Cmp {
	var out []clientv3.Cmp
	for _, sc := range s.scopes() {
		out = append(out, clientv3.Compare(clientv3.CreateRevision(sc.key()), "=", 0))
	}
	return out
}

// puts claim the slots on the entry's lease.
func (s slots) puts(id clientv3.LeaseID) []clientv3.Op {
	var out []clientv3.Op
	for _, sc := range s.scopes() {
		out = append(out, clientv3.OpPut(sc.key(), "", clientv3.WithLease(id)))
	}
	return out
}

// reads return each scope's occupancy (keys only), for a failed claim.
func (s slots) reads() []clientv3.Op {
	var out []clientv3.Op
	for _, sc := range s.scopes() {
		out = append(out, clientv3.OpGet(sc.prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly()))
	}
	return out
}

// conflicts are the slot keys no other transaction of the same group
// commit may claim. The waiter slot is covered by the lock's name, which
// every join of the lock names already.
func (s slots) conflicts() []string {
	if s.owned == nil {
		return nil
	}
	return []string{s.owned.key()}
}

// repick reads the occupancy that a failed claim returned (reads' answers,
// in order) and picks a free slot of each scope at random. It returns the
// first scope that has none.
func (s slots) repick(resps []*pb.ResponseOp) *slotScope {
	for i, sc := range s.scopes() {
		taken := map[int64]bool{}
		if i < len(resps) {
			for _, kv := range resps[i].GetResponseRange().GetKvs() {
				if n, err := strconv.ParseInt(strings.TrimPrefix(string(kv.Key), sc.prefix), 10, 64); err == nil && n >= 0 && n < sc.size {
					taken[n] = true
				}
			}
		}
		sc.taken = int64(len(taken))
		free := sc.size - sc.taken
		if free <= 0 {
			return sc
		}
		// The k-th free slot, k at random.
		k := rand.Int64N(free)
		for n := int64(0); n < sc.size; n++ {
			if taken[n] {
				continue
			}
			if k == 0 {
				sc.at = n
				break
			}
			k--
		}
	}
	return nil
}

// refusal is the error of a join that found scope full (nil: it lost the
// race for a free slot maxSlotRounds times).
func (m *Manager) refusal(a *attempt, o acquireOptions, s slots, full *slotScope, holder func() int64) error {
	switch {
	case full == nil:
		return fmt.Errorf("%w: lock %q: every free slot of its limits was taken by a concurrent join, %d times; retry", ErrUnavailable, a.name, maxSlotRounds)
	case full == s.waiters && o.hasWait && o.wait == 0:
		return &NotGrantedError{Name: a.name, HolderToken: holder()} // a full queue has a holder
	case full == s.waiters:
		return &TooManyWaitersError{Name: a.name, Limit: m.maxWaiters}
	default:
		return &TooManyLocksError{Count: full.taken, Limit: m.maxOwned}
	}
}

// slotsDelete removes the slots of the entry of name with record rec, in
// the transaction that ends the entry.
func (m *Manager) slotsDelete(name string, rec record) []clientv3.Op {
	var out []clientv3.Op
	if rec.WaiterSlot > 0 {
		out = append(out, clientv3.OpDelete(m.ks.waiterSlots(name)+strconv.FormatInt(rec.WaiterSlot-1, 10)))
	}
	if rec.OwnedSlot > 0 && rec.Ident != "" {
		out = append(out, clientv3.OpDelete(m.ks.ownersOf(rec.Ident)+strconv.FormatInt(rec.OwnedSlot-1, 10)))
	}
	return out
}

// A scope seen full is checked by a read before the next join of it
// grants a lease: a flood of joins beyond a limit (one identity retrying in
// a loop, a crowd at a popular lock) then costs one read each, instead of a
// lease grant, a failed transaction and a revoke (three raft proposals). The
// read only refuses early; admission is still decided by the transaction.
// A hint lasts fullHintFor, so a scope that drained is soon joined without
// the read again.
const (
	fullHintFor  = time.Second
	maxFullHints = 4096
)

// fullHints remembers when scopes (by slot prefix) were last seen full.
type fullHints struct {
	mu sync.Mutex
	m  map[string]time.Time
}

func (h *fullHints) saw(prefix string, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil || len(h.m) >= maxFullHints {
		h.m = map[string]time.Time{}
	}
	h.m[prefix] = now
}

func (h *fullHints) recent(prefix string, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	at, ok := h.m[prefix]
	if ok && now.Sub(at) >= fullHintFor {
		delete(h.m, prefix)
		return false
	}
	return ok
}

// stillFull returns the first scope of s that was seen full recently and,
// read now, still is; nil if none (the join then proceeds).
func (m *Manager) stillFull(ctx context.Context, s slots) (*slotScope, error) {
	now := m.now()
	for _, sc := range s.scopes() {
		if !m.full.recent(sc.prefix, now) {
			continue
		}
		r, err := m.cli.Get(ctx, sc.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return nil, err
		}
		if r.Count >= sc.size {
			sc.taken = r.Count
			return sc, nil
		}
	}
	return nil, nil
}
