package shard

// The committer's goroutines: the dispatcher that builds Txns from the
// waiting units, the senders that commit them, and what a Txn's outcome
// does to its units.

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// run is the dispatcher: it builds Txns and hands them to the senders,
// and takes them back answered, until Close and the last Txn in flight.
func (c *Committer) run() {
	defer func() {
		close(c.sendq)
		c.senders.Wait()
		close(c.exited)
	}()
	for {
		c.reap()
		if !c.take() { // closed: nothing more is sent
			if c.inflight == 0 {
				for _, p := range c.waiting {
					commitFinish(p.u, 0, ErrClosed)
				}
				clear(c.waiting)
				c.waiting = nil
				return
			}
			c.complete(<-c.doneq)
			continue
		}
		if c.inflight < c.opt.maxInflight && len(c.waiting) > 0 && c.dispatch() {
			continue // something changed: look again
		}
		select {
		case <-c.wake:
		case b := <-c.doneq:
			c.complete(b)
		}
	}
}

// reap takes back the Txns answered so far, without waiting.
func (c *Committer) reap() {
	for {
		select {
		case b := <-c.doneq:
			c.complete(b)
		default:
			return
		}
	}
}

// take appends the queue to the waiting units; it is false once Close was
// called (after which the queue stays empty: Submit answers at once).
func (c *Committer) take() (open bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.waiting) == 0 {
		c.waiting, c.queue = c.queue, c.waiting[:0]
	} else {
		c.waiting = append(c.waiting, c.queue...)
		clear(c.queue)
		c.queue = c.queue[:0]
	}
	return !c.closed
}

// dispatch builds one Txn of waiting units (after failing those that
// cannot be sent) and hands it to a sender. It reports whether anything
// changed: a Txn sent, or a unit answered.
func (c *Committer) dispatch() (changed bool) {
	b := c.free[len(c.free)-1]
	b.reset()
	before := len(c.waiting)
	c.waiting = c.fill(b, c.waiting)
	if len(b.units) == 0 {
		return len(c.waiting) != before
	}
	if c.isClosed() { // while the Txn was being built: not sent
		c.failAll(b, ErrClosed)
		b.reset()
		return true
	}
	c.free = c.free[:len(c.free)-1]
	for _, f := range b.fences {
		c.busy[f.shard] = struct{}{}
	}
	for _, p := range b.units {
		for i := range p.u.Ops {
			c.busyKeys[p.u.Ops[i].Key] = struct{}{}
			if k := p.u.Ops[i].Conflict; k != "" {
				c.busyConfl[k] = struct{}{}
			}
		}
	}
	c.inflight++
	c.sendq <- b // never blocks: at most maxInflight are out
	return true
}

// complete takes back an answered Txn: its shards and keys are free
// again, and the units it sent back (a fence failed) wait first.
func (c *Committer) complete(b *commitBatch) {
	c.inflight--
	for _, f := range b.fences {
		delete(c.busy, f.shard)
	}
	for _, p := range b.units {
		for i := range p.u.Ops {
			delete(c.busyKeys, p.u.Ops[i].Key)
			if k := p.u.Ops[i].Conflict; k != "" {
				delete(c.busyConfl, k)
			}
		}
	}
	c.waiting = commitMerge(b.again, c.waiting)
	b.reset()
	c.free = append(c.free, b)
}

// sender commits the Txns the dispatcher hands it and answers their
// units, Dones included, before handing them back.
func (c *Committer) sender() {
	for b := range c.sendq {
		resp, err := c.send(b)
		switch {
		case err != nil:
			c.failAll(b, &UnknownOutcomeError{Err: err})
		case resp.Succeeded:
			c.succeed(b, resp.Header.Revision)
		default:
			c.fenceFailed(b, resp)
		}
		c.doneq <- b // never blocks: it has room for every Txn out
	}
}

// send commits b's Txn: its fences, then its units' ops, else the owner
// keys.
func (c *Committer) send(b *commitBatch) (*clientv3.TxnResponse, error) {
	for _, f := range b.fences {
		b.cmps = append(b.cmps, clientv3.Compare(clientv3.CreateRevision(f.key), "=", f.rev))
		b.els = append(b.els, clientv3.OpGet(f.key))
	}
	for _, p := range b.units {
		for _, op := range p.u.Ops {
			switch {
			case op.Delete:
				b.then = append(b.then, clientv3.OpDelete(op.Key))
			case op.Lease != 0: // an end marker, on the member's lease
				b.then = append(b.then, clientv3.OpPut(op.Key, op.Value, clientv3.WithLease(op.Lease)))
			default:
				b.then = append(b.then, clientv3.OpPut(op.Key, op.Value))
			}
		}
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.opt.timeout)
	defer cancel()
	return c.kv.Txn(ctx).If(b.cmps...).Then(b.then...).Else(b.els...).Commit()
}

// succeed answers b's units with rev and counts them.
func (c *Committer) succeed(b *commitBatch, rev int64) {
	c.txns.Add(1)
	c.units.Add(int64(len(b.units)))
	c.ops.Add(int64(b.nops))
	for _, p := range b.units {
		commitFinish(p.u, rev, nil)
	}
}

// failAll answers b's units with err.
func (c *Committer) failAll(b *commitBatch, err error) {
	for _, p := range b.units {
		commitFinish(p.u, 0, err)
	}
}

// fenceFailed answers the units of b's shards whose fence failed and
// leaves the others, which were not applied either, in b.again, in order.
func (c *Committer) fenceFailed(b *commitBatch, resp *clientv3.TxnResponse) {
	lost := commitLostShards(b, resp)
	again := b.again[:0]
	for _, p := range b.units {
		if lost[b.shards[p.u.Shard].fence] {
			commitFinish(p.u, 0, &OwnershipLostError{Shard: p.u.Shard})
		} else {
			again = append(again, p)
		}
	}
	b.again = again
}

// commitLostShards marks, by fence index, the fences the Else branch shows
// failed: owner key missing or created again. If it shows none (it cannot,
// the reads share the compares' revision), all are taken as failed: the
// Txn applied nothing and sending it again could loop.
func commitLostShards(b *commitBatch, resp *clientv3.TxnResponse) []bool {
	lost := b.lost[:0]
	found := false
	for i, f := range b.fences {
		gone := true
		if i < len(resp.Responses) {
			if r := resp.Responses[i].GetResponseRange(); r != nil && len(r.Kvs) == 1 {
				gone = r.Kvs[0].CreateRevision != f.rev
			}
		}
		lost = append(lost, gone)
		found = found || gone
	}
	if !found {
		for i := range lost {
			lost[i] = true
		}
	}
	b.lost = lost
	return lost
}

// commitMerge is the units of a and w (each in submission order) in
// submission order, in a new slice: w's array may be a's.
func commitMerge(a, w []commitPending) []commitPending {
	if len(a) == 0 {
		return w
	}
	out := make([]commitPending, 0, len(a)+len(w))
	for len(a) > 0 && len(w) > 0 {
		if a[0].seq < w[0].seq {
			out, a = append(out, a[0]), a[1:]
		} else {
			out, w = append(out, w[0]), w[1:]
		}
	}
	out = append(append(out, a...), w...)
	return out
}

// commitFinish calls u.Done, if any.
func commitFinish(u Unit, rev int64, err error) {
	if u.Done != nil {
		u.Done(rev, err)
	}
}
