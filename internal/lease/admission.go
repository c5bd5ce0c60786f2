package lease

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// admission is the queue's admission rule: the one place that says which
// entries of a lock's queue hold it (the rule as a function of position is
// keyspace.Admitted, which internal/fence shares). A mutex (or a
// read-write lock's writer) admits one holder, the entry with the lowest
// create revision (first come, first served), once no other grant's
// lock-delay is pending; a read-write lock's readers hold together while
// every older entry is a reader; a semaphore of limit N admits the N
// oldest entries, granted in queue order, each on a slot (shaped.go). Every
// waiter watches one key that stands between it and admission (its
// immediate predecessor, the nearest older writer, or, for a semaphore's
// oldest waiter, the queue's ends), so that a hand-off wakes one waiter (no
// thundering herd).
//
// The acquisition uses the rule only through these methods: the join
// holds at once when admits(0) holds (join.go), the claim commits only
// while admits(token) holds (claim.go; a reader's or a semaphore's entry,
// whose admission is no compare, claims once blocker finds nothing), and
// the wait watches blocker's target until there is none (wait.go; the join
// reads a mutex's first one for it: joinRead, joinBlocker). Readers find
// the holders with holderRead and admittedAt (ForceRelease, Describe,
// holderToken; Watch and List use keyspace.Holders).
type admission struct {
	queue string // the queue's prefix: one entry per acquisition
	delay string // the lock-delay key: while it exists, nobody new is admitted
	// The admitted entry's shape (keyspace.Shape): a mutex (or writer), a
	// reader or a semaphore's; and the semaphore's slot lock-delay keys.
	shape     keyspace.Shape
	name      string
	slotDelay func(slot int32) string
	// ownDelay is the entry's own lock-delay lease (0: it asked for no
	// lock delay): a lock-delay key on it is the entry's, not a pending
	// delay of another grant.
	ownDelay clientv3.LeaseID
}

func (m *Manager) admission(name string) admission {
	return admission{queue: m.ks.Queue(name), delay: m.ks.delay(name), name: name,
		slotDelay: func(slot int32) string { return m.ks.SlotDelay(name, slot) }}
}

// admissionOf is the rule as it applies to the entry of attempt a.
func (m *Manager) admissionOf(a *attempt) admission {
	q := m.admission(a.name)
	q.shape, q.ownDelay = a.rec.shape(), a.delay
	return q
}

// admits is the rule as etcd compares it: all hold exactly when the entry
// of create revision token is admitted, or, for token 0, when an entry
// that this very transaction writes would be. No entry older than it is in
// the queue (for token 0: no entry at all), and no lock-delay is pending.
// Only a mutex's (or a writer's) admission is one compare; a reader or a
// semaphore's entry is admitted by a read (blocker), which stays true
// (older entries only ever leave), so its claim compares nothing more than
// its own entry (comparable reports which).
func (q admission) admits(token int64) []clientv3.Cmp {
	older := clientv3.Compare(clientv3.CreateRevision(q.queue), "=", 0).WithPrefix()
	if token != 0 {
		older = clientv3.Compare(clientv3.CreateRevision(q.queue), ">", token-1).WithPrefix()
	}
	return []clientv3.Cmp{older, clientv3.Compare(clientv3.CreateRevision(q.delay), "=", 0)}
}

// comparable reports whether admits(token) decides the entry's admission
// (a mutex's or a writer's entry).
func (q admission) comparable() bool { return q.shape.Plain() }

// admittedAt reports whether the entry at position i of the queue, in
// create-revision order, holds the lock, given the shapes of the entries
// (keyspace.Admitted).
func (admission) admittedAt(shapes []keyspace.Shape, i int) bool {
	return keyspace.Admitted(shapes[:i], shapes[i])
}

// holderRead is the read of the oldest holder's entry: the oldest one.
func (q admission) holderRead() (string, []clientv3.OpOption) {
	return q.queue, clientv3.WithFirstCreate()
}

// target is what a waiter watches until it may be admitted: key's delete
// (a mutex's predecessor, a pending lock-delay), or also its put (a
// semaphore's predecessor waiting to be granted: its claim), or any delete
// under the prefix key (a semaphore's first waiter: any holder's end). A
// watch from rev+1 sees every change since the read that chose it (rev 0:
// from now, then key's presence is checked).
//
// created is the create revision of the queue entry that blocks (0: any
// key named key blocks, as a lock-delay key does). A queue key is named by
// its lease, and a released grant's lease is pooled and reused by its next
// Acquire: the predecessor can be deleted and written again, behind the
// waiter, before the waiter's watch exists. That key is another entry,
// and the predecessor is gone.
type target struct {
	key     string
	prefix  bool
	puts    bool
	rev     int64
	created int64
}

// present reports whether kvs, a read of t's key, shows the entry t waits
// for.
func (t target) present(kvs []*mvccpb.KeyValue) bool {
	return len(kvs) > 0 && (t.created == 0 || kvs[0].CreateRevision == t.created)
}

// blocker is what the entry of create revision token waits for (key ""
// when nothing blocks it), and, for a semaphore's admitted entry, the slot
// it is to claim. A mutex or writer waits for its immediate predecessor,
// the newest entry older than it; or, with none, another grant's pending
// lock-delay key. errOp names the read that failed; a
// *LimitMismatchError refuses an entry of another limit than the queue's.
func (q admission) blocker(ctx context.Context, kv clientv3.KV, token int64) (t target, slot int32, errOp string, err error) {
	switch {
	case q.shape.Semaphore():
		return q.semaphoreBlocker(ctx, kv, token)
	case q.shape.Shared:
		t, errOp, err = q.readerBlocker(ctx, kv, token)
		return t, 0, errOp, err
	}
	r, err := kv.Get(ctx, q.queue, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(token-1), clientv3.WithKeysOnly())...)
	if err != nil {
		return target{}, 0, "find predecessor", err
	}
	if len(r.Kvs) > 0 {
		return target{key: string(r.Kvs[0].Key), created: r.Kvs[0].CreateRevision}, 0, "", nil
	}
	key, errOp, err := q.delayBlocker(ctx, kv)
	return target{key: key}, 0, errOp, err
}

// delayBlocker is the lock-delay key if another grant's lock-delay is
// pending, else "". The key is the entry's own only if it is on the entry's
// own lock-delay lease: its create revision does not tell, since another
// grant's claim can share the entry's join transaction (group commit).
// Not a keys-only read: etcd answers those from its index, without the
// lease (the key's value is empty anyway).
func (q admission) delayBlocker(ctx context.Context, kv clientv3.KV) (key, errOp string, err error) {
	d, err := kv.Get(ctx, q.delay)
	if err != nil {
		return "", "read lock-delay", err
	}
	if len(d.Kvs) == 0 || (q.ownDelay != 0 && clientv3.LeaseID(d.Kvs[0].Lease) == q.ownDelay) {
		return "", "", nil
	}
	return q.delay, "", nil
}

// joinRead is the read a join's queued branch makes right after its put:
// the newest two entries, its own and its immediate predecessor, the first
// key its wait watches (and whose shape says whether the queue is a
// semaphore a mutex's entry cannot join).
func (q admission) joinRead() clientv3.Op {
	return clientv3.OpGet(q.queue, clientv3.WithPrefix(), clientv3.WithLimit(2),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend))
}

// joinBlocker is the predecessor of a mutex's (or writer's) entry of
// create revision token from joinRead's answer, or key "" if that answer
// does not tell; a *LimitMismatchError if the predecessor is a semaphore's.
// A reader or a semaphore's entry finds its blocker by reading (blocker).
func (q admission) joinBlocker(r *pb.RangeResponse, token int64) (target, error) {
	kvs := r.GetKvs()
	if !q.shape.Plain() || len(kvs) != 2 || kvs[0].CreateRevision != token {
		return target{}, nil
	}
	if s, _ := keyspace.ShapeOf(kvs[1].Value); s.Semaphore() {
		return target{}, &LimitMismatchError{Name: q.name, InForce: s.Limit, Asked: 1}
	}
	return target{key: string(kvs[1].Key), created: kvs[1].CreateRevision}, nil
}

// holderToken is the token of name's holder for a refusal's details (0 if
// none or unknown); it reads even after the caller's context ended.
func (m *Manager) holderToken(ctx context.Context, name string) int64 {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	key, opts := m.admission(name).holderRead()
	if r, err := m.cli.Get(rctx, key, opts...); err == nil && len(r.Kvs) > 0 {
		return r.Kvs[0].CreateRevision
	}
	return 0
}
