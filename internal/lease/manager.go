package lease

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/etcdx"
	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// Defaults for Manager options.
const (
	DefaultTTL       = 15 * time.Second
	MaxTTL           = 5 * time.Minute
	MaxHold          = time.Hour
	MaxLockDelay     = time.Minute
	MaxRequestIDLen  = 128
	MinRequestIDLen  = 16
	minSafetyMargin  = 500 * time.Millisecond
	safetyMarginPart = 10 // safe_until = expires_at - max(ttl/10, 500ms), at most ttl/2
)

// cleanupTimeout bounds the revoke of an abandoned waiter's lease; if it
// fails, the lease still ends within its TTL.
const cleanupTimeout = 5 * time.Second

// Manager grants, renews and releases locks. It is safe for concurrent use.
type Manager struct {
	cli        *clientv3.Client
	ks         Keyspace
	defaultTTL time.Duration
	maxTTL     time.Duration
	maxHold    time.Duration
	maxDelay   time.Duration
	maxWaiters int64 // WithMaxWaitersPerLock
	maxOwned   int64 // WithMaxLocksPerIdentity
	caps       caps  // caps.go
	log        *slog.Logger
	now        func() time.Time

	mu      sync.Mutex
	closing bool
	stop    context.Context // cancelled by Close: every wait ends
	halt    context.CancelFunc
	waiters sync.WaitGroup
	bg      sync.WaitGroup // background revokes

	pool   leasePool
	marker markerLease
	batch  batcher
	ka     keepalives
	grants grantCache
	full   fullHints // limit scopes seen full (limits.go)
}

type options struct {
	prefix     string
	defaultTTL time.Duration
	maxTTL     time.Duration
	maxHold    time.Duration
	maxDelay   time.Duration
	maxWaiters int64
	maxOwned   int64
	caps       caps
	log        *slog.Logger
}

// Option configures a Manager.
type Option func(*options)

// WithKeyPrefix sets the etcd key prefix (default "/coordinatord/").
func WithKeyPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// WithDefaultTTL sets the TTL of an Acquire that asks for none (default 15s).
func WithDefaultTTL(d time.Duration) Option { return func(o *options) { o.defaultTTL = d } }

// WithMaxTTL sets the largest TTL an Acquire may ask for (default 5m).
func WithMaxTTL(d time.Duration) Option { return func(o *options) { o.maxTTL = d } }

// WithMaxHoldCap caps how long one grant may be renewed (default 1h): an
// acquisition's own max hold may not exceed it, and without one it applies.
func WithMaxHoldCap(d time.Duration) Option { return func(o *options) { o.maxHold = d } }

// WithLockDelayCap caps the lock-delay an acquisition may ask for (default 1m).
func WithLockDelayCap(d time.Duration) Option { return func(o *options) { o.maxDelay = d } }

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// New returns a Manager over cli.
func New(cli *clientv3.Client, opts ...Option) (*Manager, error) {
	o := options{defaultTTL: DefaultTTL, maxTTL: MaxTTL, maxHold: MaxHold, maxDelay: MaxLockDelay}
	for _, opt := range opts {
		opt(&o)
	}
	if o.maxTTL < time.Second {
		return nil, fmt.Errorf("lease: max TTL %v is below 1s", o.maxTTL)
	}
	if o.defaultTTL < time.Second || o.defaultTTL > o.maxTTL {
		return nil, fmt.Errorf("lease: default TTL %v must be between 1s and the max TTL %v", o.defaultTTL, o.maxTTL)
	}
	if o.maxHold <= 0 || o.maxDelay < 0 {
		return nil, fmt.Errorf("lease: max hold %v must be positive and max lock-delay %v not negative", o.maxHold, o.maxDelay)
	}
	if o.maxWaiters < 0 || o.maxOwned < 0 {
		return nil, fmt.Errorf("lease: max waiters per lock %d and max locks per identity %d must not be negative", o.maxWaiters, o.maxOwned)
	}
	if err := o.caps.validate(); err != nil {
		return nil, err
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	stop, halt := context.WithCancel(context.Background())
	m := &Manager{
		cli:        cli,
		ks:         NewKeyspace(o.prefix),
		defaultTTL: o.defaultTTL,
		maxTTL:     o.maxTTL,
		maxHold:    o.maxHold,
		maxDelay:   o.maxDelay,
		maxWaiters: o.maxWaiters,
		maxOwned:   o.maxOwned,
		caps:       o.caps,
		log:        o.log,
		now:        time.Now,
		stop:       stop,
		halt:       halt,
	}
	m.batch = batcher{cli: cli, spawn: m.spawn}
	m.ka = keepalives{cli: cli, start: m.goOwned, ctx: stop}
	return m, nil
}

// Keyspace is the manager's key layout.
func (m *Manager) Keyspace() keyspace.Keyspace { return m.ks.Keyspace }

// Close ends every wait in progress (their queue keys are removed) and makes
// later Acquires fail with ErrShuttingDown. It waits for the waits to end.
// Grants already made are left alone: they live until released or expired.
func (m *Manager) Close() {
	m.mu.Lock()
	if !m.closing {
		m.closing = true
		m.halt()
	}
	m.mu.Unlock()
	m.waiters.Wait()
	m.bg.Wait()
}

// enter registers an Acquire with Close; the returned context is cancelled
// when ctx is or when Close is called.
func (m *Manager) enter(ctx context.Context) (context.Context, func(), error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closing {
		return nil, nil, ErrShuttingDown
	}
	m.waiters.Add(1)
	ctx, cancel := context.WithCancel(ctx)
	unhook := context.AfterFunc(m.stop, cancel)
	return ctx, func() { unhook(); cancel(); m.waiters.Done() }, nil
}

// record is the value of a queue key.
type record struct {
	Owner      string `json:"owner,omitempty"`
	HandleHash []byte `json:"hh"`
	Since      int64  `json:"since"`             // unix ns: joined the queue
	Acquired   int64  `json:"acq,omitempty"`     // unix ns: granted; 0 while waiting
	MaxHold    int64  `json:"maxhold,omitempty"` // ns: no renewal past Acquired+MaxHold
	LockDelay  int64  `json:"delay,omitempty"`   // ns: the next grant waits this long after an involuntary end
	DelayLease int64  `json:"dl,omitempty"`      // the lease of the lock-delay key, renewed with the grant
	Session    bool   `json:"sess,omitempty"`    // the key is on a session's lease
	TTL        int64  `json:"ttl,omitempty"`     // s: the lease's granted TTL (for recycling it)
	Req        string `json:"req,omitempty"`     // the request record's key, if any
	Ident      string `json:"ih,omitempty"`      // hex sha256 of the identity whose slot it holds (WithIdentity), if any
	WaiterSlot int64  `json:"ws,omitempty"`      // 1 + the index of the lock's waiter slot it holds (WithMaxWaitersPerLock), 0: none
	OwnedSlot  int64  `json:"os,omitempty"`      // 1 + the index of its identity's slot (WithMaxLocksPerIdentity), 0: none
	// The entry's shape (keyspace.Shape, read back by internal/fence under
	// these JSON names): a semaphore's limit (> 1 only), a reader's flag,
	// and a semaphore holder's slot (set by its claim).
	Limit  int32 `json:"lim,omitempty"`
	Shared bool  `json:"sh,omitempty"`
	Slot   int32 `json:"slot,omitempty"`
}

// shape is the entry's shape for the admission rule.
func (r record) shape() keyspace.Shape { return keyspace.Shape{Limit: r.Limit, Shared: r.Shared} }

// How a grant ended, as recorded in its queue key's last value.
const (
	endReleased = "released"
	endForced   = "forced"
)

func (r record) encode() string {
	b, _ := json.Marshal(r) // cannot fail: plain fields
	return string(b)
}

func decodeRecord(v []byte) record {
	var r record
	_ = json.Unmarshal(v, &r) // a foreign value reads as an empty record
	return r
}

// etcdErr classifies an etcd error: the caller's context first, then
// shutdown, then the unavailability conditions.
func (m *Manager) etcdErr(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("lease: %s: %w", op, ctx.Err())
	}
	if m.stop.Err() != nil {
		return ErrShuttingDown
	}
	return classify("lease: "+op, err)
}

// classify wraps the etcd errors that mean "etcd is unavailable, retry" in
// ErrUnavailable, and etcd's "database space exceeded" in ErrStoreFull
// (etcdx.Classify).
func classify(op string, err error) error { return etcdx.Classify(op, err) }

// Limits are the manager's limits on waiters per lock and locks per
// identity (0: none), for a core that enforces them elsewhere.
func (m *Manager) Limits() (maxWaitersPerLock, maxLocksPerIdentity int64) {
	return m.maxWaiters, m.maxOwned
}
