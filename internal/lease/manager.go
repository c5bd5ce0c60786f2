package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Defaults for Manager options.
const (
	DefaultTTL = 15 * time.Second
	MaxTTL     = 5 * time.Minute
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
	log        *slog.Logger
	now        func() time.Time

	mu      sync.Mutex
	closing bool
	stop    context.Context // cancelled by Close: every wait ends
	halt    context.CancelFunc
	waiters sync.WaitGroup
}

type options struct {
	prefix     string
	defaultTTL time.Duration
	maxTTL     time.Duration
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

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// New returns a Manager over cli.
func New(cli *clientv3.Client, opts ...Option) (*Manager, error) {
	o := options{defaultTTL: DefaultTTL, maxTTL: MaxTTL}
	for _, opt := range opts {
		opt(&o)
	}
	if o.maxTTL < time.Second {
		return nil, fmt.Errorf("lease: max TTL %v is below 1s", o.maxTTL)
	}
	if o.defaultTTL < time.Second || o.defaultTTL > o.maxTTL {
		return nil, fmt.Errorf("lease: default TTL %v must be between 1s and the max TTL %v", o.defaultTTL, o.maxTTL)
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	stop, halt := context.WithCancel(context.Background())
	return &Manager{
		cli:        cli,
		ks:         NewKeyspace(o.prefix),
		defaultTTL: o.defaultTTL,
		maxTTL:     o.maxTTL,
		log:        o.log,
		now:        time.Now,
		stop:       stop,
		halt:       halt,
	}, nil
}

// Keyspace is the manager's key layout.
func (m *Manager) Keyspace() Keyspace { return m.ks }

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
	Since      int64  `json:"since"`         // unix ns: joined the queue
	Acquired   int64  `json:"acq,omitempty"` // unix ns: granted; 0 while waiting
}

func (r record) encode() string {
	b, _ := json.Marshal(r) // cannot fail: plain fields
	return string(b)
}

func decodeRecord(v []byte) record {
	var r record
	_ = json.Unmarshal(v, &r) // a foreign value reads as an empty record
	return r
}

// Grant is a granted lock.
type Grant struct {
	Name      string
	Token     int64
	Handle    string
	LeaseID   int64
	TTL       time.Duration
	ExpiresAt time.Time
}

type acquireOptions struct {
	ttl     time.Duration
	wait    time.Duration
	hasWait bool
	owner   string
}

// AcquireOption configures one Acquire.
type AcquireOption func(*acquireOptions)

// WithTTL asks for a lease TTL; it is rounded up to a whole second.
func WithTTL(d time.Duration) AcquireOption { return func(o *acquireOptions) { o.ttl = d } }

// WithWait bounds the wait in the queue; 0 means try once. Without it,
// Acquire waits until ctx ends.
func WithWait(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.wait, o.hasWait = d, true }
}

// WithOwner describes the caller for Describe and List.
func WithOwner(s string) AcquireOption { return func(o *acquireOptions) { o.owner = s } }

// Acquire queues for the lock and returns the grant. It fails with a
// *NotGrantedError when the wait elapses first, with ctx's error when ctx
// ends first, with a *FieldError on bad input (nothing written), and with
// ErrUnavailable or ErrShuttingDown. Whatever the failure, the caller's queue
// key is removed (or, if etcd cannot be reached, ends with its lease).
func (m *Manager) Acquire(ctx context.Context, name string, opts ...AcquireOption) (*Grant, error) {
	o := acquireOptions{ttl: m.defaultTTL}
	for _, opt := range opts {
		opt(&o)
	}
	if err := ValidateName("name", name, false); err != nil {
		return nil, err
	}
	if o.ttl <= 0 {
		return nil, fieldErr("ttl", "must be at least 1s, got %v", o.ttl)
	}
	if o.ttl > m.maxTTL {
		return nil, fieldErr("ttl", "is %v; the server allows at most %v (--max-ttl)", o.ttl, m.maxTTL)
	}
	if o.hasWait && o.wait < 0 {
		return nil, fieldErr("wait", "must not be negative, got %v; use 0 to try once or leave it unset to wait until your deadline", o.wait)
	}
	if err := validateOwner(o.owner); err != nil {
		return nil, err
	}
	ttlSec := int64((o.ttl + time.Second - 1) / time.Second)

	parent := ctx
	ctx, done, err := m.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()

	start := m.now()
	lr, err := m.cli.Grant(ctx, ttlSec)
	if err != nil {
		return nil, m.etcdErr(parent, "grant lease", err)
	}
	id := lr.ID
	handle, sum := newHandle(id)
	key := m.ks.key(name, id)
	queue := m.ks.Queue(name)
	rec := record{Owner: o.owner, HandleHash: sum, Since: start.UnixNano()}
	held := rec
	held.Acquired = rec.Since

	// One transaction: if the queue is empty, join it as holder; otherwise
	// join it as a waiter and read the holder.
	resp, err := m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(queue), "=", 0).WithPrefix()).
		Then(clientv3.OpPut(key, held.encode(), clientv3.WithLease(id))).
		Else(clientv3.OpPut(key, rec.encode(), clientv3.WithLease(id)),
			clientv3.OpGet(queue, clientv3.WithFirstCreate()...)).
		Commit()
	if err != nil {
		m.revoke(id)
		return nil, m.etcdErr(parent, "join queue", err)
	}
	token := resp.Header.Revision
	g := &Grant{Name: name, Token: token, Handle: handle, LeaseID: int64(id)}
	if resp.Succeeded {
		g.TTL = time.Duration(lr.TTL) * time.Second
		g.ExpiresAt = start.Add(g.TTL)
		return g, nil
	}
	var holder int64
	if kvs := resp.Responses[1].GetResponseRange().GetKvs(); len(kvs) > 0 {
		holder = kvs[0].CreateRevision
	}
	if o.hasWait && o.wait == 0 {
		m.revoke(id)
		return nil, &NotGrantedError{Name: name, HolderToken: holder}
	}

	var timeout <-chan time.Time
	if o.hasWait {
		t := time.NewTimer(o.wait)
		defer t.Stop()
		timeout = t.C
	}
	if err := m.wait(ctx, parent, name, queue, id, token, lr.TTL, timeout); err != nil {
		m.revoke(id)
		return nil, err
	}

	// Head of the queue: mark the grant and refresh the lease so the holder
	// gets a full TTL from now.
	held.Acquired = m.now().UnixNano()
	tr, err := m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", token)).
		Then(clientv3.OpPut(key, held.encode(), clientv3.WithIgnoreLease())).
		Commit()
	if err != nil {
		m.revoke(id)
		return nil, m.etcdErr(parent, "mark grant", err)
	}
	if !tr.Succeeded {
		return nil, fmt.Errorf("%w: the queue entry vanished while waiting (lease expired); retry", ErrUnavailable)
	}
	refreshed := m.now()
	ka, err := m.cli.KeepAliveOnce(ctx, id)
	if err != nil {
		m.revoke(id)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return nil, fmt.Errorf("%w: the lease expired at the moment of the grant; retry", ErrUnavailable)
		}
		return nil, m.etcdErr(parent, "refresh lease", err)
	}
	g.TTL = time.Duration(ka.TTL) * time.Second
	g.ExpiresAt = refreshed.Add(g.TTL)
	return g, nil
}

// wait blocks until the key with create revision token heads its queue. It
// keeps the waiter's lease alive meanwhile (the caller is actively waiting).
func (m *Manager) wait(ctx, parent context.Context, name, queue string, id clientv3.LeaseID, token, ttl int64, timeout <-chan time.Time) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	lost := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		m.keepWaiterAlive(ctx, id, ttl, lost)
	}()
	defer func() { cancel(); wg.Wait() }()

	notGranted := func() error {
		var holder int64
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if r, err := m.cli.Get(rctx, queue, clientv3.WithFirstCreate()...); err == nil && len(r.Kvs) > 0 {
			holder = r.Kvs[0].CreateRevision
		}
		return &NotGrantedError{Name: name, HolderToken: holder}
	}
	ended := func() error {
		select {
		case <-lost:
			return fmt.Errorf("%w: lost the queue position while waiting (lease not renewed for its TTL); retry", ErrUnavailable)
		default:
		}
		return m.etcdErr(parent, "wait", ctx.Err())
	}

	for {
		// The immediate predecessor: the newest key older than ours.
		r, err := m.cli.Get(ctx, queue, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(token-1), clientv3.WithKeysOnly())...)
		if err != nil {
			if ctx.Err() != nil {
				return ended()
			}
			return m.etcdErr(parent, "find predecessor", err)
		}
		if len(r.Kvs) == 0 {
			return nil
		}
		pred := string(r.Kvs[0].Key)

		// Watch from "now" (a synced watcher, woken at once), wait until the
		// watch exists, then re-check: a delete after this Get is seen.
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := m.cli.Watch(wctx, pred, clientv3.WithCreatedNotify(), clientv3.WithFilterPut())
		err = m.awaitDelete(ctx, pred, wch, timeout, lost)
		wcancel()
		switch {
		case errors.Is(err, errTimeout):
			return notGranted()
		case errors.Is(err, errLost):
			return ended()
		case err != nil:
			if ctx.Err() != nil {
				return ended()
			}
			return m.etcdErr(parent, "watch predecessor", err)
		}
		// The predecessor is gone: find the next one, or hold the lock.
	}
}

var (
	errTimeout = errors.New("wait elapsed")
	errLost    = errors.New("waiter lease lost")
)

// awaitDelete returns when pred is deleted (or its watch broke, which the
// caller answers by looking again).
func (m *Manager) awaitDelete(ctx context.Context, pred string, wch clientv3.WatchChan, timeout <-chan time.Time, lost <-chan struct{}) error {
	created := false
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-lost:
			return errLost
		case <-timeout:
			return errTimeout
		case wr, ok := <-wch:
			if !ok || wr.Canceled {
				return nil // look again
			}
			if wr.Created && !created {
				created = true
				r, err := m.cli.Get(ctx, pred, clientv3.WithCountOnly())
				if err != nil {
					return err
				}
				if r.Count == 0 {
					return nil
				}
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					return nil
				}
			}
		}
	}
}

// keepWaiterAlive renews a waiter's lease every third of its TTL until ctx
// ends; it closes lost if the lease is gone.
func (m *Manager) keepWaiterAlive(ctx context.Context, id clientv3.LeaseID, ttl int64, lost chan<- struct{}) {
	every := time.Duration(ttl) * time.Second / 3
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, err := m.cli.KeepAliveOnce(ctx, id)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			close(lost)
			return
		}
		if err != nil && ctx.Err() == nil {
			m.log.Warn("renewing a waiter's lease failed; will retry", "lease", formatLease(id), "err", err)
		}
	}
}

// revoke ends a lease, removing its queue key, even if the caller's context
// is done. On failure the lease still ends within its TTL.
func (m *Manager) revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if _, err := m.cli.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		m.log.Warn("revoking an abandoned lease failed; it ends with its TTL", "lease", formatLease(id), "err", err)
	}
}

// lookup returns the queue key of the grant (name, token, handle) and its
// lease, or ErrNotHeld.
func (m *Manager) lookup(ctx context.Context, name string, token int64, handle string) (clientv3.LeaseID, error) {
	if err := ValidateName("name", name, false); err != nil {
		return 0, err
	}
	if err := ValidateToken(token); err != nil {
		return 0, err
	}
	id, sum, err := parseHandle(handle)
	if err != nil {
		return 0, err
	}
	r, err := m.cli.Get(ctx, m.ks.key(name, id))
	if err != nil {
		return 0, m.etcdErr(ctx, "read grant", err)
	}
	if len(r.Kvs) == 0 {
		return 0, ErrNotHeld
	}
	kv := r.Kvs[0]
	if kv.CreateRevision != token || clientv3.LeaseID(kv.Lease) != id || !sameHash(decodeRecord(kv.Value).HandleHash, sum) {
		return 0, ErrNotHeld
	}
	return id, nil
}

// Renewal is the outcome of KeepAlive.
type Renewal struct {
	TTL       time.Duration
	ExpiresAt time.Time
}

// KeepAlive renews the grant's lease for a full TTL. ErrNotHeld if the grant
// is gone or the token or handle does not match it.
func (m *Manager) KeepAlive(ctx context.Context, name string, token int64, handle string) (*Renewal, error) {
	id, err := m.lookup(ctx, name, token, handle)
	if err != nil {
		return nil, err
	}
	start := m.now()
	ka, err := m.cli.KeepAliveOnce(ctx, id)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil, ErrNotHeld
	}
	if err != nil {
		return nil, m.etcdErr(ctx, "renew lease", err)
	}
	ttl := time.Duration(ka.TTL) * time.Second
	return &Renewal{TTL: ttl, ExpiresAt: start.Add(ttl)}, nil
}

// Release ends the grant and frees the lock at once. It reports false,
// changing nothing, when the grant already ended or the token or handle does
// not match it.
func (m *Manager) Release(ctx context.Context, name string, token int64, handle string) (bool, error) {
	id, err := m.lookup(ctx, name, token, handle)
	if errors.Is(err, ErrNotHeld) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if _, err := m.cli.Revoke(ctx, id); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return false, nil
		}
		return false, m.etcdErr(ctx, "revoke lease", err)
	}
	return true, nil
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
// ErrUnavailable.
func classify(op string, err error) error {
	for _, u := range []error{
		rpctypes.ErrNoLeader, rpctypes.ErrLeaderChanged, rpctypes.ErrNotCapable,
		rpctypes.ErrTimeout, rpctypes.ErrTimeoutDueToLeaderFail, rpctypes.ErrTimeoutDueToConnectionLost,
		rpctypes.ErrTooManyRequests, rpctypes.ErrUnhealthy,
		clientv3.ErrNoAvailableEndpoints, context.DeadlineExceeded,
	} {
		if errors.Is(err, u) {
			return fmt.Errorf("%w: %s: %v", ErrUnavailable, op, err)
		}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// Classify is classify for sibling domain packages.
func Classify(op string, err error) error { return classify(op, err) }
