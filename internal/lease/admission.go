package lease

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// admission is the queue's admission rule: the one place that says which
// entries of a lock's queue hold it. Today a lock admits one holder, the
// entry with the lowest create revision (first come, first served), once
// no other grant's lock-delay is pending; every other entry waits for the
// one key that stands between it and admission, its immediate predecessor,
// so that a hand-off wakes one waiter (no thundering herd).
//
// The acquisition uses the rule only through these methods: the join
// holds at once when admits(0) holds (join.go), the claim commits only
// while admits(token) holds (claim.go), and the wait watches blocker's key
// until there is none (wait.go; the join reads the first one for it:
// joinRead, joinBlocker). Readers find the holder with holderRead and
// admittedAt (ForceRelease, Describe, holderToken; Watch takes the oldest
// entry of its state: head). A queue admitting N holders (a semaphore), or
// shared and exclusive holders (a read-write lock), is a change of these
// methods (and of head) and of nothing else.
type admission struct {
	queue string // the queue's prefix: one entry per acquisition
	delay string // the lock-delay key: while it exists, nobody new is admitted
}

func (m *Manager) admission(name string) admission {
	return admission{queue: m.ks.Queue(name), delay: m.ks.delay(name)}
}

// admits is the rule as etcd compares it: all hold exactly when the entry
// of create revision token is admitted, or, for token 0, when an entry
// that this very transaction writes would be. No entry older than it is in
// the queue (for token 0: no entry at all), and no lock-delay is pending.
func (q admission) admits(token int64) []clientv3.Cmp {
	older := clientv3.Compare(clientv3.CreateRevision(q.queue), "=", 0).WithPrefix()
	if token != 0 {
		older = clientv3.Compare(clientv3.CreateRevision(q.queue), ">", token-1).WithPrefix()
	}
	return []clientv3.Cmp{older, clientv3.Compare(clientv3.CreateRevision(q.delay), "=", 0)}
}

// admittedAt reports whether the entry at position i of the queue, in
// create-revision order, holds the lock.
func (admission) admittedAt(i int) bool { return i == 0 }

// holderRead is the read of the holder's entry: the oldest one.
func (q admission) holderRead() (string, []clientv3.OpOption) {
	return q.queue, clientv3.WithFirstCreate()
}

// blocker is the key the entry of create revision token waits for: its
// immediate predecessor, the newest entry older than it; or, with none,
// another grant's pending lock-delay key. "" when nothing blocks it.
// errOp names the read that failed.
func (q admission) blocker(ctx context.Context, kv clientv3.KV, token int64) (key, errOp string, err error) {
	r, err := kv.Get(ctx, q.queue, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(token-1), clientv3.WithKeysOnly())...)
	if err != nil {
		return "", "find predecessor", err
	}
	if len(r.Kvs) > 0 {
		return string(r.Kvs[0].Key), "", nil
	}
	return q.delayBlocker(ctx, kv, token)
}

// delayBlocker is the lock-delay key if another grant's lock-delay is
// pending for the entry of create revision token, else "".
func (q admission) delayBlocker(ctx context.Context, kv clientv3.KV, token int64) (key, errOp string, err error) {
	d, err := kv.Get(ctx, q.delay, clientv3.WithKeysOnly())
	if err != nil {
		return "", "read lock-delay", err
	}
	if len(d.Kvs) == 0 || d.Kvs[0].CreateRevision == token {
		return "", "", nil
	}
	return q.delay, "", nil
}

// joinRead is the read a join's queued branch makes right after its put:
// the newest two entries, its own and its immediate predecessor, the first
// key its wait watches.
func (q admission) joinRead() clientv3.Op {
	return clientv3.OpGet(q.queue, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(2),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend))
}

// joinBlocker is the predecessor of the entry of create revision token
// from joinRead's answer, or "" if that answer does not tell.
func (admission) joinBlocker(r *pb.RangeResponse, token int64) string {
	if kvs := r.GetKvs(); len(kvs) == 2 && kvs[0].CreateRevision == token {
		return string(kvs[1].Key)
	}
	return ""
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
