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
	// Lease, if not 0, is the lease a put is written on: the owner's
	// member lease for its end markers (locktable.Op.Ephemeral), which
	// then live no longer than the member. A lease etcd no longer has
	// fails the Txn, unless its fences fail first (etcd checks the puts
	// of the branch it takes only), as they do once the member's lease,
	// which carries its owner keys too, is gone.
	Lease clientv3.LeaseID
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
