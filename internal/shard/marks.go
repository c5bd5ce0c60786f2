package shard

// Resource marks on the shard-owner core: ValidateToken with a resource,
// with the queue core's contract (internal/fence: verdicts, MarkOwnedError,
// SharedHolderError, TooManyMarksError).
//
//   - A mark lives at one global key per resource,
//     <prefix>shards/marks/<escaped resource>, and a semaphore's per-slot
//     marks at that key + "/slot/<n>" (an escaped resource holds no '/',
//     so neither is ever another's). Its value is a markRecord: the lock
//     it is bound to, the greatest token accepted, and who created it.
//   - The resource's own key is its binding for every mark of it: one lock
//     owns a resource, across its own mark and its per-slot marks. A
//     per-slot mark needs the resource's key bound to the same lock; the
//     first one creates that key too, in the same Txn, as a binding (token
//     0, Binding): a per-slot mark and its binding are one mark, counted
//     once. A lock's plain mark on a binding of its own raises it (a lock
//     may be a semaphore, then a mutex once free; the mark stays uncounted,
//     Uncounted); a lock's per-slot mark
//     on its own plain mark keeps it as the binding. Any other lock, plain
//     or per-slot, is refused by the resource's key (MarkOwnedError), so
//     a semaphore cannot get around a mutex's mark, nor the reverse.
//   - Its only writer is the owner of the shard of the lock it is bound
//     to: the mark travels with that lock's shard (an admin's rebind moves
//     it to another lock's, and an admin's delete ends it: markadmin.go).
//     It is created by a dedicated Txn guarded by that owner's key and by
//     CreateRevision(mark) == 0 (so of two locks, in two shards, racing to
//     create it, one wins and the other then reads a mark of another
//     lock), and a per-slot mark's also by its binding: CreateRevision of
//     the resource's key == 0 when it creates the binding, == the create
//     revision it read (the same binding) otherwise; it is raised by a
//     unit of that shard through the committer, guarded by the owner key
//     like every write of the shard, in order with the shard's grants and
//     releases.
//   - Validation runs on the owner of the lock's shard (calls are routed by
//     name): under the shard's mutex the table's verdict, then the mark (a
//     per-slot mark's binding first, then the mark).
//     A mark that exists and is bound to a lock of the shard is cached per
//     shard (shardState.marks) and read from etcd (linearizable) only on a
//     miss; the cache is cleared when the table is dropped, so a new table
//     (a takeover, a reload) reads every mark again. A binding is cached as
//     a mark (a cached validation of a per-slot mark sends nothing to etcd
//     either). Nothing else is cached: a mark that does not exist may be
//     created by another shard's lock at any time, and one bound to another
//     shard's lock may be deleted or rebound by that lock's owner
//     (markadmin.go), so a refusal by another shard's mark is read each
//     time. A mark bound to a lock of this shard changes only here: raised,
//     or deleted or rebound by an admin (markadmin.go), which holds the
//     mark's keys so that no decision on them is made and no raise of them
//     is in flight meanwhile, and leaves the cache what it wrote.
//   - A valid answer with a token above the mark is given only once the
//     raised (or created) mark is in etcd.
//
// Tokens in marks are wire tokens (keyspace.TokenOf: the epoch above the
// create revision; the create revision itself while the cluster was never
// restored), so that a token of an earlier epoch is below every mark of a
// later one, as on the queue core.

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/coordinatord/coordinatord/internal/fence"
	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/locktable"
)

// MarkCheck is one validation against a resource.
type MarkCheck struct {
	Name  string
	Token int64 // the caller's token, its epoch in the high bits
	// Epoch is the current token epoch: a token of another holds nothing.
	Epoch    int64
	Resource string
	// Identity is the caller's authenticated identity ("" without
	// authentication: every unauthenticated caller is one identity). The
	// marks it creates count against its cap (WithMarkLimit).
	Identity string
}

// markEntry is a cached mark: one that exists, bound to a lock of the
// shard. Or, unknown, only the bookkeeping of its key (an admin change's
// hold, raises in flight, a floor under which reads are stale): the key
// is then read from etcd.
type markEntry struct {
	lock    string // the lock it is bound to
	token   int64  // the greatest token accepted (a wire token); 0: a binding only
	creator string // the creating identity's hash, kept on every raise
	// createRev is the key's create revision: a per-slot mark's creation
	// compares its binding's (still the binding it read).
	createRev int64
	// uncounted: a binding, or a mark raised from one: it takes no place in
	// its creator's cap (its per-slot mark does), so deleting it frees none.
	uncounted bool

	// unknown: the entry caches no mark, only the fields below.
	unknown bool
	// staleBefore: the mark was last deleted here, or rebound to another
	// shard's lock, at this revision; what a read or a write older than it
	// says of the key is not believed (0: never).
	staleBefore int64
	// raising counts the raises of the key submitted and not yet done: an
	// admin change waits until none is in flight (a raise is a put that
	// would undo it).
	raising int
	// change, while an admin change holds the key (markadmin.go), is closed
	// when the change ends; no decision on the key is made until then.
	change chan struct{}
}

// markRecord is a mark's stored value.
type markRecord struct {
	Lock    string `json:"lock"`
	Token   int64  `json:"token"`           // wire token
	Epoch   int64  `json:"epoch,omitempty"` // Token's epoch, for readers
	Slot    int32  `json:"slot,omitempty"`
	PerSlot bool   `json:"perSlot,omitempty"` // a semaphore slot's mark
	// Binding: the resource's own key binds it to Lock for Lock's per-slot
	// marks, and no token has raised it yet (Token 0).
	Binding bool `json:"binding,omitempty"`
	// Uncounted: a binding, or a mark raised from one (markEntry.uncounted).
	Uncounted bool   `json:"uncounted,omitempty"`
	At        int64  `json:"at"`           // unix ns of the last raise (owner's clock)
	Creator   string `json:"ih,omitempty"` // keyspace.IdentityHash of the creator
}

// markID names a mark: a resource's own, or one semaphore slot's.
type markID struct {
	resource string
	perSlot  bool
	slot     int32
}

// marksPrefix is where the marks live.
func (o *Owner) marksPrefix() string { return o.prefix + "shards/marks/" }

// markKey is the etcd key of the mark id names.
func (o *Owner) markKey(id markID) string {
	k := o.marksPrefix() + keyspace.Escape(id.resource)
	if id.perSlot {
		k += "/slot/" + strconv.Itoa(int(id.slot))
	}
	return k
}

// markCountKey counts the marks the identity of hash ih created.
func (o *Owner) markCountKey(ih string) string { return o.prefix + "shards/markcounts/" + ih }

// markLimit is the cap on one identity's marks (0: none).
func (o *Owner) markLimit() int64 {
	if o.cfg.markLimit == nil {
		return fence.DefaultMarkLimit
	}
	return *o.cfg.markLimit
}

func (e markEntry) record(id markID, at time.Time) string {
	ep, _ := keyspace.SplitToken(e.token)
	b, _ := json.Marshal(markRecord{Lock: e.lock, Token: e.token, Epoch: ep, Slot: id.slot, PerSlot: id.perSlot,
		Binding: !id.perSlot && e.token == 0, Uncounted: e.uncounted, At: at.UnixNano(), Creator: e.creator}) // plain fields: cannot fail
	return string(b)
}

// decodeRecord is a stored mark's value; a foreign value reads as a zero
// mark bound to no lock (every lock is refused, as on the queue core).
func decodeRecord(kv *mvccpb.KeyValue) markRecord {
	var r markRecord
	_ = json.Unmarshal(kv.Value, &r)
	return r
}

// decodeMark is the entry of a stored mark.
func decodeMark(kv *mvccpb.KeyValue) markEntry {
	r := decodeRecord(kv)
	return markEntry{lock: r.Lock, token: r.Token, creator: r.Creator, createRev: kv.CreateRevision, uncounted: r.Uncounted || r.Binding}
}

// local tells whether lock is of the shard s.
func (o *Owner) local(s *shardState, lock string) bool { return o.ShardOf(lock) == s.n }

// cacheMark records e, read or written at revision at, as the mark at key
// (under s.mu), keeping the key's bookkeeping; unless e is bound to
// another shard's lock (never cached), at predates a change made here
// (staleBefore), or the cache holds a greater token of the same lock.
func (o *Owner) cacheMark(s *shardState, key string, e markEntry, at int64) {
	old, ok := s.marks[key]
	switch {
	case !o.local(s, e.lock):
		return
	case ok && at < old.staleBefore:
		return
	case ok && !old.unknown && old.lock == e.lock && old.token >= e.token:
		return
	}
	e.staleBefore, e.raising, e.change = old.staleBefore, old.raising, old.change
	s.setMark(key, e)
}

// forgetMark uncaches the mark at key (under s.mu): an admin deleted it, or
// rebound it to another shard's lock, at revision rev; a read of it older
// than rev is not believed from now on. The key's bookkeeping stays.
func (s *shardState) forgetMark(key string, rev int64) {
	old := s.marks[key]
	s.setMark(key, markEntry{unknown: true, staleBefore: max(rev, old.staleBefore), raising: old.raising, change: old.change})
}

// setMark stores the entry at key (under s.mu); an unknown entry with
// nothing to keep is removed.
func (s *shardState) setMark(key string, e markEntry) {
	if e.unknown && e.staleBefore == 0 && e.raising == 0 && e.change == nil {
		delete(s.marks, key)
		return
	}
	if s.marks == nil {
		s.marks = map[string]markEntry{}
	}
	s.marks[key] = e
}

// raiseStarted and raiseEnded count a raise of the mark at key in flight
// (under s.mu).
func (s *shardState) raiseStarted(key string) {
	e, ok := s.marks[key]
	if !ok {
		e.unknown = true // never so: a raise is decided on a cached mark
	}
	e.raising++
	s.setMark(key, e)
}

func (s *shardState) raiseEnded(key string) {
	if e, ok := s.marks[key]; ok && e.raising > 0 {
		e.raising--
		s.setMark(key, e)
	}
}

// changeOf is the end of an admin change holding one of keys ("" ignored),
// nil if none does (under s.mu).
func (s *shardState) changeOf(keys ...string) chan struct{} {
	for _, k := range keys {
		if e, ok := s.marks[k]; ok && k != "" && e.change != nil {
			return e.change
		}
	}
	return nil
}

// markRead is a read of marks from etcd, for the table generation gen, at
// the revision rev.
type markRead struct {
	gen uint64
	rev int64
	got []markGot // every key read, whether or not its mark exists
}

// markGot is one key of a markRead.
type markGot struct {
	key    string
	exists bool
	entry  markEntry
}

// of is what the read says of key, if it read key for the generation gen.
func (r *markRead) of(key string, gen uint64) (markGot, bool) {
	if r.gen != gen {
		return markGot{}, false
	}
	for _, g := range r.got {
		if g.key == key {
			return g, true
		}
	}
	return markGot{}, false
}

// add records the mark at key: kvs is a Get's answer.
func (r *markRead) add(key string, kvs []*mvccpb.KeyValue) {
	g := markGot{key: key}
	if len(kvs) > 0 {
		g.exists, g.entry = true, decodeMark(kvs[0])
	}
	r.got = append(r.got, g)
}

// markAt is the mark at key (under s.mu): cached, else what read says of
// it for this table generation (cached then, if it exists and is bound to
// a lock of the shard), unless read predates a change made here; known
// false: it must be read.
func (o *Owner) markAt(s *shardState, key string, read *markRead) (m markEntry, exists, known bool) {
	c, cached := s.marks[key]
	if cached && !c.unknown {
		return c, true, true
	}
	g, ok := read.of(key, s.gen)
	if !ok || (cached && read.rev < c.staleBefore) {
		return markEntry{}, false, false
	}
	if !g.exists {
		return markEntry{}, false, true
	}
	o.cacheMark(s, key, g.entry, read.rev)
	return g.entry, true, true
}

// markPlan is what one decision under the shard's mutex leaves to do.
type markPlan struct {
	verdict fence.Verdict
	err     error
	done    bool // answer verdict, err
	key     string
	gen     uint64
	term    int64
	read    []string     // read these marks from etcd, then decide again
	create  *markEntry   // create the mark (no mark yet): createMark
	raised  <-chan error // a raise was submitted: its outcome
	// wait: an admin's change holds the mark (markadmin.go); decide again
	// once it ends.
	wait <-chan struct{}
	id   markID
	// bindKey is a per-slot mark's binding, the resource's own key ("" for
	// a plain mark, which is its own binding). Creating the per-slot mark
	// creates the binding too (bind, when there is none), or compares its
	// create revision (bindRev, when there is one).
	bindKey string
	bind    *markEntry
	bindRev int64
}

// testHookBeforeCreate, if set, runs just before a mark's creating Txn
// (tests make two creations race there).
var testHookBeforeCreate func()

// maxMarkAttempts bounds the decisions of one validation: each further one
// follows a read (one per table generation, or per admin change of the
// mark), an admin's change of the mark, or a creation lost to another (a
// lock of another shard took the resource: answered next; or the same
// identity created another mark on another replica: progress, bounded by
// its cap).
const maxMarkAttempts = 64

// ValidateResource judges c.Token for c.Name against c.Resource's mark, as
// fence.Validator.Validate does on the queue core: a token below the mark
// is Fenced; a mark bound to another lock refuses with a
// *fence.MarkOwnedError, a reader's token with a *fence.SharedHolderError;
// a current token above the mark raises it (creating it counts against
// the caller's cap: *fence.TooManyMarksError beyond) before the answer.
// The verdict's CurrentToken is a create revision (as Validate's), its
// Mark a wire token. A shard not served here: *NotServingError.
func (o *Owner) ValidateResource(ctx context.Context, c MarkCheck) (fence.Verdict, error) {
	s := o.shards[o.ShardOf(c.Name)]
	var read markRead
	for range maxMarkAttempts {
		if err := ctx.Err(); err != nil {
			return fence.Verdict{}, err
		}
		s.mu.Lock()
		p := o.decideMark(s, c, read)
		s.mu.Unlock()
		switch {
		case p.done:
			return p.verdict, p.err
		case p.wait != nil:
			select {
			case <-p.wait:
			case <-ctx.Done():
				return fence.Verdict{}, ctx.Err()
			}
		case p.raised != nil:
			select {
			case err := <-p.raised:
				if err != nil {
					return fence.Verdict{}, err
				}
				return p.verdict, nil
			case <-ctx.Done():
				return fence.Verdict{}, ctx.Err()
			}
		case p.create != nil:
			v, r, err := o.createMark(ctx, s, c, p)
			if err != nil || r == nil {
				return v, err
			}
			read = *r // the mark or its binding exists now, or the count moved: decide again
		case len(p.read) > 0:
			r, err := o.readMarks(ctx, p.gen, p.read)
			if err != nil {
				return fence.Verdict{}, err
			}
			read = r
		}
	}
	return fence.Verdict{}, fmt.Errorf("%w: too much contention on the mark of resource %q; retry", lease.ErrUnavailable, c.Resource)
}

// decideMark is one decision under s.mu: the table's verdict, then the
// mark (cached, or the read if it is of this table), and what to do.
func (o *Owner) decideMark(s *shardState, c MarkCheck, read markRead) markPlan {
	if err := o.serving(s); err != nil {
		return markPlan{done: true, err: err}
	}
	te, rev := keyspace.SplitToken(c.Token)
	inEpoch := te == c.Epoch
	v := s.tab.Validate(c.Name, rev)
	var hold locktable.Hold
	if inEpoch {
		hold = s.tab.HoldOf(c.Name, rev)
	} else { // a token of another epoch holds nothing now
		v = locktable.Verdict{Reason: locktable.Superseded, CurrentToken: v.CurrentToken}
		if v.CurrentToken == 0 {
			v.Reason = locktable.NotHeldNow
		}
	}
	id := markID{resource: c.Resource}
	oldest := hold.Oldest
	switch {
	case v.Valid && hold.Holder.Shared:
		return markPlan{done: true, err: &fence.SharedHolderError{Name: c.Name, Resource: c.Resource, Token: c.Token}}
	case v.Valid && hold.Holder.Limit > 1:
		id.perSlot, id.slot = true, hold.Holder.Slot
	case !v.Valid && oldest.Token != 0 && (oldest.Shared || oldest.Limit > 1) && rev >= oldest.Token:
		// As the queue core: a token at or after the oldest holder of a
		// readers' or a semaphore's queue that holds nothing is judged
		// among the holders, without a mark (whose slot it had is unknown).
		return markPlan{done: true, verdict: judgeMark(c.Token, rev, v, 0)}
	}
	key := o.markKey(id)
	var (
		bindKey string
		bind    markEntry
		bound   bool // a per-slot mark's binding exists (bind)
	)
	if id.perSlot {
		bindKey = o.markKey(markID{resource: c.Resource})
	}
	if ch := s.changeOf(key, bindKey); ch != nil {
		return markPlan{wait: ch}
	}
	if id.perSlot {
		// The binding first: a resource bound to another lock refuses
		// every per-slot mark of this one, whatever exists at its slot.
		b, exists, known := o.markAt(s, bindKey, &read)
		if !known {
			return markPlan{read: []string{bindKey, key}, gen: s.gen}
		}
		if exists && b.lock != c.Name {
			return markPlan{done: true, err: &fence.MarkOwnedError{Resource: c.Resource, Lock: c.Name, Owner: b.lock}}
		}
		bind, bound = b, exists
	}
	m, exists, known := o.markAt(s, key, &read)
	if !known {
		if !id.perSlot || bound {
			return markPlan{read: []string{key}, gen: s.gen}
		}
		return markPlan{read: []string{bindKey, key}, gen: s.gen}
	}
	if exists && m.lock != c.Name {
		return markPlan{done: true, err: &fence.MarkOwnedError{Resource: c.Resource, Lock: c.Name, Owner: m.lock}}
	}
	verdict := judgeMark(c.Token, rev, v, m.token)
	if !verdict.Valid || c.Token == m.token {
		return markPlan{done: true, verdict: verdict} // refused, or the same holder again: nothing to write
	}
	next := markEntry{lock: c.Name, token: c.Token, creator: m.creator, createRev: m.createRev, uncounted: m.uncounted}
	if !exists {
		next.creator = keyspace.IdentityHash(c.Identity)
		p := markPlan{create: &next, verdict: verdict, key: key, gen: s.gen, term: s.term, id: id, bindKey: bindKey}
		switch {
		case id.perSlot && bound:
			p.bindRev = bind.createRev
		case id.perSlot:
			p.bind = &markEntry{lock: c.Name, creator: next.creator, uncounted: true}
		}
		return p
	}
	verdict.Mark = c.Token
	return markPlan{raised: o.raiseMark(s, id, key, next), verdict: verdict}
}

// raiseMark submits the raise of the cached mark at key to next (under
// s.mu), counted in flight until it is done (an admin change waits for
// it), and returns its outcome.
func (o *Owner) raiseMark(s *shardState, id markID, key string, next markEntry) <-chan error {
	ch := make(chan error, 1)
	ops := []Op{{Key: key, Value: next.record(id, o.clock.Now()), Conflict: key}}
	s.raiseStarted(key)
	o.submitOwn(s, ops, func(rev int64, err error, current bool) {
		if current {
			s.raiseEnded(key)
			if err == nil {
				o.cacheMark(s, key, next, rev)
			}
		}
		ch <- err
	})
	return ch
}

// judgeMark is the verdict for token (of revision rev) given the table's
// verdict v and the mark (0: none), as fence's judge: below the mark is
// Fenced whatever the lock's state.
func judgeMark(token, rev int64, v locktable.Verdict, mark int64) fence.Verdict {
	switch {
	case token < mark:
		return fence.Verdict{Reason: fence.Fenced, CurrentToken: v.CurrentToken, Mark: mark}
	case v.Valid:
		return fence.Verdict{Valid: true, Reason: fence.Current, CurrentToken: rev, Mark: mark}
	case v.Reason == locktable.Superseded:
		return fence.Verdict{Reason: fence.Superseded, CurrentToken: v.CurrentToken, Mark: mark}
	}
	return fence.Verdict{Reason: fence.NotHeld, CurrentToken: v.CurrentToken, Mark: mark}
}
