package fence

import (
	"context"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// reads shares one linearizable read among concurrent validations: the
// Gets that arrive while a read is in flight go to etcd together as one
// read-only Txn (one ReadIndex round), each answered from its own range.
// Each Get is still linearizable: it is sent after its caller asked and
// answered before its caller returns. No goroutine is started: a caller
// commits the batches (at most maxReadRounds, then it hands over to a
// waiting caller), so nobody waits long for others.
type reads struct {
	cli *clientv3.Client
	// barrier is the key a batch of barriers alone reads (count only):
	// any key under the coordinator's prefix does.
	barrier string

	mu       sync.Mutex
	pending  []*readReq
	inflight int
}

const (
	maxReadBatch    = 64
	maxReadInflight = 2
	maxReadRounds   = 4
	readLimit       = 10 * time.Second
)

type readReq struct {
	op      clientv3.Op
	barrier bool  // no op of its own: only the batch's revision
	rev     int64 // the revision the batch read at
	resp    *pb.RangeResponse
	err     error
	done    chan struct{}
	lead    chan struct{} // a commit slot handed over to this caller
	// handed is 1 while a slot sent on lead is not yet taken (guarded by
	// reads.mu); a request is handed at most one slot at a time, so the
	// send never blocks and no slot is ever lost.
	handed int
}

// get runs op (a Get) linearizably, batched with concurrent ones.
func (r *reads) get(op clientv3.Op) (*pb.RangeResponse, error) {
	q := &readReq{op: op, done: make(chan struct{}), lead: make(chan struct{}, 1)}
	err := r.do(q)
	return q.resp, err
}

// revision returns a revision at least as new as every write completed
// before the call: the revision of a linearizable read (shared by every
// concurrent caller: a batch of barriers reads one key).
func (r *reads) revision() (int64, error) {
	q := &readReq{barrier: true, done: make(chan struct{}), lead: make(chan struct{}, 1)}
	err := r.do(q)
	return q.rev, err
}

func (r *reads) do(q *readReq) error {
	r.mu.Lock()
	r.pending = append(r.pending, q)
	leader := r.inflight < maxReadInflight
	if leader {
		r.inflight++
	}
	r.mu.Unlock()
	if leader {
		r.commitRounds()
	}
	for {
		select {
		case <-q.lead:
			r.mu.Lock()
			q.handed--
			r.mu.Unlock()
			r.commitRounds()
		case <-q.done:
			// A slot handed to us after another caller committed our read
			// must still be used, or it would be lost.
			r.mu.Lock()
			n := q.handed
			q.handed = 0
			r.mu.Unlock()
			for range n {
				<-q.lead
				r.commitRounds()
			}
			return q.err
		}
	}
}

// commitRounds commits pending batches while there are some, for at most
// maxReadRounds, then passes its slot to the oldest waiting caller.
func (r *reads) commitRounds() {
	for round := 0; ; round++ {
		r.mu.Lock()
		if len(r.pending) == 0 {
			r.inflight--
			r.mu.Unlock()
			return
		}
		if round >= maxReadRounds {
			if next := r.handable(); next != nil {
				next.handed = 1
				next.lead <- struct{}{} // buffered and empty: never blocks
				r.mu.Unlock()
				return
			}
			// Every waiting caller already has a slot coming: go on.
		}
		n := min(len(r.pending), maxReadBatch)
		batch := r.pending[:n:n]
		r.pending = append([]*readReq(nil), r.pending[n:]...)
		r.mu.Unlock()
		r.commit(batch)
	}
}

// handable returns the oldest pending request without a slot coming, or
// nil; r.mu must be held.
func (r *reads) handable() *readReq {
	for _, p := range r.pending {
		if p.handed == 0 {
			return p
		}
	}
	return nil
}

func (r *reads) commit(batch []*readReq) {
	ctx, cancel := context.WithTimeout(context.Background(), readLimit)
	defer cancel()
	ops := make([]clientv3.Op, 0, len(batch))
	idx := make([]int, len(batch)) // each request's response, -1 for barriers
	for i, q := range batch {
		idx[i] = -1
		if !q.barrier {
			idx[i] = len(ops)
			ops = append(ops, q.op)
		}
	}
	if len(ops) == 0 {
		ops = append(ops, clientv3.OpGet(r.barrier, clientv3.WithCountOnly()))
	}
	resp, err := r.cli.Txn(ctx).Then(ops...).Commit()
	for i, q := range batch {
		switch {
		case err != nil:
			q.err = err
		case idx[i] >= 0:
			q.resp = resp.Responses[idx[i]].GetResponseRange()
			q.rev = resp.Header.Revision
		default:
			q.rev = resp.Header.Revision
		}
		close(q.done)
	}
}
