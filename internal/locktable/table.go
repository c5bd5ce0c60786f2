package locktable

import (
	"fmt"
	"sort"
	"time"
)

// Config is a table's fixed parameters.
type Config struct {
	// Prefix is the shard's key prefix: a grant's key is
	// Prefix + Escape(name) + "/" + grant id.
	Prefix string
	// Escape turns a name into one key segment (keyspace.Escape).
	Escape func(string) string
	// Term is the owner's fence (its owner key's create revision): grant
	// ids start with it, so no two owners ever make the same id.
	Term int64
	// Incarnation tells apart the tables one owner loads in one term (it
	// reloads after a commit of unknown outcome): grant ids carry it too,
	// so a reload never makes an id, and a key, again.
	Incarnation uint64
	// MaxWaiters bounds each lock's queue; 0: unbounded.
	MaxWaiters int
	// EndedPrefix is where units put the end markers of the grants they
	// release or force-release (ended.go): a lock's is EndedPrefix +
	// Escape(name). "": no markers.
	EndedPrefix string
}

type grantState int

const (
	pending grantState = iota // decided, its put not yet committed: invisible, unanswered
	live                      // committed: visible, renewable, releasable
	ending                    // its end decided, its delete not yet committed: still visible
)

// grant is one holder of a lock.
type grant struct {
	rec          Record
	key          string
	token        int64
	state        grantState
	acquiredAt   time.Time
	expires      time.Time
	maxHoldUntil time.Time // zero: no max hold
	lockDelay    time.Duration
	secret       []byte   // the handle's secret until its first answer (then only its sum is kept)
	calls        []CallID // Acquires answered when its put commits
	endCalls     []CallID // Releases answered when its delete commits
	retried      bool     // a retry of its request id took over its call
	endExpired   bool     // end was decided by an expiry (or ForceRelease), for Ended
	endForced    bool     // end was decided by ForceRelease, for Ended
}

// waiter is a queued Acquire.
type waiter struct {
	a        Acquire
	since    time.Time
	deadline time.Time
	reqKey   string
	retried  bool     // a retry of its request id took over its call
	more     []CallID // the calls of retries of its request id that share its place
}

// callIDs are every call the waiter answers: its own, then its retries'.
func (w *waiter) callIDs() []CallID { return append([]CallID{w.a.Call}, w.more...) }

// lock is one name's holders (in grant order) and FIFO waiters.
type lock struct {
	name       string
	limit      int32 // in force while the lock has holders or waiters: 1, or a semaphore's N
	holders    []*grant
	waiters    []*waiter
	delayUntil time.Time // lock-delay after an expiry
	// slotDelay: a semaphore's lock-delay, per slot (the slot of the holder
	// whose grant expired).
	slotDelay map[int32]time.Time
}

// unitState is what a unit in flight will do when it commits.
type unitState struct {
	puts, ends []*grant
}

// Table is one shard's locks. See the package documentation.
type Table struct {
	cfg      Config
	locks    map[string]*lock
	grants   map[string]*grant  // by grant id
	requests map[string]*grant  // by request digest: grants not yet ended
	queued   map[string]*waiter // by request digest: waiters with a request id
	waiting  map[CallID]*waiter // every waiter, by its call
	calls    map[CallID]*grant  // Acquires waiting for their grant's commit
	inflight map[uint64]*unitState
	seq      uint64 // grant ids
	unitSeq  uint64
	open     *unitState // the unit being built
	openOps  []Op
	out      []Unit
	replies  []Reply
	ended    []Ended
	timers   deadlines
	dead     bool
}

// New returns an empty table.
func New(cfg Config) *Table {
	if cfg.Escape == nil {
		cfg.Escape = func(s string) string { return s }
	}
	return &Table{
		cfg: cfg, locks: map[string]*lock{}, grants: map[string]*grant{},
		requests: map[string]*grant{}, queued: map[string]*waiter{},
		waiting: map[CallID]*waiter{}, calls: map[CallID]*grant{},
		inflight: map[uint64]*unitState{},
	}
}

// Ready hands over the units to persist, in order, and the replies to send,
// made since the last Ready.
func (t *Table) Ready() Ready {
	t.closeUnit()
	r := Ready{Units: t.out, Replies: t.replies, Ended: t.ended}
	t.out, t.replies, t.ended = nil, nil, nil
	return r
}

// HasReady says whether Ready has anything to hand over.
func (t *Table) HasReady() bool {
	return len(t.out) > 0 || len(t.replies) > 0 || len(t.openOps) > 0 || len(t.ended) > 0
}

// Fail drops the table: every call in progress is answered Unavailable and
// every later call too. The owner calls it when the shard is lost or a
// commit's outcome is unknown, and loads a new table from etcd once
// nothing of this one is in flight.
func (t *Table) Fail() {
	if t.dead {
		return
	}
	t.dead = true
	for c := range t.waiting {
		t.reply(Reply{Call: c, Outcome: Unavailable})
	}
	for c := range t.calls {
		t.reply(Reply{Call: c, Outcome: Unavailable})
	}
	for _, g := range t.grants {
		for _, c := range g.endCalls {
			t.reply(Reply{Call: c, Outcome: Unavailable})
		}
	}
	// Hook for the owner's grant watchers: every visible grant (live, or
	// ending with its delete not known to have committed) is reported
	// Dropped; pending grants were never answered, so nobody watches them.
	var dropped []Ended
	for _, g := range t.grants {
		if g.state != pending {
			dropped = append(dropped, Ended{Name: g.rec.Name, Token: g.token, Dropped: true})
		}
	}
	sort.Slice(dropped, func(i, j int) bool {
		a, b := dropped[i], dropped[j]
		return a.Name < b.Name || (a.Name == b.Name && a.Token < b.Token)
	})
	t.ended = append(t.ended, dropped...)
	clear(t.waiting)
	clear(t.calls)
	t.openOps, t.open, t.out = nil, nil, nil
	sort.Slice(t.replies, func(i, j int) bool { return t.replies[i].Call < t.replies[j].Call })
}

// Dead says whether Fail dropped the table.
func (t *Table) Dead() bool { return t.dead }

// Loaded is a grant as etcd keeps it, for Load.
type Loaded struct {
	Key    string
	Token  int64 // the key's create revision
	Record Record
}

// Load takes over the grants a previous owner persisted. Each is honoured
// for its full TTL from now: renewals were memory-only, so the previous
// owner may have promised that much just before it stopped.
func (t *Table) Load(now time.Time, grants []Loaded) {
	for _, l := range grants {
		r := l.Record
		ttl := time.Duration(r.TTLms) * time.Millisecond
		g := &grant{rec: r, key: l.Key, token: l.Token, state: live,
			acquiredAt: time.UnixMilli(r.AcquiredMs), expires: now.Add(ttl),
			lockDelay: time.Duration(r.LockDelayMs) * time.Millisecond}
		if r.MaxHoldMs > 0 {
			left := time.UnixMilli(r.AcquiredMs).Add(time.Duration(r.MaxHoldMs) * time.Millisecond).Sub(now)
			g.maxHoldUntil = now.Add(max(left, 0))
		}
		lk := t.lockOf(r.Name)
		lk.limit = max(r.Limit, 1)
		lk.holders = append(lk.holders, g)
		t.grants[r.ID] = g
		if r.RequestID != "" {
			t.requests[r.RequestID] = g
		}
		t.timers.push(g.expires, g, nil, nil)
	}
	for _, lk := range t.locks {
		sort.Slice(lk.holders, func(i, j int) bool { return lk.holders[i].token < lk.holders[j].token })
	}
}

func (t *Table) lockOf(name string) *lock {
	lk := t.locks[name]
	if lk == nil {
		lk = &lock{name: name}
		t.locks[name] = lk
	}
	return lk
}

// forget drops a lock with neither holders nor waiters nor a lock-delay
// (its limit with it).
func (t *Table) forget(lk *lock, now time.Time) {
	if len(lk.holders) == 0 && len(lk.waiters) == 0 && !lk.delayUntil.After(now) && !slotDelayed(lk, now) {
		delete(t.locks, lk.name)
	}
}

func (t *Table) reply(r Reply) { t.replies = append(t.replies, r) }

// unit is the unit being built, opened on first use.
func (t *Table) unit() *unitState {
	if t.open == nil {
		t.open = &unitState{}
	}
	return t.open
}

// closeUnit moves the unit being built, if any, to the output.
func (t *Table) closeUnit() {
	if t.open == nil {
		return
	}
	t.markEnds() // how its grants ended, for the watchers (ended.go)
	t.unitSeq++
	t.inflight[t.unitSeq] = t.open
	t.out = append(t.out, Unit{ID: t.unitSeq, Ops: t.openOps})
	t.open, t.openOps = nil, nil
}

// newGrantID is a grant id unique across owners and their reloads: the
// term, the incarnation, then a sequence.
func (t *Table) newGrantID() string {
	t.seq++
	return fmt.Sprintf("%x-%x-%x", t.cfg.Term, t.cfg.Incarnation, t.seq)
}

// slotDelayed says whether a slot of the lock is still in its lock-delay
// (and drops the delays that passed).
func slotDelayed(lk *lock, now time.Time) bool {
	for s, until := range lk.slotDelay {
		if !until.After(now) {
			delete(lk.slotDelay, s)
		}
	}
	return len(lk.slotDelay) > 0
}
