package lease

import (
	"context"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// The admission of a semaphore's and a reader's entries (admission.go has
// the rule's other half). Both are decided by a read rather than by one
// etcd compare: "fewer than N older entries, all granted" and "every older
// entry a reader" are facts about entries that can only leave the queue
// (an entry joins with a greater create revision than every older one), so
// once a read shows them they hold until the entry itself goes, and the
// claim compares only the entry's own key.
//
// A semaphore grants in queue order: an entry is admitted only once every
// older one is granted. Holders are therefore granted in token order, and
// a new holder of slot k has a greater token than every earlier one (the
// slot's mark, per (resource, slot), relies on it); and exactly one entry,
// the oldest waiting, can be about to claim, so the free slot its read
// found is still free when it claims.

// semaphoreBlocker decides a semaphore entry's admission: admitted (empty
// target) with the lowest slot no older holder holds and no lock-delay
// holds back; or the target to watch: its predecessor's claim or end while
// that one waits too (one watcher per waiter), any end in the queue for
// the oldest waiter (the first holder to leave lets it in), or a slot's
// pending lock-delay.
func (q admission) semaphoreBlocker(ctx context.Context, kv clientv3.KV, token int64) (target, int32, string, error) {
	n := int64(q.shape.Limit)
	r, err := kv.Txn(ctx).Then(
		clientv3.OpGet(q.queue, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(token-1), clientv3.WithLimit(n),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)),
		clientv3.OpGet(q.queue, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(token-1))...),
		clientv3.OpGet(q.delay, clientv3.WithKeysOnly()),
		clientv3.OpGet(q.delay+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		return target{}, 0, "read older entries", err
	}
	rev := r.Header.Revision
	older := r.Responses[0].GetResponseRange().GetKvs()
	if len(older) > 0 {
		if s, _ := keyspace.ShapeOf(older[0].Value); s != q.shape {
			return target{}, 0, "", &LimitMismatchError{Name: q.name, InForce: s.EffectiveLimit(), Asked: q.shape.Limit}
		}
	}
	var pred *mvccpb.KeyValue
	if kvs := r.Responses[1].GetResponseRange().GetKvs(); len(kvs) > 0 {
		pred = kvs[0]
	}
	used, ready := make([]bool, n), true
	for _, kv := range older {
		rec := decodeRecord(kv.Value)
		if rec.shape() != q.shape || rec.Acquired == 0 {
			ready = false // a mismatched entry about to leave, or one not yet granted
			continue
		}
		if rec.Slot >= 0 && int64(rec.Slot) < n {
			used[rec.Slot] = true
		}
	}
	switch {
	case !ready || (len(older) == int(n) && decodeRecord(pred.Value).Acquired == 0):
		return target{key: string(pred.Key), puts: true, rev: rev}, 0, "", nil
	case len(older) == int(n):
		return target{key: q.queue, prefix: true, rev: rev}, 0, "", nil
	}
	return q.freeSlot(used, delayedSlots(q, r.Responses[2].GetResponseRange().GetKvs(), r.Responses[3].GetResponseRange().GetKvs()), rev)
}

// freeSlot is the lowest slot neither used nor delayed (admitted), or, if
// every unused slot has a pending lock-delay, the delay key to wait for.
func (q admission) freeSlot(used []bool, delayed map[int32]bool, rev int64) (target, int32, string, error) {
	var held int32 = -1
	for s := range int32(len(used)) {
		switch {
		case used[s]:
		case !delayed[s]:
			return target{}, s, "", nil
		case held < 0:
			held = s
		}
	}
	if held < 0 { // cannot happen: fewer older entries than slots
		return target{key: q.queue, prefix: true, rev: rev}, 0, "", nil
	}
	return target{key: q.slotDelay(held), rev: rev}, 0, "", nil
}

// delayedSlots are the slots whose lock-delay key exists: slot 0's is the
// lock's own delay key, slot k's that key + "/k".
func delayedSlots(q admission, own, others []*mvccpb.KeyValue) map[int32]bool {
	d := map[int32]bool{}
	if len(own) > 0 {
		d[0] = true
	}
	for _, kv := range others {
		for s := range int32(q.shape.Limit) {
			if string(kv.Key) == q.slotDelay(s) {
				d[s] = true
			}
		}
	}
	return d
}

// readerBlocker decides a reader's admission: admitted once every older
// entry is a reader and no writer's lock-delay is pending; until then it
// waits for the nearest older writer (one key, as a mutex's waiter). A
// semaphore's queue refuses it (*LimitMismatchError).
func (q admission) readerBlocker(ctx context.Context, kv clientv3.KV, token int64) (target, string, error) {
	r, err := kv.Get(ctx, q.queue, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(token-1),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return target{}, "read older entries", err
	}
	older := r.Kvs
	if len(older) > 0 {
		if s, _ := keyspace.ShapeOf(older[0].Value); s.Semaphore() {
			return target{}, "", &LimitMismatchError{Name: q.name, InForce: s.Limit, Asked: 1, Shared: true}
		}
	}
	for i := len(older) - 1; i >= 0; i-- {
		if s, _ := keyspace.ShapeOf(older[i].Value); !s.Shared {
			return target{key: string(older[i].Key), created: older[i].CreateRevision}, "", nil
		}
	}
	key, errOp, err := q.delayBlocker(ctx, kv)
	return target{key: key}, errOp, err
}
