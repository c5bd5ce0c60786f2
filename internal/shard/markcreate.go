package shard

// Creating a resource's first mark (and a semaphore's binding with its
// first slot mark): a Txn of its own, guarded by the owner key, that fails
// if another lock took the resource first or the identity's count moved;
// and the reads behind a decision.

import (
	"context"
	"hash/fnv"
	"strconv"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/etcdx"
	"github.com/coordinatord/coordinatord/internal/fence"
)

// createMark creates a mark, p.create, in a Txn of its own guarded by the
// owner key (the term p was decided in), by the mark's absence, by a
// per-slot mark's binding (absent, and created with it: p.bind; or the one
// read: p.bindRev) and by the creator's count, which it raises by one (the
// cap is exact across replicas and shards). It answers (verdict or error),
// or returns the read to decide again with (the mark or its binding exists
// now, or the count moved).
func (o *Owner) createMark(ctx context.Context, s *shardState, c MarkCheck, p markPlan) (fence.Verdict, *markRead, error) {
	next := *p.create
	release, err := o.creating.acquire(ctx, next.creator)
	if err != nil {
		return fence.Verdict{}, nil, err
	}
	defer release()
	countKey := o.markCountKey(next.creator)
	gets := []clientv3.Op{clientv3.OpGet(p.key), clientv3.OpGet(countKey)}
	if p.bindKey != "" {
		gets = append(gets, clientv3.OpGet(p.bindKey))
	}
	r, err := o.cli.Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return fence.Verdict{}, nil, markErr(ctx, "read mark count", err)
	}
	markKVs := r.Responses[0].GetResponseRange().GetKvs()
	var bindKVs []*mvccpb.KeyValue
	if p.bindKey != "" {
		bindKVs = r.Responses[2].GetResponseRange().GetKvs()
	}
	if len(markKVs) > 0 || (p.bindKey != "" && !sameBinding(bindKVs, p)) { // created while this one waited its turn
		o.forgetBinding(s, p, bindKVs)
		read := &markRead{gen: p.gen, rev: r.Header.Revision}
		read.add(p.key, markKVs)
		if p.bindKey != "" {
			read.add(p.bindKey, bindKVs)
		}
		return fence.Verdict{}, read, nil
	}
	var n, countMR int64
	if kvs := r.Responses[1].GetResponseRange().GetKvs(); len(kvs) > 0 {
		n, _ = strconv.ParseInt(string(kvs[0].Value), 10, 64) // only this code writes it
		countMR = kvs[0].ModRevision
	}
	if limit := o.markLimit(); limit > 0 && n >= limit {
		return fence.Verdict{}, nil, &fence.TooManyMarksError{Count: n, Limit: limit}
	}
	ownerKey, term, ok := o.current().own.Guard(s.n)
	if !ok || term != p.term {
		return fence.Verdict{}, nil, o.lostDuringCall(s)
	}
	if testHookBeforeCreate != nil {
		testHookBeforeCreate()
	}
	now := o.clock.Now()
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(ownerKey), "=", term),
		clientv3.Compare(clientv3.CreateRevision(p.key), "=", 0),
		clientv3.Compare(clientv3.ModRevision(countKey), "=", countMR),
	}
	puts := []clientv3.Op{
		clientv3.OpPut(p.key, next.record(p.id, now)),
		clientv3.OpPut(countKey, strconv.FormatInt(n+1, 10)),
	}
	elses := []clientv3.Op{clientv3.OpGet(ownerKey), clientv3.OpGet(p.key)}
	if p.bindKey != "" {
		if p.bind != nil {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(p.bindKey), "=", 0))
			puts = append(puts, clientv3.OpPut(p.bindKey, p.bind.record(markID{resource: p.id.resource}, now)))
		} else {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(p.bindKey), "=", p.bindRev))
		}
		elses = append(elses, clientv3.OpGet(p.bindKey))
	}
	tr, err := o.cli.Txn(ctx).If(cmps...).Then(puts...).Else(elses...).Commit()
	if err != nil {
		return fence.Verdict{}, nil, markErr(ctx, "create mark", err)
	}
	if tr.Succeeded {
		next.createRev = tr.Header.Revision
		s.mu.Lock()
		if s.gen == p.gen {
			o.cacheMark(s, p.key, next, tr.Header.Revision)
			if p.bind != nil {
				b := *p.bind
				b.createRev = tr.Header.Revision
				o.cacheMark(s, p.bindKey, b, tr.Header.Revision)
			}
		}
		s.mu.Unlock()
		v := p.verdict
		v.Mark = next.token
		return v, nil, nil
	}
	if kvs := tr.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 0 || kvs[0].CreateRevision != term {
		return fence.Verdict{}, nil, o.lostDuringCall(s)
	}
	read := &markRead{gen: p.gen, rev: tr.Header.Revision}
	read.add(p.key, tr.Responses[1].GetResponseRange().GetKvs())
	if p.bindKey != "" {
		bindKVs := tr.Responses[2].GetResponseRange().GetKvs()
		o.forgetBinding(s, p, bindKVs)
		read.add(p.bindKey, bindKVs)
	}
	return fence.Verdict{}, read, nil
}

// forgetBinding drops a cached binding that is not the one in etcd (kvs, a
// Get of p.bindKey): a binding of this shard's lock is deleted or rebound
// only here, and the cache learns it then (markadmin.go), so only a key
// removed and created again behind its back can make it stale; the next
// decision then judges by the read instead of deciding on it again.
func (o *Owner) forgetBinding(s *shardState, p markPlan, kvs []*mvccpb.KeyValue) {
	if p.bind != nil || sameBinding(kvs, p) {
		return
	}
	s.mu.Lock()
	if b, ok := s.marks[p.bindKey]; ok && !b.unknown && s.gen == p.gen && b.createRev == p.bindRev {
		s.setMark(p.bindKey, markEntry{unknown: true, staleBefore: b.staleBefore, raising: b.raising, change: b.change})
	}
	s.mu.Unlock()
}

// sameBinding reports whether kvs (a Get of p.bindKey) is still the
// binding p was decided with: none when p creates it, else the one of
// create revision p.bindRev.
func sameBinding(kvs []*mvccpb.KeyValue, p markPlan) bool {
	if p.bind != nil {
		return len(kvs) == 0
	}
	return len(kvs) > 0 && kvs[0].CreateRevision == p.bindRev
}

// readMarks reads the marks at keys (linearizable, in one request) for the
// table generation gen.
func (o *Owner) readMarks(ctx context.Context, gen uint64, keys []string) (markRead, error) {
	read := markRead{gen: gen}
	if len(keys) == 1 {
		r, err := o.cli.Get(ctx, keys[0])
		if err != nil {
			return read, markErr(ctx, "read mark", err)
		}
		read.rev = r.Header.Revision
		read.add(keys[0], r.Kvs)
		return read, nil
	}
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpGet(k)
	}
	r, err := o.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return read, markErr(ctx, "read mark", err)
	}
	read.rev = r.Header.Revision
	for i, k := range keys {
		read.add(k, r.Responses[i].GetResponseRange().GetKvs())
	}
	return read, nil
}

// lostDuringCall refuses a call whose shard this replica stopped owning
// while it ran; nothing was written, so it is safe to retry (on the new
// owner).
func (o *Owner) lostDuringCall(s *shardState) error {
	return &NotServingError{Shard: s.n, Reason: "this member lost the shard during the call; nothing was written"}
}

// markErr is an etcd error of a mark's read or write, or ctx's.
func markErr(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return etcdx.Classify("shard: "+op, err)
}

// markCreators serialises, within one replica, the creations of marks by
// one identity (as fence's creators): they all compare and raise one
// counter, so concurrent ones would mostly lose and retry. Identities are
// striped over a fixed set of slots.
type markCreators struct {
	once  sync.Once
	slots [64]chan struct{}
}

// acquire takes the slot of the identity of hash ih, or fails when ctx
// ends first.
func (c *markCreators) acquire(ctx context.Context, ih string) (release func(), err error) {
	c.once.Do(func() {
		for i := range c.slots {
			c.slots[i] = make(chan struct{}, 1)
		}
	})
	h := fnv.New32a()
	h.Write([]byte(ih))
	slot := c.slots[h.Sum32()%uint32(len(c.slots))]
	select {
	case slot <- struct{}{}:
		return func() { <-slot }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
