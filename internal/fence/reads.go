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
	op   clientv3.Op
	resp *pb.RangeResponse
	err  error
	done chan struct{}
	lead chan struct{} // a commit slot handed over to this caller
	// handed is 1 while a slot sent on lead is not yet taken (guarded by
	// reads.mu); a request is handed at most one slot at a time, so the
	// send never blocks and no slot is ever lost.
	handed int
}

// get runs op (a Get) linearizably, batched with concurrent ones.
func (r *reads) get(op clientv3.Op) (*pb.RangeResponse, error) {
	q := &readReq{op: op, done: make(chan struct{}), lead: make(chan struct{}, 1)}
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
			return q.resp, q.err
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
	ops := make([]clientv3.Op, len(batch))
	for i, q := range batch {
		ops[i] = q.op
	}
	resp, err := r.cli.Txn(ctx).Then(ops...).Commit()
	for i, q := range batch {
		if err != nil {
			q.err = err
		} else {
			q.resp = resp.Responses[i].GetResponseRange()
		}
		close(q.done)
	}
}
