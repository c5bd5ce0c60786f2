// Package counter is coordinatord's rate-limit counters on etcd: anchored
// fixed windows and token buckets, exact across replicas, idempotent by
// request id, batched.
//
// A counter is one etcd key (keyspace.Counter) whose value is its whole
// state, the window's end included: the value is its own clock, so a
// window that ended is a fresh window and never a stale count, and the
// counter is created with its end in one transaction (no INCR-then-EXPIRE
// gap that leaves a counter without expiry when a caller dies between the
// two). Every hit is a compare-and-swap on the key's mod revision (etcd has
// no atomic increment), so the count never exceeds the limit whatever the
// concurrency or the number of replicas (DESIGN.md invariant 9).
//
// The key rides on a shared, coarse lease (leases.go) only so that idle
// counters are cleaned up: a lease outlives the window it covers by a
// slack, since etcd lease expiry is whole seconds, lags under load and
// restarts on a leader change. Updates inside the lease's span keep it with
// WithIgnoreLease (a Put without it would silently detach the key).
//
// Concurrent hits in one replica are group-committed (batch.go): hits on
// one counter are decided in arrival order against the state read at one
// revision and written once; hits on different counters ride in one Txn,
// each counter its own nested compare; a lone hit is committed at once.
//
// The package speaks domain errors (errors.go); gRPC is internal/server's.
package counter

import (
	"context"
	"errors"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/etcdx"
	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// Algorithm is how a counter counts.
type Algorithm int

// The algorithms.
const (
	// FixedWindow: at most limit hits per window, anchored at its first hit.
	FixedWindow Algorithm = 1
	// TokenBucket: a bucket of limit tokens refilled at limit per window.
	TokenBucket Algorithm = 2
)

func (a Algorithm) String() string {
	if a == TokenBucket {
		return "token_bucket"
	}
	return "fixed_window"
}

// Policy is what Hit answers when etcd is unavailable.
type Policy int

// The policies.
const (
	// PolicyDefault is the service's policy (WithPolicy).
	PolicyDefault Policy = iota
	// FailClosed answers ErrUnavailable; nothing is counted.
	FailClosed
	// FailOpen answers allowed, Uncounted.
	FailOpen
)

// Hit is one call's hits on one counter.
type Hit struct {
	Name      string
	Hits      int64 // 0: a peek
	Limit     int64
	Window    time.Duration
	Algorithm Algorithm // 0: FixedWindow
	RequestID string    // optional idempotency key, the Identity's own
	Identity  string    // the authenticated caller ("" without authentication)
	Policy    Policy
}

// Result is the answer to a Hit.
type Result struct {
	// Allowed: the hits were counted (unless Uncounted). For a peek: one
	// hit would be allowed now.
	Allowed    bool
	Count      int64
	Remaining  int64
	ResetAt    time.Time     // zero when the counter holds nothing
	RetryAfter time.Duration // refused: until the same hits may be allowed
	Uncounted  bool          // FailOpen answered while etcd was unavailable
	Replayed   bool          // the recorded answer of the same request id
}

// Counter is what Get answers.
type Counter struct {
	Exists    bool
	Algorithm Algorithm
	Count     int64
	Limit     int64
	Remaining int64
	Window    time.Duration
	ResetAt   time.Time
}

// Limits of the input.
const (
	MinWindow       = time.Millisecond
	MaxWindow       = 366 * 24 * time.Hour
	MinRequestIDLen = 16
	MaxRequestIDLen = 128
)

// Service is the counters of one coordinator. Close it to stop its
// committers.
type Service struct {
	cli    *clientv3.Client
	txns   *etcdx.Txns
	ks     keyspace.Keyspace
	o      options
	leases *leasePool
	b      *batcher
}

type options struct {
	prefix      string
	policy      Policy
	timeout     time.Duration
	granularity time.Duration
	slack       time.Duration
	retention   time.Duration
	log         *slog.Logger
}

// Option configures New.
type Option func(*options)

// WithKeyPrefix sets the etcd key prefix (the lease manager's).
func WithKeyPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// WithPolicy sets the unavailable-store policy of hits that name none
// (default FailClosed).
func WithPolicy(p Policy) Option { return func(o *options) { o.policy = p } }

// WithStoreTimeout bounds each etcd step of a hit (default 2s): past it,
// etcd counts as unavailable and the policy answers.
func WithStoreTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithLeaseSpan sets the cleanup leases' granularity (keys whose windows
// end within one span share a lease; default 1m) and slack (how long a
// lease outlives the span, covering clock skew and etcd's lease lag;
// default 30s).
func WithLeaseSpan(granularity, slack time.Duration) Option {
	return func(o *options) { o.granularity, o.slack = granularity, slack }
}

// WithRequestRetention sets how long request-id records outlive their hit
// at least (default 10m; also at least until the hit's window ends).
func WithRequestRetention(d time.Duration) Option { return func(o *options) { o.retention = d } }

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// New returns the counters on cli.
func New(cli *clientv3.Client, opts ...Option) *Service {
	o := options{policy: FailClosed, timeout: 2 * time.Second, granularity: time.Minute, slack: 30 * time.Second, retention: 10 * time.Minute}
	for _, opt := range opts {
		opt(&o)
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	if o.policy == PolicyDefault {
		o.policy = FailClosed
	}
	s := &Service{cli: cli, txns: etcdx.NewTxns(cli), ks: keyspace.New(o.prefix), o: o}
	s.leases = &leasePool{cli: cli, granularity: o.granularity, slack: o.slack, leases: map[int64]clientv3.LeaseID{}}
	s.b = newBatcher(s)
	return s
}

// Close stops taking hits and waits for the commits in flight.
func (s *Service) Close() { s.b.close() }

// Stats are the service's totals since New: etcd transactions committed
// for hits, and hits decided by them (their ratio is the batching).
type Stats struct{ Txns, Hits int64 }

// Stats returns the totals.
func (s *Service) Stats() Stats { return Stats{Txns: s.b.txns.Load(), Hits: s.b.decided.Load()} }

// Keyspace is the key layout the service writes under.
func (s *Service) Keyspace() keyspace.Keyspace { return s.ks }

// Hit counts h and answers whether its hits are allowed.
func (s *Service) Hit(ctx context.Context, h Hit) (Result, error) {
	if h.Algorithm == 0 {
		h.Algorithm = FixedWindow
	}
	if err := h.validate(); err != nil {
		return Result{}, err
	}
	c := &call{hit: h, key: s.ks.Counter(h.Name), res: make(chan outcome, 1)}
	if h.RequestID != "" {
		c.recKey = s.ks.CounterRequest(keyspace.IdentityHash(h.Identity), requestDigest(h.Name, h.RequestID))
		c.params = paramsDigest(&h)
	}
	var o outcome
	if err := s.b.submit(c); err != nil {
		o.err = err
	} else {
		select {
		case o = <-c.res:
		case <-ctx.Done():
			o.err = ctx.Err()
		}
	}
	if o.err != nil && errors.Is(o.err, ErrUnavailable) && s.policy(h.Policy) == FailOpen {
		return Result{Allowed: true, Uncounted: true}, nil
	}
	return o.res, o.err
}

func (s *Service) policy(p Policy) Policy {
	if p == PolicyDefault {
		return s.o.policy
	}
	return p
}

// Get reads the counter name (linearizable).
func (s *Service) Get(ctx context.Context, name string) (Counter, error) {
	if err := keyspace.ValidateName("name", name, false); err != nil {
		return Counter{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.o.timeout)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.ks.Counter(name))
	if err != nil {
		return Counter{}, etcdx.Classify("counter get", err)
	}
	if len(resp.Kvs) == 0 {
		return Counter{}, nil
	}
	st, err := decodeState(resp.Kvs[0].Value)
	if err != nil {
		return Counter{}, err
	}
	return view(st, time.Now().UnixNano()), nil
}

// Reset deletes the counter name; existed tells whether it held anything.
func (s *Service) Reset(ctx context.Context, name string) (existed bool, err error) {
	if err := keyspace.ValidateName("name", name, false); err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.o.timeout)
	defer cancel()
	resp, err := s.cli.Delete(ctx, s.ks.Counter(name), clientv3.WithPrevKV())
	s.b.forget(s.ks.Counter(name)) // the next hit reads the key anew (its compare would fail anyway)
	if err != nil {
		return false, etcdx.Classify("counter reset", err)
	}
	if len(resp.PrevKvs) == 0 {
		return false, nil
	}
	st, err := decodeState(resp.PrevKvs[0].Value)
	return err == nil && st.live(time.Now().UnixNano()), nil
}

func (h *Hit) validate() error {
	if err := keyspace.ValidateName("name", h.Name, false); err != nil {
		return err
	}
	switch {
	case h.Limit < 1:
		return keyspace.FieldErr("limit", "must be at least 1, got %d", h.Limit)
	case h.Hits < 0:
		return keyspace.FieldErr("hits", "must not be negative, got %d (0 reads the counter without counting)", h.Hits)
	case h.Hits > h.Limit:
		return keyspace.FieldErr("hits", "is %d, above the limit %d: it could never be allowed", h.Hits, h.Limit)
	case h.Window < MinWindow || h.Window > MaxWindow:
		return keyspace.FieldErr("window", "must be from %v to %v, got %v", MinWindow, MaxWindow, h.Window)
	case h.Algorithm != FixedWindow && h.Algorithm != TokenBucket:
		return keyspace.FieldErr("algorithm", "unknown algorithm %d", h.Algorithm)
	case h.Policy < PolicyDefault || h.Policy > FailOpen:
		return keyspace.FieldErr("on_unavailable", "unknown policy %d", h.Policy)
	}
	return validateRequestID(h.RequestID)
}

func validateRequestID(id string) error {
	if id == "" {
		return nil
	}
	if len(id) < MinRequestIDLen || len(id) > MaxRequestIDLen {
		return keyspace.FieldErr("request_id", "is %d bytes long; use %d to %d bytes of printable ASCII (a random UUID is ideal)", len(id), MinRequestIDLen, MaxRequestIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x21 || c > 0x7e {
			return keyspace.FieldErr("request_id", "must be printable ASCII without spaces or control characters; byte %d is 0x%02x", i, c)
		}
	}
	return nil
}
