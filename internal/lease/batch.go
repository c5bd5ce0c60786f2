package lease

import (
	"context"
	"errors"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/etcdx"
)

// batcher is group commit: the conditional transactions of concurrent
// callers go to etcd together, as the nested transactions of one Txn (one
// raft proposal), each keeping its own compares and outcome. Under no load a
// transaction is committed at once, alone; under load, the ones that arrive
// while a commit is in flight share the next. Two joins of the same lock
// never share a Txn: etcd evaluates every nested compare before any write,
// so both would find the lock free; nor do two joins that claim the same
// limit slot (limits.go). Every other pair is safe together: a
// release, a claim and a join of one lock each decide on the state before
// the batch, which at worst makes a join queue behind a holder released in
// the same batch (it then finds itself at the head at once) or a claim fail
// (it looks again); two claims cannot both see themselves at the head.
type batcher struct {
	cli   *clientv3.Client
	spawn func(func()) // runs a commit in a goroutine its owner waits for

	txnsOnce sync.Once
	txns     *etcdx.Txns // commits TxnRequests built as protobuf

	mu       sync.Mutex
	pending  []*txnReq
	inflight int
}

const (
	maxBatch    = 32 // nested transactions per Txn (etcd allows 128 ops per level)
	maxInflight = 2  // concurrent commits
	commitLimit = 10 * time.Second
)

type txnReq struct {
	// conflicts are keys of which at most one request per batch may name
	// each: a join's lock name and the limit slot it claims; none for others.
	conflicts []string
	txn       *pb.TxnRequest // built once (etcdx.Request), nested as is
	res       chan txnRes
}

type txnRes struct {
	rev   int64
	ok    bool
	resps []*pb.ResponseOp
	err   error
}

// do commits the transaction If(cmps).Then(then).Else(els) and returns its
// outcome, or ctx's error if ctx ends first (the transaction may then still
// be committed: the caller treats that as an ambiguous outcome).
func (b *batcher) do(ctx context.Context, conflict string, cmps []clientv3.Cmp, then, els []clientv3.Op) txnRes {
	var conflicts []string
	if conflict != "" {
		conflicts = []string{conflict}
	}
	return b.doExclusive(ctx, conflicts, cmps, then, els)
}

// doExclusive is do for a transaction that shares no batch with another
// naming any of conflicts.
func (b *batcher) doExclusive(ctx context.Context, conflicts []string, cmps []clientv3.Cmp, then, els []clientv3.Op) txnRes {
	return b.doTxn(ctx, conflicts, etcdx.Request(cmps, then, els))
}

// doTxn is doExclusive for a transaction built as protobuf; nothing may
// change txn after.
func (b *batcher) doTxn(ctx context.Context, conflicts []string, txn *pb.TxnRequest) txnRes {
	r := &txnReq{conflicts: conflicts, txn: txn, res: make(chan txnRes, 1)}
	b.mu.Lock()
	b.pending = append(b.pending, r)
	batches := b.take()
	b.mu.Unlock()
	if len(batches) == 1 && len(batches[0]) == 1 && batches[0][0] == r {
		// Alone: commit on this goroutine, under the caller's context (no
		// hand-off to another goroutine and back: under no load that is
		// most of the batcher's cost). Then launch what arrived meanwhile.
		res := b.single(ctx, r)
		b.mu.Lock()
		b.inflight--
		next := b.take()
		b.mu.Unlock()
		b.launch(next)
		return res
	}
	b.launch(batches)
	select {
	case res := <-r.res:
		return res
	case <-ctx.Done():
		return txnRes{err: ctx.Err()}
	}
}

// take removes the batches to commit now from pending; b.mu must be held.
func (b *batcher) take() [][]*txnReq {
	var out [][]*txnReq
	for b.inflight < maxInflight && len(b.pending) > 0 {
		var batch, rest []*txnReq
		seen := map[string]bool{}
		for _, r := range b.pending {
			if len(batch) < maxBatch && !anySeen(seen, r.conflicts) {
				for _, c := range r.conflicts {
					seen[c] = true
				}
				batch = append(batch, r)
			} else {
				rest = append(rest, r)
			}
		}
		b.pending = rest
		b.inflight++
		out = append(out, batch)
	}
	return out
}

func anySeen(seen map[string]bool, keys []string) bool {
	for _, k := range keys {
		if seen[k] {
			return true
		}
	}
	return false
}

func (b *batcher) launch(batches [][]*txnReq) {
	for _, batch := range batches {
		b.spawn(func() {
			b.commit(batch)
			b.mu.Lock()
			b.inflight--
			next := b.take()
			b.mu.Unlock()
			b.launch(next)
		})
	}
}

func (b *batcher) commit(batch []*txnReq) {
	ctx, cancel := context.WithTimeout(context.Background(), commitLimit)
	defer cancel()
	if len(batch) == 1 {
		batch[0].res <- b.single(ctx, batch[0])
		return
	}
	ops := make([]*pb.RequestOp, len(batch))
	for i, r := range batch {
		ops[i] = etcdx.OpTxn(r.txn)
	}
	resp, err := b.kv().Commit(ctx, etcdx.Txn(nil, ops, nil))
	if err != nil {
		if isRequestError(err) {
			// One member is at fault (say a lease that just expired): it
			// must not fail the others.
			for _, r := range batch {
				r.res <- b.single(ctx, r)
			}
			return
		}
		for _, r := range batch {
			r.res <- txnRes{err: err}
		}
		return
	}
	for i, r := range batch {
		t := resp.Responses[i].GetResponseTxn()
		r.res <- txnRes{rev: resp.Header.Revision, ok: t.GetSucceeded(), resps: t.GetResponses()}
	}
}

func (b *batcher) single(ctx context.Context, r *txnReq) txnRes {
	resp, err := b.kv().Commit(ctx, r.txn)
	if err != nil {
		return txnRes{err: err}
	}
	return txnRes{rev: resp.Header.Revision, ok: resp.Succeeded, resps: resp.Responses}
}

func (b *batcher) kv() *etcdx.Txns {
	b.txnsOnce.Do(func() { b.txns = etcdx.NewTxns(b.cli) })
	return b.txns
}

// isRequestError: etcd refused the request itself, not for unavailability.
func isRequestError(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrDuplicateKey) ||
		errors.Is(err, rpctypes.ErrTooManyOps) || errors.Is(err, rpctypes.ErrRequestTooLarge)
}
