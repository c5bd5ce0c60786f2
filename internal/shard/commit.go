package shard

// The Committer persists the owner's decisions: units of etcd writes, each
// for one shard, committed in guarded group commits, several Txns at once.
//
//   - Group commit, pipelined: up to maxInflight Txns (WithMaxInflight,
//     default 4) are in flight at once, at most one per shard. One
//     dispatching goroutine builds a Txn from the waiting units whenever
//     fewer than maxInflight are in flight and some waiting unit's shard
//     and keys are not in flight; a fixed pool of maxInflight senders
//     commits them. Units that cannot go now wait; when a Txn returns, the
//     next takes as many waiting units as fit, first come first. A lone
//     unit is sent at once: no timer, so an idle owner pays one round trip
//     and a busy one pays one Txn per round trip and slot, whatever its
//     rate. With maxInflight 1 it is one Txn at a time, as before.
//   - One Txn in flight per shard, and a Txn's Done callbacks all return
//     before any later Txn with one of its shards is built. Txns in flight
//     together may apply in any order, or in one etcd batch, and the fence
//     does not order them (both pass the same compare). So per-shard
//     exclusivity is what keeps a shard's units in submission order: a
//     hand-off's delete of the old holder and put of the new may be in two
//     consecutive units of one shard, on different keys; applied out of
//     order etcd would hold two holders for a while, and a crash then would
//     load both into the next table. And a unit decided after one whose
//     commit has an unknown outcome was decided on a state etcd may not
//     have: the runtime's Done marks the shard broken so that its Guard
//     refuses it, and that works only because no later Txn of the shard
//     was built, or sent, before that Done returned.
//   - No key, and no conflict key, is in two Txns in flight at once (they
//     might apply in any order) nor twice in one Txn: etcd rejects
//     duplicate keys in a Txn, and two writes of one key in one revision
//     can lose data after compaction and restart (etcd #22376, #16380). A
//     lock's grant puts share a conflict key so that a name gets at most
//     one new grant per revision.
//   - Fenced by ownership: every shard in a Txn adds the compare
//     CreateRevision(owner key) == the create revision its Guard gave. A
//     deposed owner (its owner key deleted, or created again by another
//     replica) writes nothing, because etcd checks the fence in the same
//     revision as the writes. Its units fail with OwnershipLostError (safe
//     to retry: nothing was applied); the units of the other shards of that
//     Txn were not applied either and go first in the next ones, in order.
//   - At most maxTxnOps ops and maxTxnOps compares per Txn: etcd's
//     --max-txn-ops, 128 by default, bounds each of them.
//   - A shard's units commit in the order they were submitted, and so do
//     a key's: a unit that must wait (its shard or a key in flight, or a
//     full Txn) holds back the later units of its shard and of its keys,
//     so a Txn never carries a unit ahead of one it follows. Units of
//     other shards still fill the Txn.
//   - Outcomes are definite where etcd gave one: a unit's Done gets the
//     revision of the Txn that applied it, OwnershipLostError, ErrClosed
//     (never sent) or a validation error (never sent); only a failed etcd
//     call gives UnknownOutcomeError.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Op is one etcd write of a shard's state.
type Op struct {
	Key    string
	Value  string
	Delete bool // delete Key (Value ignored)
	// Conflict names what no two ops of one Txn may share; "" means Key.
	// (A lock's grant puts share the conflict "grant:"+name so that one
	// name gets at most one new grant per revision.) Two ops of one Txn
	// never write one Key either, whatever their Conflict.
	Conflict string
}

// Unit is ops that commit atomically together, for one shard, in order
// with that shard's other units.
type Unit struct {
	Shard uint32
	Ops   []Op
	// Done is called exactly once, from one of the committer's goroutines
	// (or inline in Submit after Close): rev is the revision of the Txn
	// that carried the unit (the create revision of every key it put), or
	// err. The Dones of a Txn's units all return before any later Txn with
	// one of their shards is built (so a Done that makes the Guard refuse
	// its shard stops the shard's later units), and the Dones of one shard
	// never run concurrently; those of different shards may. It may call
	// Submit; it must not call Close.
	Done func(rev int64, err error)
}

// Guard returns the fence of a shard: its owner key and the create
// revision that key must still have. ok=false: this replica does not own
// the shard now. It is called from the committer's dispatching goroutine
// while it builds a Txn, so it should not block: never for a shard in
// flight, but possibly while Dones of other shards run. A createRev below
// 1 counts as ok=false (a missing key's CreateRevision is 0: it would
// fence nothing).
type Guard func(shard uint32) (key string, createRev int64, ok bool)

var (
	// ErrClosed: the Committer was closed before the unit was sent.
	ErrClosed = errors.New("shard: committer closed; the unit was not written")
	// ErrOwnershipLost is what every OwnershipLostError is.
	ErrOwnershipLost = errors.New("shard: ownership lost")
	// ErrUnknownOutcome is what every UnknownOutcomeError is.
	ErrUnknownOutcome = errors.New("shard: etcd transaction outcome unknown")
	// errUnitTooLarge: a unit's ops alone exceed one Txn's limit.
	errUnitTooLarge = errors.New("shard: unit has more ops than one etcd transaction may hold; it was not written")

	// errCommitDuplicate: a unit writes one key, or one conflict key,
	// twice (see #22376 above). Units never do by contract.
	errCommitDuplicate = errors.New("shard: unit has two ops on one key or conflict key; it was not written")
)

// OwnershipLostError: the fence of Shard failed (or its Guard said this
// replica does not own it): nothing of the unit was written.
type OwnershipLostError struct{ Shard uint32 }

func (e *OwnershipLostError) Error() string {
	return fmt.Sprintf("shard %d: ownership was lost; nothing was written and the call is safe to retry", e.Shard)
}

// Is makes errors.Is(err, ErrOwnershipLost) true.
func (e *OwnershipLostError) Is(target error) bool { return target == ErrOwnershipLost }

// UnknownOutcomeError: etcd failed the Txn (timeout, unavailable,
// canceled): it may or may not have applied.
type UnknownOutcomeError struct{ Err error }

func (e *UnknownOutcomeError) Error() string {
	return "shard: etcd transaction failed; it may or may not have applied: " + e.Err.Error()
}

// Unwrap is Err.
func (e *UnknownOutcomeError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrUnknownOutcome) true.
func (e *UnknownOutcomeError) Is(target error) bool { return target == ErrUnknownOutcome }

// CommitStats counts what was committed so far.
type CommitStats struct{ Txns, Units, Ops int64 }

type commitOptions struct {
	maxTxnOps   int
	maxInflight int
	timeout     time.Duration
}

// commitDefaults are the options before any CommitOption.
func commitDefaults() commitOptions {
	return commitOptions{maxTxnOps: 128, maxInflight: 4, timeout: 5 * time.Second}
}

// CommitOption configures a Committer.
type CommitOption func(*commitOptions)

// WithMaxTxnOps bounds the ops, and the shards, of one Txn (default 128,
// etcd's --max-txn-ops default; it must not exceed the server's). n < 1
// means 1.
func WithMaxTxnOps(n int) CommitOption {
	return func(o *commitOptions) { o.maxTxnOps = max(n, 1) }
}

// WithMaxInflight bounds the Txns in flight at once (default 4), each of
// other shards and keys. n < 1 means 1: one Txn at a time.
func WithMaxInflight(n int) CommitOption {
	return func(o *commitOptions) { o.maxInflight = max(n, 1) }
}

// WithCommitTimeout bounds each Txn (default 5s); d <= 0 keeps the default.
func WithCommitTimeout(d time.Duration) CommitOption {
	return func(o *commitOptions) {
		if d > 0 {
			o.timeout = d
		}
	}
}

// commitScanFactor bounds the waiting units one Txn looks at to
// commitScanFactor*maxTxnOps: units held back (conflicts, full Txn) stay
// waiting, and a long backlog costs each Txn a bounded scan.
const commitScanFactor = 8

// Committer commits Units to etcd: see the top of this file.
type Committer struct {
	kv     clientv3.KV
	guard  Guard
	opt    commitOptions
	ctx    context.Context // parent of every Txn's; canceled by Close once the goroutines are gone
	cancel context.CancelFunc
	wake   chan struct{} // capacity 1: the dispatcher has work
	exited chan struct{}

	mu     sync.Mutex
	queue  []commitPending // submitted, not yet taken by the dispatcher
	seq    uint64
	closed bool

	txns, units, ops atomic.Int64

	sendq   chan *commitBatch // built Txns, to the senders (capacity maxInflight)
	doneq   chan *commitBatch // answered Txns, back to the dispatcher (capacity maxInflight)
	senders sync.WaitGroup

	// The dispatcher's own.
	waiting   []commitPending // taken from the queue, not yet sent, in order
	free      []*commitBatch  // batches not in flight
	inflight  int
	busy      map[uint32]struct{} // shards of the Txns in flight
	busyKeys  map[string]struct{} // keys of the Txns in flight
	busyConfl map[string]struct{} // conflict keys of the Txns in flight
}

// commitPending is a unit and its submission number.
type commitPending struct {
	u   Unit
	seq uint64
}

// NewCommitter starts a Committer writing through kv, fenced by guard.
func NewCommitter(kv clientv3.KV, guard Guard, opts ...CommitOption) *Committer {
	o := commitDefaults()
	for _, opt := range opts {
		opt(&o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Committer{kv: kv, guard: guard, opt: o, ctx: ctx, cancel: cancel,
		wake: make(chan struct{}, 1), exited: make(chan struct{}),
		sendq: make(chan *commitBatch, o.maxInflight), doneq: make(chan *commitBatch, o.maxInflight),
		busy: map[uint32]struct{}{}, busyKeys: map[string]struct{}{}, busyConfl: map[string]struct{}{}}
	for range o.maxInflight {
		c.free = append(c.free, newCommitBatch())
		c.senders.Go(c.sender)
	}
	go c.run()
	return c
}

// Submit queues u; it never waits for etcd. After Close, u.Done(0,
// ErrClosed) is called at once, inline.
func (c *Committer) Submit(u Unit) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		commitFinish(u, 0, ErrClosed)
		return
	}
	c.seq++
	c.queue = append(c.queue, commitPending{u: u, seq: c.seq})
	c.mu.Unlock()
	c.poke()
}

// poke wakes the dispatcher.
func (c *Committer) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Close fails every unit not yet sent with ErrClosed, waits for the Txns
// in flight (their units get their outcomes: they are not aborted, so
// Close may take up to the commit timeout) and for the goroutines.
// Closing twice is harmless. It must not be called from a Done.
func (c *Committer) Close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.poke()
	<-c.exited
	c.cancel()
}

// isClosed reports whether Close was called.
func (c *Committer) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Stats is what was committed so far.
func (c *Committer) Stats() CommitStats {
	return CommitStats{Txns: c.txns.Load(), Units: c.units.Load(), Ops: c.ops.Load()}
}

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

// send commits b's Txn: its fences, then its units' ops, else the owner
// keys.
func (c *Committer) send(b *commitBatch) (*clientv3.TxnResponse, error) {
	for _, f := range b.fences {
		b.cmps = append(b.cmps, clientv3.Compare(clientv3.CreateRevision(f.key), "=", f.rev))
		b.els = append(b.els, clientv3.OpGet(f.key))
	}
	for _, p := range b.units {
		for _, op := range p.u.Ops {
			if op.Delete {
				b.then = append(b.then, clientv3.OpDelete(op.Key))
			} else {
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
