package lease

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/etcdx"
)

// The join's transaction: how it is built, committed and read.

// joinAnswer is a committed join transaction's answer, with how to read it
// and the entry's record had the lock been free (held).
type joinAnswer struct {
	res   txnRes
	shape joinShape
	held  record
}

// commitJoin commits the join, claiming a free slot of each limit
// (limits.go): a slot lost to a concurrent join is picked again among the
// free ones. When a limit is full it writes nothing and fails with the
// limit's refusal.
func (m *Manager) commitJoin(ctx context.Context, a *attempt, o acquireOptions, sl slots) (joinAnswer, error) {
	for round := 1; ; round++ {
		sl.stamp(&a.rec)
		held := a.rec
		held.Acquired = a.rec.Since
		res, shape := m.joinTxn(ctx, a, o, sl, held)
		ans := joinAnswer{res: res, shape: shape, held: held}
		if res.err != nil || res.ok || !shape.nested || shape.guardFailed(res) {
			return ans, nil
		}
		if full := sl.repick(res.resps[shape.slotReads():]); full != nil || round == maxSlotRounds {
			if full != nil {
				m.full.saw(full.prefix, m.now())
			}
			m.discard(a)
			return ans, m.refusal(a, o, sl, full, func() int64 { return m.holderToken(ctx, a.name) })
		}
	}
}

// joinShape says how a join transaction's answer reads. Without a guard or
// a limit it is flat: If(free) Then(hold) Else(queue). Otherwise the outer
// transaction compares the guard (the request record's or the session
// key's absence) and the limit slots' absence; its Then nests the flat one
// first, and its Else reads the guard key (count only) and then each limit
// scope's slots.
type joinShape struct {
	nested  bool
	guarded bool
}

// guardFailed: the outer compare failed because the guard key exists.
func (s joinShape) guardFailed(res txnRes) bool {
	return s.guarded && !res.ok && res.err == nil && res.resps[0].GetResponseRange().GetCount() > 0
}

// slotReads is the index of the first slot read in a failed outer Else.
func (s joinShape) slotReads() int {
	if s.guarded {
		return 1
	}
	return 0
}

// inner is the flat transaction's answer: whether it held at once, and its
// responses (those of hold or of queue).
func (s joinShape) inner(res txnRes) (bool, []*pb.ResponseOp) {
	if s.nested {
		t := res.resps[0].GetResponseTxn()
		return t.GetSucceeded(), t.GetResponses()
	}
	return res.ok, res.resps
}

// joinTxn commits a's join with the slots sl (held is the record of a
// grant at once): through group commit, except a session's join (which
// writes the session index), committed alone.
func (m *Manager) joinTxn(ctx context.Context, a *attempt, o acquireOptions, sl slots, held record) (txnRes, joinShape) {
	free, hold, queue := m.joinBranches(a, sl, held)
	guard, extra := m.joinGuard(a, o)
	shape := joinShape{nested: guard != "" || sl.limited(), guarded: guard != ""}
	conflicts := append([]string{a.name}, sl.conflicts()...)
	if !shape.nested {
		return m.batch.doExclusive(ctx, conflicts, free, hold, queue), shape
	}
	cmps, els := sl.cmps(), sl.reads()
	if guard != "" {
		cmps = append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(guard), "=", 0)}, cmps...)
		els = append([]clientv3.Op{clientv3.OpGet(guard, clientv3.WithCountOnly())}, els...)
	}
	txn := nestedJoin(cmps, free, hold, queue, extra, els)
	if !a.session {
		return m.batch.doTxn(ctx, conflicts, txn), shape
	}
	resp, err := m.batch.kv().Commit(ctx, txn)
	if err != nil {
		return txnRes{err: err}, shape
	}
	return txnRes{rev: resp.Header.Revision, ok: resp.Succeeded, resps: resp.Responses}, shape
}

// nestedJoin is If(cmps).Then(OpTxn(free, hold, queue), extra...).Else(els)
// as protobuf (etcdx.Request): clientv3 would clone the compares of the
// nested transaction twice, by reflection.
func nestedJoin(cmps, free []clientv3.Cmp, hold, queue, extra, els []clientv3.Op) *pb.TxnRequest {
	txn := etcdx.Request(cmps, extra, els)
	txn.Success = append([]*pb.RequestOp{etcdx.OpTxn(etcdx.Request(free, hold, queue))}, txn.Success...)
	return txn
}

// joinBranches is the flat join: if the queue admits a new entry
// (admission.go), hold at once; otherwise queue, and read the entry's
// predecessor. Both branches claim the limit slots.
func (m *Manager) joinBranches(a *attempt, sl slots, held record) (free []clientv3.Cmp, hold, queue []clientv3.Op) {
	q := m.admission(a.name)
	hold = []clientv3.Op{clientv3.OpPut(a.key, held.encode(), clientv3.WithLease(a.id))}
	if a.delay != 0 {
		hold = append(hold, clientv3.OpPut(q.delay, "", clientv3.WithLease(a.delay)))
	}
	// The read after the put sees it: it returns our key and the one
	// before it.
	queue = []clientv3.Op{clientv3.OpPut(a.key, a.rec.encode(), clientv3.WithLease(a.id)), q.joinRead()}
	return q.admits(0), append(hold, sl.puts(a.id)...), append(queue, sl.puts(a.id)...)
}

// joinGuard is the key that must not exist for the join to be written (""
// for none), and what the join writes besides when it is: a request-id
// join writes the request record; a session has one key per queue and
// records it in the session's index.
func (m *Manager) joinGuard(a *attempt, o acquireOptions) (guard string, extra []clientv3.Op) {
	switch {
	case o.requestID != "":
		return a.rec.Req, []clientv3.Op{clientv3.OpPut(a.rec.Req, a.reqRecord, clientv3.WithLease(a.id))}
	case a.session:
		return a.key, []clientv3.Op{clientv3.OpPut(m.ks.sessionIndex(a.id)+escape(a.name), "", clientv3.WithLease(a.id))}
	}
	return "", nil
}
