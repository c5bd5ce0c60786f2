package shard

// Building one Txn: which waiting units fit (ops and compares under the
// limit, no key or conflict key twice, nothing of a shard or key in flight),
// in order per shard and per key. Every op's key counts, whatever the op:
// a lock's end marker, put by every unit that releases one of its grants,
// is a key like any other, so two such units go in two Txns
// (TestCommitEndMarkersSplitTxns).

import (
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// fill puts into b as many of the first waiting units as fit, fails those
// that can never be sent, and returns the rest, in order.
func (c *Committer) fill(b *commitBatch, waiting []commitPending) []commitPending {
	n := min(len(waiting), commitScanFactor*c.opt.maxTxnOps)
	scanned := 0
	for ; scanned < n && b.nops < c.opt.maxTxnOps; scanned++ {
		p := waiting[scanned]
		switch err := c.place(b, p.u); {
		case errors.Is(err, errCommitDefer):
			b.held = append(b.held, p)
		case err != nil:
			commitFinish(p.u, 0, err)
		default:
			b.units = append(b.units, p)
		}
	}
	// The held units go back just before the unscanned ones.
	start := scanned - len(b.held)
	copy(waiting[start:scanned], b.held)
	clear(waiting[:start])
	clear(b.held)
	b.held = b.held[:0]
	return waiting[start:]
}

// errCommitDefer: the unit waits for a later Txn.
var errCommitDefer = errors.New("shard: unit deferred")

// place adds u to b, or says why not: errCommitDefer, or the error that
// fails it.
func (c *Committer) place(b *commitBatch, u Unit) error {
	st, seen := b.shards[u.Shard]
	switch {
	case st.lost:
		return &OwnershipLostError{Shard: u.Shard}
	case st.held:
		b.reserve(u)
		return errCommitDefer
	}
	if _, busy := c.busy[u.Shard]; busy && !seen { // a Txn of the shard is in flight
		b.shards[u.Shard] = commitShard{fence: -1, held: true}
		b.reserve(u)
		return errCommitDefer
	}
	if err := c.validate(u); err != nil {
		return err
	}
	if (!seen && len(b.fences) == c.opt.maxTxnOps) || b.nops+len(u.Ops) > c.opt.maxTxnOps || b.clashes(u) || c.clashesInFlight(u) {
		if !seen {
			st.fence = -1
		}
		st.held = true
		b.shards[u.Shard] = st
		b.reserve(u)
		return errCommitDefer
	}
	if !seen {
		key, rev, ok := c.guard(u.Shard)
		if !ok || rev < 1 {
			b.shards[u.Shard] = commitShard{fence: -1, lost: true}
			return &OwnershipLostError{Shard: u.Shard}
		}
		b.shards[u.Shard] = commitShard{fence: len(b.fences)}
		b.fences = append(b.fences, commitFence{shard: u.Shard, key: key, rev: rev})
	}
	b.reserve(u)
	b.nops += len(u.Ops)
	return nil
}

// validate is the error of a unit that can never be sent.
func (c *Committer) validate(u Unit) error {
	if len(u.Ops) > c.opt.maxTxnOps {
		return fmt.Errorf("shard %d: %d ops, at most %d per transaction: %w", u.Shard, len(u.Ops), c.opt.maxTxnOps, errUnitTooLarge)
	}
	if k := commitDuplicate(u.Ops); k != "" {
		return fmt.Errorf("shard %d: %q twice: %w", u.Shard, k, errCommitDuplicate)
	}
	return nil
}

// commitDuplicate is a key, or conflict key, two of ops share, or "".
func commitDuplicate(ops []Op) string {
	if len(ops) <= 16 { // no maps for the usual few ops
		for i := range ops {
			for j := range i {
				if k := commitClash(&ops[i], &ops[j]); k != "" {
					return k
				}
			}
		}
		return ""
	}
	keys, conflicts := make(map[string]struct{}, len(ops)), make(map[string]struct{}, len(ops))
	for _, op := range ops {
		if _, ok := keys[op.Key]; ok {
			return op.Key
		}
		keys[op.Key] = struct{}{}
		if op.Conflict == "" {
			continue
		}
		if _, ok := conflicts[op.Conflict]; ok {
			return op.Conflict
		}
		conflicts[op.Conflict] = struct{}{}
	}
	return ""
}

// commitClash is what two ops share that one Txn may hold only once, or "".
func commitClash(a, b *Op) string {
	switch {
	case a.Key == b.Key:
		return a.Key
	case a.Conflict != "" && a.Conflict == b.Conflict:
		return a.Conflict
	}
	return ""
}

// commitShard is a shard's state in a round. A shard is seen with a fence
// (its units are in the Txn), held, lost, or both fenced and held.
type commitShard struct {
	fence int  // index in fences if a unit is in the Txn, else -1
	held  bool // a unit waits for a later Txn (or the shard is in flight): so do the shard's later units
	lost  bool // the Guard says not ours
}

// commitFence is a shard's compare.
type commitFence struct {
	shard uint32
	key   string
	rev   int64
}

// commitBatch is one Txn: built by the dispatcher (with the scratch of
// that round), then committed and answered by a sender, then taken back,
// reset and reused.
type commitBatch struct {
	units     []commitPending
	held      []commitPending
	again     []commitPending
	fences    []commitFence
	shards    map[uint32]commitShard
	keys      map[string]struct{} // written or held back in this round
	conflicts map[string]struct{} // the same, of Op.Conflict
	nops      int
	lost      []bool
	cmps      []clientv3.Cmp
	then, els []clientv3.Op
}

func newCommitBatch() *commitBatch {
	return &commitBatch{shards: map[uint32]commitShard{}, keys: map[string]struct{}{}, conflicts: map[string]struct{}{}}
}

// reset empties b for a new round, dropping its references to units.
func (b *commitBatch) reset() {
	clear(b.units)
	clear(b.again)
	clear(b.fences)
	clear(b.cmps)
	clear(b.then)
	clear(b.els)
	b.units, b.again, b.fences = b.units[:0], b.again[:0], b.fences[:0]
	b.cmps, b.then, b.els = b.cmps[:0], b.then[:0], b.els[:0]
	clear(b.shards)
	clear(b.keys)
	clear(b.conflicts)
	b.nops = 0
}

// clashes reports whether an op of u writes a key, or has a conflict
// key, already in b or held back.
func (b *commitBatch) clashes(u Unit) bool {
	for i := range u.Ops {
		if _, ok := b.keys[u.Ops[i].Key]; ok {
			return true
		}
		if c := u.Ops[i].Conflict; c != "" {
			if _, ok := b.conflicts[c]; ok {
				return true
			}
		}
	}
	return false
}

// clashesInFlight reports whether an op of u writes a key, or has a
// conflict key, of a Txn in flight.
func (c *Committer) clashesInFlight(u Unit) bool {
	for i := range u.Ops {
		if _, ok := c.busyKeys[u.Ops[i].Key]; ok {
			return true
		}
		if k := u.Ops[i].Conflict; k != "" {
			if _, ok := c.busyConfl[k]; ok {
				return true
			}
		}
	}
	return false
}

// reserve takes u's keys and conflict keys for this round.
func (b *commitBatch) reserve(u Unit) {
	for i := range u.Ops {
		b.keys[u.Ops[i].Key] = struct{}{}
		if c := u.Ops[i].Conflict; c != "" {
			b.conflicts[c] = struct{}{}
		}
	}
}
