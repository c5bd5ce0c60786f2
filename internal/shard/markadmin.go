package shard

// The marks' admin calls on the shard-owner core (FenceService's GetMark,
// ListMarks, DeleteMark, RebindMark), with the queue core's contract
// (fence.Validator's: fence.ErrNoMark, field errors, ListMarks' order and
// pages, a delete freeing its place in its creator's cap, a rebind keeping
// the token).
//
//   - GetMark and ListMarks read etcd (linearizable), on any replica: every
//     mark is in etcd before an answer relies on it, and the owners' caches
//     only mirror etcd. A semaphore's binding (the resource's own key at
//     token 0, marks.go) is no mark: GetMark answers ErrNoMark and ListMarks
//     skips it.
//   - DeleteMark and RebindMark change a mark on the owner of its lock's
//     shard, the mark's only writer; elsewhere they fail with the
//     *NotServingError that names that owner (the server forwards them
//     there). The owner holds the mark's keys (markHold): decisions on them
//     wait, no raise of them is in flight (a raise is a put in the group
//     commit, which would undo the change), and the table is not reloaded
//     meanwhile. One Txn, guarded by the owner key and by the mark's mod
//     revision, then deletes the mark and lowers its creator's count (by a
//     compare on the count's mod revision: the cap stays exact), or rebinds
//     it; the cache learns what it wrote before any decision on the keys is
//     made again. A mark deleted, or rebound to another shard's lock, leaves
//     a floor (markEntry.staleBefore) under which reads of it are stale.
//   - Deleting a semaphore's last per-slot mark deletes its binding too, in
//     the same Txn (if the binding is still that lock's, raised by no
//     token, and no other slot's mark exists: a range compare), so that the
//     resource is free again, as a deleted mark's is. A binding takes no
//     place in the cap, so nothing more is lowered.
//   - No Txn writes one key twice (the mark, the count, the binding).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/fence"
	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// GetMark returns the mark id names, or fence.ErrNoMark.
func (o *Owner) GetMark(ctx context.Context, id fence.MarkID) (*fence.Mark, error) {
	mid, err := adminMarkID(id)
	if err != nil {
		return nil, err
	}
	m, err := o.readAdminMark(ctx, mid)
	if err != nil {
		return nil, err
	}
	return mid.mark(m.rec), nil
}

// ListMarks returns up to pageSize marks of resources whose names start
// with prefix, after the cursor pageToken, and the cursor of the next page
// ("" on the last), as fence.Validator.ListMarks: in the byte order of the
// escaped names, a slot's mark after its resource's ("db", "db%2Fa", then
// "db" slot 0, 1, 10, 2), bindings skipped. The pages are read at one
// revision.
func (o *Owner) ListMarks(ctx context.Context, prefix string, pageSize int, pageToken string) ([]fence.Mark, string, error) {
	if err := keyspace.ValidateName("prefix", prefix, true); err != nil {
		return nil, "", err
	}
	pageSize, err := keyspace.PageSize(pageSize)
	if err != nil {
		return nil, "", err
	}
	esc := keyspace.Escape(prefix)
	after, err := keyspace.DecodePageToken(pageToken, esc)
	if err != nil {
		return nil, "", err
	}
	base := o.marksPrefix() + esc
	from := base
	if after != "" {
		from = o.marksPrefix() + after + "\x00"
	}
	// One more than a page tells whether another page follows.
	p := keyspace.NewPager(o.cli, from, clientv3.GetPrefixRangeEnd(base), int64(pageSize)+1, keyspace.OneRevision())
	var (
		out  []fence.Mark
		last string
	)
	for p.Next(ctx) {
		for _, kv := range p.Page() {
			id, rec := o.markIDOf(string(kv.Key)), decodeRecord(kv)
			if !id.isMark(rec) {
				continue
			}
			if len(out) == pageSize {
				return out, keyspace.EncodePageToken(last), nil
			}
			out = append(out, *id.mark(rec))
			last = strings.TrimPrefix(string(kv.Key), o.marksPrefix())
		}
	}
	if err := p.Err(); err != nil {
		return nil, "", markErr(ctx, "list marks", err)
	}
	return out, "", nil
}

// DeleteMark removes the mark id names (fence.ErrNoMark if it has none),
// frees its place in its creator's cap, and returns it as it was; on the
// owner of its lock's shard (else *NotServingError). As on the queue core
// it lets no stale token through (a token whose grant has ended is refused
// by the lock check alone) and gives up the resource's ownership.
func (o *Owner) DeleteMark(ctx context.Context, id fence.MarkID) (*fence.Mark, error) {
	mid, err := adminMarkID(id)
	if err != nil {
		return nil, err
	}
	for range maxMarkAttempts {
		seen, err := o.readAdminMark(ctx, mid)
		if err != nil {
			return nil, err
		}
		m, done, err := o.deleteHeld(ctx, mid, seen)
		if err != nil || done {
			return m, err
		}
	}
	return nil, errMarkContention(mid)
}

// RebindMark gives the mark id names to lock (fence.ErrNoMark if it has
// none), keeping its token, and returns it after the change; on the owner
// of its present lock's shard (else *NotServingError). From then on only
// lock's tokens raise it, on the owner of lock's shard.
func (o *Owner) RebindMark(ctx context.Context, id fence.MarkID, lock string) (*fence.Mark, error) {
	mid, err := adminMarkID(id)
	if err != nil {
		return nil, err
	}
	if err := keyspace.ValidateName("lock", lock, false); err != nil {
		return nil, err
	}
	for range maxMarkAttempts {
		seen, err := o.readAdminMark(ctx, mid)
		if err != nil {
			return nil, err
		}
		if seen.rec.Lock == lock {
			return mid.mark(seen.rec), nil
		}
		m, done, err := o.rebindHeld(ctx, mid, seen, lock)
		if err != nil || done {
			return m, err
		}
	}
	return nil, errMarkContention(mid)
}

// adminMark is a mark as an admin call read it.
type adminMark struct {
	kv  *mvccpb.KeyValue
	rec markRecord
}

// readAdminMark reads the mark id names, or fence.ErrNoMark.
func (o *Owner) readAdminMark(ctx context.Context, id markID) (adminMark, error) {
	r, err := o.cli.Get(ctx, o.markKey(id))
	if err != nil {
		return adminMark{}, markErr(ctx, "read mark", err)
	}
	return id.found(r.Kvs)
}

// found is the mark of kvs (a Get of id's key), or fence.ErrNoMark.
func (id markID) found(kvs []*mvccpb.KeyValue) (adminMark, error) {
	if len(kvs) == 0 {
		return adminMark{}, id.noMark()
	}
	m := adminMark{kv: kvs[0], rec: decodeRecord(kvs[0])}
	if !id.isMark(m.rec) {
		return adminMark{}, id.noMark()
	}
	return m, nil
}

// deleteHeld deletes the mark seen (read as id's) on the owner of its
// lock's shard, holding its keys. done false: the mark changed since it
// was seen; read it again.
func (o *Owner) deleteHeld(ctx context.Context, id markID, seen adminMark) (_ *fence.Mark, done bool, _ error) {
	s := o.shards[o.ShardOf(seen.rec.Lock)]
	d := markDelete{id: id, key: o.markKey(id), countKey: o.markCountKey(seen.rec.Creator)}
	keys := []string{d.key}
	if id.perSlot {
		d.bindKey = o.markKey(markID{resource: id.resource})
		keys = append(keys, d.bindKey)
	}
	h, err := o.holdMarks(ctx, s, keys...)
	if err != nil {
		return nil, false, err
	}
	var after func()
	defer func() { o.releaseMarks(h, after) }()
	if err := o.readForDelete(ctx, &d); err != nil {
		return nil, false, err
	}
	if !d.mark.exists() {
		return nil, true, id.noMark()
	}
	if !o.local(s, d.mark.rec.Lock) || d.mark.rec.Creator != seen.rec.Creator {
		return nil, false, nil // rebound, or deleted and created again, meanwhile
	}
	cmps, ops := d.txn()
	ok, rev, err := o.changeTxn(ctx, h, cmps, ops)
	if err != nil || !ok {
		after = h.unknownIf(err)
		return nil, false, err
	}
	after = func() {
		s.forgetMark(d.key, rev)
		if d.dropBinding() {
			s.forgetMark(d.bindKey, rev)
		}
	}
	return id.mark(d.mark.rec), true, nil
}

// markDelete is what a delete reads under its hold, and decides on.
type markDelete struct {
	id       markID
	key      string
	countKey string
	bindKey  string // a per-slot mark's binding ("" for a plain mark)

	rev     int64     // the read's revision
	mark    adminMark // kv nil: none
	count   int64     // the creator's count
	countMR int64     // its mod revision (0: no count yet)
	binding adminMark // a per-slot mark's binding (kv nil: none)
	slots   int64     // a per-slot mark's resource's slot marks
	slotKey string    // their prefix
}

func (m adminMark) exists() bool { return m.kv != nil }

// readForDelete reads, in one request, the mark, its creator's count and,
// for a per-slot mark, its binding and how many slot marks the resource
// has.
func (o *Owner) readForDelete(ctx context.Context, d *markDelete) error {
	gets := []clientv3.Op{clientv3.OpGet(d.key), clientv3.OpGet(d.countKey)}
	if d.bindKey != "" {
		d.slotKey = d.bindKey + "/slot/"
		gets = append(gets, clientv3.OpGet(d.bindKey), clientv3.OpGet(d.slotKey, clientv3.WithPrefix(), clientv3.WithCountOnly()))
	}
	r, err := o.cli.Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return markErr(ctx, "read mark", err)
	}
	d.rev = r.Header.Revision
	if m, err := d.id.found(r.Responses[0].GetResponseRange().GetKvs()); err == nil {
		d.mark = m
	}
	if kvs := r.Responses[1].GetResponseRange().GetKvs(); len(kvs) > 0 {
		d.count, _ = strconv.ParseInt(string(kvs[0].Value), 10, 64) // only this package writes it
		d.countMR = kvs[0].ModRevision
	}
	if d.bindKey != "" {
		if kvs := r.Responses[2].GetResponseRange().GetKvs(); len(kvs) > 0 {
			d.binding = adminMark{kv: kvs[0], rec: decodeRecord(kvs[0])}
		}
		d.slots = r.Responses[3].GetResponseRange().GetCount()
	}
	return nil
}

// counted tells whether the mark takes a place in its creator's cap that
// the delete frees.
func (d *markDelete) counted() bool {
	r := d.mark.rec
	return !r.Uncounted && !r.Binding && r.Creator != "" && d.count > 0
}

// dropBinding tells whether the delete removes the resource's binding too:
// the mark is the last slot mark under a binding of its own lock that no
// token raised.
func (d *markDelete) dropBinding() bool {
	b := d.binding
	return d.bindKey != "" && b.exists() && b.rec.Lock == d.mark.rec.Lock && b.rec.Token == 0 && d.slots == 1
}

// txn is the delete's compares and writes, past the owner key's: the mark
// as read, the count as read if it is lowered, and for a dropped binding
// the binding as read and no slot mark changed or created since the read.
func (d *markDelete) txn() ([]clientv3.Cmp, []clientv3.Op) {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(d.key), "=", d.mark.kv.ModRevision)}
	ops := []clientv3.Op{clientv3.OpDelete(d.key)}
	if d.counted() {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(d.countKey), "=", d.countMR))
		ops = append(ops, clientv3.OpPut(d.countKey, strconv.FormatInt(d.count-1, 10)))
	}
	if d.dropBinding() {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(d.bindKey), "=", d.binding.kv.ModRevision),
			clientv3.Compare(clientv3.ModRevision(d.slotKey), "<", d.rev+1).WithPrefix())
		ops = append(ops, clientv3.OpDelete(d.bindKey))
	}
	return cmps, ops
}

// rebindHeld rebinds the mark seen (read as id's) to lock on the owner of
// its present lock's shard, holding its key. done false: the mark changed
// since it was seen; read it again.
func (o *Owner) rebindHeld(ctx context.Context, id markID, seen adminMark, lock string) (_ *fence.Mark, done bool, _ error) {
	s, key := o.shards[o.ShardOf(seen.rec.Lock)], o.markKey(id)
	h, err := o.holdMarks(ctx, s, key)
	if err != nil {
		return nil, false, err
	}
	var after func()
	defer func() { o.releaseMarks(h, after) }()
	m, err := o.readAdminMark(ctx, id)
	switch {
	case err != nil:
		return nil, true, err
	case !o.local(s, m.rec.Lock):
		return nil, false, nil // rebound meanwhile
	case m.rec.Lock == lock:
		return id.mark(m.rec), true, nil
	}
	// The token, its time and its creator stay: a rebind is no advance.
	rec := m.rec
	rec.Lock = lock
	value, _ := json.Marshal(rec) // plain fields: cannot fail
	ok, rev, err := o.changeTxn(ctx, h, []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", m.kv.ModRevision)},
		[]clientv3.Op{clientv3.OpPut(key, string(value))})
	if err != nil || !ok {
		after = h.unknownIf(err)
		return nil, false, err
	}
	after = func() {
		if o.local(s, lock) {
			o.cacheMark(s, key, markEntry{lock: lock, token: rec.Token, creator: rec.Creator, createRev: m.kv.CreateRevision,
				uncounted: rec.Uncounted || rec.Binding}, rev)
		} else {
			s.forgetMark(key, rev)
		}
	}
	return id.mark(rec), true, nil
}

// changeTxn commits an admin change: ops if the owner key is still the one
// h holds its keys under and cmps hold. ok false: a compare of cmps failed
// (read again); the owner key's failing is a *NotServingError.
func (o *Owner) changeTxn(ctx context.Context, h *markHold, cmps []clientv3.Cmp, ops []clientv3.Op) (ok bool, rev int64, err error) {
	ownerKey, term, owned := o.current().own.Guard(h.s.n)
	if !owned || term != h.term {
		return false, 0, o.lostDuringCall(h.s)
	}
	cmps = append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(ownerKey), "=", term)}, cmps...)
	tr, err := o.cli.Txn(ctx).If(cmps...).Then(ops...).Else(clientv3.OpGet(ownerKey)).Commit()
	if err != nil {
		return false, 0, markErr(ctx, "change mark", err)
	}
	if tr.Succeeded {
		return true, tr.Header.Revision, nil
	}
	if kvs := tr.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 0 || kvs[0].CreateRevision != term {
		return false, 0, o.lostDuringCall(h.s)
	}
	return false, 0, nil
}

// markHold is an admin change's hold on mark keys of one shard (see the
// top of this file). It counts as a unit in flight, so a table dropped
// meanwhile is loaded again only once the hold ends, from what etcd holds
// then.
type markHold struct {
	s    *shardState
	keys []string
	gen  uint64
	term int64
	done chan struct{} // closed when the hold ends
	// failed: the change's Txn failed, its outcome unknown: the table is
	// dropped when the hold ends (see unknownIf).
	failed bool
}

// holdMarks holds keys on s once no other change holds one of them, then
// waits until no raise of them is in flight. A shard not served here, or
// dropped meanwhile: *NotServingError.
func (o *Owner) holdMarks(ctx context.Context, s *shardState, keys ...string) (*markHold, error) {
	for {
		s.mu.Lock()
		if err := o.serving(s); err != nil {
			s.mu.Unlock()
			return nil, err
		}
		if ch := s.changeOf(keys...); ch != nil {
			s.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		h := &markHold{s: s, keys: keys, gen: s.gen, term: s.term, done: make(chan struct{})}
		for _, k := range keys {
			e, ok := s.marks[k]
			if !ok {
				e.unknown = true
			}
			e.change = h.done
			s.setMark(k, e)
		}
		s.inflight++
		s.mu.Unlock()
		if err := o.awaitRaises(ctx, h); err != nil {
			o.releaseMarks(h, nil)
			return nil, err
		}
		return h, nil
	}
}

// raisePoll is how often a hold looks whether the raises of its keys in
// flight are done (each is one group commit: about a millisecond here).
const raisePoll = time.Millisecond

// awaitRaises waits until no raise of h's keys is in flight.
func (o *Owner) awaitRaises(ctx context.Context, h *markHold) error {
	s := h.s
	for {
		s.mu.Lock()
		dropped, busy := s.gen != h.gen, false
		for _, k := range h.keys {
			busy = busy || s.marks[k].raising > 0
		}
		s.mu.Unlock()
		switch {
		case dropped:
			return o.lostDuringCall(s)
		case !busy:
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(raisePoll):
		}
	}
}

// unknownIf marks the hold failed if err is the change Txn's own failure
// (not a refusal: those wrote nothing). It returns no cache update.
func (h *markHold) unknownIf(err error) func() {
	var ns *NotServingError
	if err != nil && !errors.As(err, &ns) {
		h.failed = true
	}
	return nil
}

// releaseMarks ends the hold: the cache learns the change (after, if the
// table is still the one the hold was taken on), the keys are free, and a
// table dropped meanwhile is loaded again. After a Txn of unknown outcome
// the table is dropped, as after a unit's (serve.go): the next one reads
// every mark from etcd.
func (o *Owner) releaseMarks(h *markHold, after func()) {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gen == h.gen {
		if h.failed {
			o.log.Warn("shard: an admin change of a mark failed, its outcome unknown; the shard reloads from etcd", "shard", s.n)
			o.drop(s)
		} else if after != nil {
			after()
		}
	}
	for _, k := range h.keys {
		if e, ok := s.marks[k]; ok && e.change == h.done {
			e.change = nil
			s.setMark(k, e)
		}
	}
	close(h.done)
	s.inflight--
	if s.inflight == 0 && s.tab == nil {
		o.startLoad(s)
	}
}

// adminMarkID is the markID of id, or the field error of a malformed one.
func adminMarkID(id fence.MarkID) (markID, error) {
	if err := keyspace.ValidateName("resource", id.Resource, false); err != nil {
		return markID{}, err
	}
	if id.Slot < 0 {
		return markID{}, keyspace.FieldErr("slot", "is %d; a semaphore's slots are numbered from 0", id.Slot)
	}
	return markID{resource: id.Resource, perSlot: id.PerSlot, slot: id.Slot}, nil
}

// markIDOf names the mark whose key is key.
func (o *Owner) markIDOf(key string) markID {
	esc, slot, perSlot := strings.Cut(strings.TrimPrefix(key, o.marksPrefix()), "/slot/")
	id := markID{resource: keyspace.Unescape(esc), perSlot: perSlot}
	if perSlot {
		n, _ := strconv.ParseInt(slot, 10, 32) // markKey wrote a number
		id.slot = int32(n)
	}
	return id
}

// isMark tells whether r, stored at id's key, is a mark: not a binding (a
// resource's own key that no token raised).
func (id markID) isMark(r markRecord) bool { return id.perSlot || r.Token > 0 }

// mark is the fence.Mark of r, stored at id's key.
func (id markID) mark(r markRecord) *fence.Mark {
	m := &fence.Mark{MarkID: fence.MarkID{Resource: id.resource, PerSlot: id.perSlot, Slot: id.slot}, Token: r.Token, Lock: r.Lock}
	if r.At != 0 {
		m.UpdatedAt = time.Unix(0, r.At)
	}
	return m
}

// noMark is fence.ErrNoMark for id, as the queue core words it.
func (id markID) noMark() error {
	if id.perSlot {
		return fmt.Errorf("%w (resource %q, semaphore slot %d)", fence.ErrNoMark, id.resource, id.slot)
	}
	return fmt.Errorf("%w (resource %q; a semaphore's holders raise one mark per slot: name the slot for those)", fence.ErrNoMark, id.resource)
}

// errMarkContention: an admin change found the mark changed on every try.
func errMarkContention(id markID) error {
	return fmt.Errorf("%w: the mark of resource %q kept changing; retry", lease.ErrUnavailable, id.resource)
}
