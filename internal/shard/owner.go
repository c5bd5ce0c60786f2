package shard

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/locktable"
)

// Owner is one member replica's side of the shard-owner core: the shards
// it owns, each a locktable.Table behind a mutex, the one Committer that
// persists every shard's units (guarded by the owner keys), the member's
// Lease whose deadline bounds every answer, and the Ownership that decides
// which shards are its own.
//
// A call on a shard this replica does not own, or owns but cannot answer
// now (loading, past the lease deadline, dropped after a commit of unknown
// outcome), fails with a *NotServingError, which says which member owns it
// if that is known (for forwarding) and is safe to retry.
type Owner struct {
	cli    *clientv3.Client
	prefix string
	com    *Committer
	clock  Clock
	log    *slog.Logger
	shards []*shardState
	cfg    ownerOptions

	nextCall    atomic.Uint64
	incarnation atomic.Uint64
	closing     atomic.Bool
	drops       atomic.Int64 // tables dropped (Status)
	rejoins     atomic.Int64 // lives after a lost lease (Status)
	member      atomic.Pointer[member]
	memberMu    sync.Mutex // orders a rejoin's publication with Close
	ctx         context.Context
	cancel      context.CancelFunc
	wg          sync.WaitGroup // loads and timers in progress
	closeOnce   sync.Once
	creating    markCreators   // serialises one identity's mark creations (marks.go)
	ident       *identityLimit // the per-identity lock limit (identity.go); nil: none
}

// shardState is one shard as this replica serves it.
type shardState struct {
	n      uint32
	broken atomic.Bool // a commit failed: send nothing more of this table (the committer's guard reads it)
	// storeFull: the last commit failed on etcd's storage quota (NOSPACE),
	// so the calls its drop answers Unavailable answer STORE_FULL instead.
	storeFull atomic.Bool

	mu       sync.Mutex
	tab      *locktable.Table // nil: not served
	gen      uint64           // bumped with every table: results of an older one are ignored
	term     int64            // the owner key's create revision, 0 when not owned
	answers  map[locktable.CallID]chan locktable.Reply
	inflight int // units submitted and not yet done, any table's
	timer    *time.Timer
	timerAt  time.Time
	loading  bool
	ends     endings // WatchGrant's watches and recent ends (endings.go)

	marks map[string]markEntry // cached resource marks (marks.go); cleared by drop

	sessions map[string]*sessionEntry // the sessions of this home shard (sessions.go); loaded with the table
}

type ownerOptions struct {
	ttl        time.Duration
	count      int
	memberID   string
	advertise  string
	relay      bool
	clock      Clock
	log        *slog.Logger
	maxWaiters int
	adoptAfter time.Duration
	markLimit  *int64 // WithMarkLimit; nil: fence.DefaultMarkLimit
	maxLocks   int64  // WithMaxLocksPerIdentity; 0: no limit
}

// OwnerOption configures NewOwner.
type OwnerOption func(*ownerOptions)

// WithLeaseTTL sets the member lease's TTL (default 5s): a crashed owner's
// shards serve again about this long after its last renewal.
func WithLeaseTTL(d time.Duration) OwnerOption { return func(o *ownerOptions) { o.ttl = d } }

// WithShards sets the shard count (default 256; fixed per cluster).
func WithShards(n int) OwnerOption { return func(o *ownerOptions) { o.count = n } }

// WithMember sets the member's id and the address its peers forward to.
func WithMember(id, advertise string) OwnerOption {
	return func(o *ownerOptions) { o.memberID, o.advertise = id, advertise }
}

// AsRelay makes the replica a relay: it owns nothing and only forwards.
func AsRelay() OwnerOption { return func(o *ownerOptions) { o.relay = true } }

// WithClock sets the clock of the lease deadline and of the tables (tests
// skew it).
func WithClock(c Clock) OwnerOption { return func(o *ownerOptions) { o.clock = c } }

// WithOwnerLogger sets the logger.
func WithOwnerLogger(l *slog.Logger) OwnerOption { return func(o *ownerOptions) { o.log = l } }

// WithMaxWaitersPerLock bounds each lock's queue (0: unbounded).
func WithMaxWaitersPerLock(n int) OwnerOption { return func(o *ownerOptions) { o.maxWaiters = n } }

// WithMarkLimit caps the resource marks one identity may create (0: no
// cap, still counted; default fence.DefaultMarkLimit). See marks.go.
func WithMarkLimit(n int64) OwnerOption { return func(o *ownerOptions) { o.markLimit = &n } }

// NewOwner starts a member (or relay) of the shard-owner core on etcd under
// the key prefix: its lease, its committer, its ownership. It returns once
// registered; the shards it wins are served as each is loaded.
func NewOwner(ctx context.Context, cli *clientv3.Client, prefix string, opts ...OwnerOption) (*Owner, error) {
	cfg := ownerOptions{ttl: 5 * time.Second, count: 256, clock: RealClock(), log: slog.New(slog.DiscardHandler), adoptAfter: 3 * time.Second}
	for _, opt := range opts {
		opt(&cfg)
	}
	o := &Owner{cli: cli, prefix: keyspace.New(prefix).Prefix(), clock: cfg.clock, log: cfg.log, cfg: cfg}
	o.ctx, o.cancel = context.WithCancel(context.Background())
	o.shards = make([]*shardState, cfg.count)
	for i := range o.shards {
		o.shards[i] = &shardState{n: uint32(i), answers: map[locktable.CallID]chan locktable.Reply{}}
	}
	o.ident = newIdentityLimit(o) // before any shard is won: the tables' ends reach it
	// One Txn in flight: on this machine (etcd in its own process, on local
	// disk) 4 in flight measured no faster (uncontended, 64 clients: 0.96x
	// and 0.88x the Mutex against 1.59x and 1.25x with one, alternated
	// runs), as etcd batches by fsync anyway; against a networked etcd
	// WithMaxInflight may pay off.
	o.com = NewCommitter(cli, o.guard, WithMaxInflight(1))
	m, err := o.join(ctx)
	if err != nil {
		o.com.Close()
		o.cancel()
		return nil, err
	}
	o.member.Store(m)
	o.wg.Add(2)
	go o.keepMember()
	go func() {
		defer o.wg.Done()
		o.reapSessions()
	}()
	o.startIdentityLimit() // its goroutines stop with o.ctx, awaited by o.wg
	return o, nil
}

// member is one life of this replica as a member: its lease and the
// ownership campaigned with it. A lease etcd has lost cannot come back;
// the replica joins again with a new one (keepMember).
type member struct {
	lease *Lease
	own   *Ownership
}

// current is the member's present life.
func (o *Owner) current() *member { return o.member.Load() }

// join grants a new lease and registers and campaigns with it.
func (o *Owner) join(ctx context.Context) (*member, error) {
	cfg := o.cfg
	l, err := NewLease(ctx, o.cli, cfg.ttl, cfg.clock)
	if err != nil {
		return nil, err
	}
	ownOpts := []OwnershipOption{WithShardCount(cfg.count), WithRole(cfg.relay), WithOwnershipLogger(cfg.log), WithAdoptAfter(cfg.adoptAfter)}
	if cfg.memberID != "" {
		ownOpts = append(ownOpts, WithMemberID(cfg.memberID))
	}
	if cfg.advertise != "" {
		ownOpts = append(ownOpts, WithAdvertise(cfg.advertise))
	}
	own, err := NewOwnership(ctx, o.cli, o.prefix, l, Callbacks{Acquired: o.acquired, Lost: o.lost}, ownOpts...)
	if err != nil {
		l.Close(ctx)
		return nil, err
	}
	return &member{lease: l, own: own}, nil
}

// keepMember joins again whenever the member's lease is lost (cut off from
// etcd past its TTL: the old Ownership has dropped every shard and
// campaigns no more). Without it such a replica never owned a shard again
// until restarted, and with the other members gone nobody did (the chaos
// suite found it). It stops when the Owner closes.
func (o *Owner) keepMember() {
	defer o.wg.Done()
	for {
		old := o.current()
		select {
		case <-o.ctx.Done():
			return
		case <-old.lease.Lost():
		}
		if o.ctx.Err() != nil || o.closing.Load() {
			return
		}
		o.log.Warn("shard: the member's lease was lost; joining again with a new lease")
		cctx, cancel := context.WithTimeout(o.ctx, old.lease.TTL())
		old.own.Close(cctx) // its shards were dropped already: this stops its goroutine
		cancel()
		old.lease.Close(o.ctx)
		if !o.rejoin() {
			return
		}
	}
}

// rejoin joins again, retrying with a growing pause until it succeeds or
// the Owner closes (false). The new life is published under memberMu so
// that Close closes whichever life is current.
func (o *Owner) rejoin() bool {
	for attempt := 0; ; attempt++ {
		m, err := o.join(o.ctx)
		if err == nil {
			o.memberMu.Lock()
			defer o.memberMu.Unlock()
			if o.closing.Load() {
				cctx, cancel := context.WithTimeout(context.Background(), o.cfg.ttl)
				defer cancel()
				m.own.Close(cctx)
				m.lease.Close(cctx)
				return false
			}
			o.member.Store(m)
			o.rejoins.Add(1)
			return true
		}
		o.log.Warn("shard: joining again failed; retrying", "err", err)
		select {
		case <-o.ctx.Done():
			return false
		case <-time.After(min(time.Duration(attempt+1)*100*time.Millisecond, 2*time.Second)):
		}
	}
}

// guard is the committer's fence: a shard's owner key, while this replica
// owns the shard, its lease deadline has not passed, and its table has not
// been dropped (a unit queued behind a commit of unknown outcome must not
// reach etcd: it was decided on a state etcd may not have).
func (o *Owner) guard(shard uint32) (string, int64, bool) {
	if o.shards[shard].broken.Load() {
		return "", 0, false
	}
	return o.current().own.Guard(shard)
}

// ShardOf is the shard of a name.
func (o *Owner) ShardOf(name string) uint32 { return ShardOf(name, len(o.shards)) }

// Ownership is the replica's view of who owns what.
func (o *Owner) Ownership() *Ownership { return o.current().own }

// Lease is the member's lease.
func (o *Owner) Lease() *Lease { return o.current().lease }

// Stats are the committer's counts.
func (o *Owner) Stats() CommitStats { return o.com.Stats() }

// dataPrefix is where a shard's grants live.
func (o *Owner) dataPrefix(shard uint32) string {
	return fmt.Sprintf("%sshards/data/%05d/", o.prefix, shard)
}

// Close hands every shard over gracefully, unless HandOver did already
// (new calls are refused, the units in flight commit until ctx ends, the
// owner keys are deleted so that the next owners start at once), then the
// ownership view, the committer and the lease stop. Waiters are answered
// Unavailable (they re-join elsewhere).
func (o *Owner) Close(ctx context.Context) {
	o.closeOnce.Do(func() {
		o.HandOver(ctx)
		m := o.current() // HandOver's: closing, no life is published any more
		m.own.Close(ctx)
		o.cancel()
		o.com.Close()
		o.wg.Wait()
		for _, s := range o.shards {
			s.mu.Lock()
			o.drop(s)
			s.stopTimer()
			s.mu.Unlock()
		}
		m.lease.Close(ctx)
	})
}

// awaitQuiet waits until no shard has a unit in flight, or ctx ends.
func (o *Owner) awaitQuiet(ctx context.Context) {
	for {
		busy := false
		for _, s := range o.shards {
			s.mu.Lock()
			busy = busy || s.inflight > 0
			s.mu.Unlock()
		}
		if !busy || ctx.Err() != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Millisecond):
		}
	}
}

// NotServingError: this replica cannot answer for the shard now. Owner is
// the member that owns it, if known and not this one (forward there).
type NotServingError struct {
	Shard  uint32
	Owner  string
	Addr   string
	Reason string
}

func (e *NotServingError) Error() string {
	if e.Owner != "" {
		return fmt.Sprintf("shard %d is owned by member %s (%s): %s; retry there, or on any replica, with the same request id", e.Shard, e.Owner, e.Addr, e.Reason)
	}
	return fmt.Sprintf("shard %d is not served here now: %s; retry shortly with the same request id", e.Shard, e.Reason)
}

// ErrNotServing matches every *NotServingError.
var ErrNotServing = errors.New("shard: not served here")

// Is makes errors.Is(err, ErrNotServing) true.
func (e *NotServingError) Is(target error) bool { return target == ErrNotServing }

// serving checks, under s.mu, that s's table may answer now.
func (o *Owner) serving(s *shardState) error {
	switch {
	case o.closing.Load():
		return &NotServingError{Shard: s.n, Reason: "this replica is shutting down"}
	case s.term == 0:
		id, addr, _ := o.current().own.Owner(s.n)
		return &NotServingError{Shard: s.n, Owner: id, Addr: addr, Reason: "another member owns it, or nobody does yet"}
	case s.tab == nil || s.tab.Dead():
		return &NotServingError{Shard: s.n, Reason: "its state is being loaded from etcd"}
	case !o.current().lease.Valid():
		return &NotServingError{Shard: s.n, Reason: "this member's lease deadline passed before etcd confirmed a renewal"}
	}
	return nil
}

func randomSecret() (s [16]byte) {
	_, _ = rand.Read(s[:]) // crypto/rand.Read never fails (Go 1.24+)
	return s
}
