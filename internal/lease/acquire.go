package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Grant is a granted lock.
type Grant struct {
	Name      string
	Token     int64
	Handle    string
	LeaseID   int64
	TTL       time.Duration
	ExpiresAt time.Time
	// SafeUntil is ExpiresAt minus the safety margin (see SafetyMargin):
	// the instant the holder must stop working unless renewed.
	SafeUntil  time.Time
	AcquiredAt time.Time
	// Resumed is true when a retry with the same request id returned an
	// existing grant.
	Resumed bool
}

// SafetyMargin is how long before expires_at a holder must stop working:
// max(ttl/10, 500ms), at most ttl/2. It covers network delay and clock drift
// between the client and the server; etcd never expires a lease before the
// server's expires_at estimate.
func SafetyMargin(ttl time.Duration) time.Duration {
	return min(max(ttl/safetyMarginPart, minSafetyMargin), ttl/2)
}

type acquireOptions struct {
	ttl       time.Duration
	wait      time.Duration
	hasWait   bool
	owner     string
	requestID string
	maxHold   time.Duration
	lockDelay time.Duration
	session   *sessionRef
	// sessionHandle is resolved to session by Acquire.
	sessionHandle string
	identity      string // WithIdentity
	caller        string // WithCaller
	given         given  // which grant parameters the caller set (for the request digest)
}

// AcquireOption configures one Acquire.
type AcquireOption func(*acquireOptions)

// WithTTL asks for a lease TTL; it is rounded up to a whole second.
func WithTTL(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.ttl, o.given = d, o.given|givenTTL }
}

// WithWait bounds the wait in the queue; 0 means try once. Without it,
// Acquire waits until ctx ends.
func WithWait(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.wait, o.hasWait = d, true }
}

// WithOwner describes the caller for Describe and List.
func WithOwner(s string) AcquireOption { return func(o *acquireOptions) { o.owner = s } }

// WithRequestID makes Acquire idempotent: a retry by the same caller
// (WithCaller) with the same id, name and parameters returns the same grant
// (same token and handle) while it lives, or takes the same queue position
// while it waits; with other parameters it fails with ErrRequestIDReused,
// writing nothing. Another caller's id is another key (request.go). The id
// must be unguessable: with the caller's identity, it resumes the
// acquisition.
func WithRequestID(id string) AcquireOption { return func(o *acquireOptions) { o.requestID = id } }

// WithMaxHold bounds renewals: KeepAlive past AcquiredAt+d fails with
// ErrMaxHold. Without it the manager's cap applies.
func WithMaxHold(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.maxHold, o.given = d, o.given|givenMaxHold }
}

// WithLockDelay asks that, if this grant ends involuntarily (expiry or
// force-release), the next grant of the lock waits d. A clean release never
// delays.
func WithLockDelay(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.lockDelay, o.given = d, o.given|givenLockDelay }
}

func (m *Manager) acquireOptions(name string, opts []AcquireOption) (acquireOptions, error) {
	o := acquireOptions{ttl: m.defaultTTL, maxHold: m.maxHold}
	for _, opt := range opts {
		opt(&o)
	}
	if err := m.caps.capWait(&o); err != nil { // first: beyond the cap is the answer whatever else is wrong
		return o, err
	}
	if err := ValidateName("name", name, false); err != nil {
		return o, err
	}
	switch {
	case o.session != nil:
		// The session's lease and TTL apply.
	case o.ttl <= 0:
		return o, fieldErr("ttl", "must be at least 1s, got %v", o.ttl)
	case o.ttl > m.maxTTL:
		return o, fieldErr("ttl", "is %v; the server allows at most %v (--max-ttl)", o.ttl, m.maxTTL)
	}
	if o.hasWait && o.wait < 0 {
		return o, fieldErr("wait", "must not be negative, got %v; use 0 to try once or leave it unset to wait until your deadline", o.wait)
	}
	switch {
	case o.maxHold <= 0:
		return o, fieldErr("max_hold", "must be positive, got %v; leave it unset for the server's cap %v", o.maxHold, m.maxHold)
	case o.maxHold > m.maxHold:
		return o, fieldErr("max_hold", "is %v; the server allows at most %v (--max-hold)", o.maxHold, m.maxHold)
	}
	switch {
	case o.lockDelay < 0:
		return o, fieldErr("lock_delay", "must not be negative, got %v", o.lockDelay)
	case o.lockDelay > m.maxDelay:
		return o, fieldErr("lock_delay", "is %v; the server allows at most %v (--max-lock-delay)", o.lockDelay, m.maxDelay)
	case o.lockDelay > 0 && o.session != nil:
		return o, fieldErr("lock_delay", "is not supported for locks held through a session")
	}
	if o.requestID != "" && o.session != nil {
		return o, fieldErr("request_id", "is not supported for locks held through a session: the session already makes a retry safe (a second Acquire of the same lock answers FAILED_PRECONDITION)")
	}
	if err := validateOwner(o.owner); err != nil {
		return o, err
	}
	if err := validateRequestID(o.requestID); err != nil {
		return o, err
	}
	return o, nil
}

// attempt is one acquisition in progress: its queue key and leases.
type attempt struct {
	name    string
	key     string
	queue   string
	id      clientv3.LeaseID // the lease of the queue key
	delay   clientv3.LeaseID // the lease of the lock-delay key, 0 if none
	ttl     int64            // seconds
	token   int64
	handle  string
	rec     record
	session bool   // id is a session's lease: withdraw by deleting the key, never revoke
	pred    string // the immediate predecessor's key when the attempt joined, if known
	// reqRecord is the encoded request record a request-id join writes.
	reqRecord string
	modRev    int64 // the queue key's mod revision as this attempt last wrote or read it, 0 if unknown (withdraw.go)

	refreshed    time.Time // when the lease was refreshed alongside a claim
	refreshedTTL int64     // its TTL then, 0 if not refreshed
}

// Acquire queues for the lock and returns the grant. It fails with a
// *NotGrantedError when the wait elapses first, with ctx's error when ctx
// ends first, with a *FieldError on bad input (nothing written), with
// ErrLostWhileWaiting when the waiter's lease ends, and with ErrUnavailable
// or ErrShuttingDown; beyond a limit, with a *TooManyWaitersError or a
// *TooManyLocksError (limits.go). Whatever the failure, the caller's queue
// key is removed (or, if etcd cannot be reached, ends with its lease),
// unless a retry with the same request id may have taken it over
// (withdraw.go).
func (m *Manager) Acquire(ctx context.Context, name string, opts ...AcquireOption) (*Grant, error) {
	o, err := m.acquireOptions(name, opts)
	if err != nil {
		return nil, err
	}
	if o.sessionHandle != "" {
		if o.session, err = m.sessionOf(ctx, "session_handle", o.sessionHandle, o.caller); err != nil {
			return nil, err
		}
		if o, err = m.acquireOptions(name, append(opts, func(ao *acquireOptions) { ao.session = o.session })); err != nil {
			return nil, err
		}
	}
	parent := ctx
	ctx, done, err := m.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()

	var timeout <-chan time.Time
	if o.hasWait && o.wait > 0 {
		t := time.NewTimer(o.wait)
		defer t.Stop()
		timeout = t.C
	}
	a, g, err := m.start(ctx, parent, name, o)
	if err != nil || g != nil {
		return g, err
	}
	return m.queued(ctx, parent, a, o, timeout)
}

// start resumes the acquisition of o.requestID or joins the queue. It
// returns a grant when granted at once, else the queued attempt.
func (m *Manager) start(ctx, parent context.Context, name string, o acquireOptions) (*attempt, *Grant, error) {
	if o.requestID != "" {
		a, err := m.resumeAdopted(ctx, parent, name, o)
		if err != nil || a != nil {
			if a != nil && a.rec.Acquired != 0 {
				g, err := m.regrant(ctx, parent, a)
				return nil, g, err
			}
			return a, nil, err
		}
	}
	return m.join(ctx, parent, name, o)
}

// join writes a new queue key (and the request record, the limit slots,
// and the lock-delay key if the lock is free) in one transaction.
func (m *Manager) join(ctx, parent context.Context, name string, o acquireOptions) (*attempt, *Grant, error) {
	return m.joinWith(ctx, parent, name, o, maxRejoins)
}

// maxRejoins bounds how often a join is redone with a new lease: when a
// recycled lease turns out gone, and when a fresh lease expired before the
// join committed (etcd stalled longer than its TTL: a leader crash, say).
// Beyond, the join answers ErrUnavailable.
const maxRejoins = 2

// joinWith is join; rejoins is how many more times it may be redone with a
// new lease (only the first try may use a pooled one).
func (m *Manager) joinWith(ctx, parent context.Context, name string, o acquireOptions, rejoins int) (*attempt, *Grant, error) {
	start := m.now()
	a := &attempt{name: name, queue: m.ks.Queue(name)}
	sl := m.slotsFor(name, o)
	if full, err := m.stillFull(ctx, sl); err != nil || full != nil {
		if err != nil {
			return nil, nil, m.etcdErr(parent, "count limit slots", err)
		}
		return nil, nil, m.refusal(a, o, sl, full, func() int64 { return m.holderToken(ctx, a.queue) })
	}
	// refreshed, if not nil, delivers the refresh of a recycled lease, which
	// runs alongside the join (a recycled lease was pooled less than half
	// its TTL ago, so it lives; refreshed, it is as good as a new one).
	// A recycled lease refreshed very recently is used as it is: the grant
	// then counts its TTL from that refresh (base).
	var refreshed chan kaResult
	base := start
	if o.session != nil {
		a.id, a.ttl, a.session = o.session.id, o.session.ttl, true
	} else {
		ttlSec := int64((o.ttl + time.Second - 1) / time.Second)
		if p, ok := m.pool.get(ttlSec, start); ok && rejoins == maxRejoins {
			a.id, a.ttl = p.id, ttlSec
			if !p.refreshed.IsZero() && start.Sub(p.refreshed) < freshFor(ttlSec) {
				base = p.refreshed
			} else {
				refreshed = make(chan kaResult, 1)
				go func() {
					ttl, err := m.keepAliveOnce(ctx, p.id)
					refreshed <- kaResult{ttl, err}
				}()
			}
		}
		if a.id == 0 {
			lr, err := m.cli.Grant(ctx, ttlSec)
			if err != nil {
				return nil, nil, m.etcdErr(parent, "grant lease", err)
			}
			a.id, a.ttl = lr.ID, lr.TTL
		}
	}
	// recycleFailed: the recycled lease turned out gone or unrenewable;
	// the join is withdrawn and redone with a new lease.
	recycleFailed := false
	awaitRefresh := func() {
		if refreshed == nil {
			return
		}
		r := <-refreshed
		refreshed = nil
		if r.err != nil || r.ttl <= 0 {
			recycleFailed = true
		}
	}
	defer awaitRefresh() // every path waits for the refresh goroutine
	if o.lockDelay > 0 {
		dl, err := m.cli.Grant(ctx, a.ttl+int64((o.lockDelay+time.Second-1)/time.Second))
		if err != nil {
			m.discard(a)
			return nil, nil, m.etcdErr(parent, "grant lock-delay lease", err)
		}
		a.delay = dl.ID
	}
	var sum []byte
	switch {
	case o.session != nil:
		a.handle, sum = o.session.handle, o.session.hash
	case o.requestID != "":
		req := newRequestRecord(a.id, o)
		a.handle, sum = req.handle(a.id, o, name)
		a.reqRecord = req.encode()
	default:
		a.handle, sum = newHandle(a.id)
	}
	a.key = m.ks.key(name, a.id)
	a.rec = record{Owner: o.owner, HandleHash: sum, Since: start.UnixNano(), MaxHold: int64(o.maxHold),
		LockDelay: int64(o.lockDelay), DelayLease: int64(a.delay), Session: a.session}
	if !a.session {
		a.rec.TTL = a.ttl
	}
	if o.requestID != "" {
		a.rec.Req = m.ks.request(o.caller, name, o.requestID)
	}

	// Commit the join, claiming a free slot of each limit (limits.go): a
	// slot lost to a concurrent join is picked again among the free ones.
	var (
		held  record
		res   txnRes
		shape joinShape
	)
	for round := 1; ; round++ {
		sl.stamp(&a.rec)
		held = a.rec
		held.Acquired = a.rec.Since
		res, shape = m.joinTxn(ctx, a, o, sl, held)
		if res.err != nil || res.ok || !shape.nested || shape.guardFailed(res) {
			break
		}
		if full := sl.repick(res.resps[shape.slotReads():]); full != nil || round == maxSlotRounds {
			if full != nil {
				m.full.saw(full.prefix, m.now())
			}
			m.discard(a)
			return nil, nil, m.refusal(a, o, sl, full, func() int64 { return m.holderToken(ctx, a.queue) })
		}
	}
	if res.err == nil && !(shape.nested && !res.ok) {
		a.token, a.modRev = res.rev, res.rev // written at res.rev
	}
	awaitRefresh()
	leaseGone := errors.Is(res.err, rpctypes.ErrLeaseNotFound)
	if (recycleFailed || leaseGone) && ctx.Err() == nil {
		if leaseGone {
			m.discard(a) // refused as a whole: nothing written
		} else {
			m.withdraw(a)
		}
		if rejoins > 0 {
			return m.joinWith(ctx, parent, name, o, rejoins-1)
		}
		return nil, nil, fmt.Errorf("%w: joining %q: the queue entry's lease expired before etcd committed the join (etcd is slow or changing leader); retry", ErrUnavailable, name)
	}
	if err := res.err; err != nil {
		m.withdraw(a) // the join may have been committed
		return nil, nil, m.etcdErr(parent, "join queue", err)
	}
	if shape.guardFailed(res) {
		// A concurrent attempt with the same request id won the race (we
		// resume it), or the session already has a key in this queue.
		m.discard(a)
		if a.session {
			return nil, nil, ErrSessionBusy
		}
		r, err := m.resumeAdopted(ctx, parent, name, o)
		if err != nil {
			return nil, nil, err
		}
		if r == nil {
			return nil, nil, fmt.Errorf("%w: a concurrent retry's acquisition vanished; retry", ErrUnavailable)
		}
		if r.rec.Acquired != 0 {
			g, err := m.regrant(ctx, parent, r)
			return nil, g, err
		}
		return r, nil, nil
	}
	granted, resps := res.ok, res.resps
	if shape.nested {
		granted, resps = res.resps[0].GetResponseTxn().GetSucceeded(), res.resps[0].GetResponseTxn().GetResponses()
	}
	if !granted {
		if len(resps) >= 2 { // [put, get, the slot puts if any]
			if kvs := resps[1].GetResponseRange().GetKvs(); len(kvs) == 2 && kvs[0].CreateRevision == a.token {
				a.pred = string(kvs[1].Key)
			}
		}
		return a, nil, nil
	}
	a.rec = held
	m.remember(a, res.rev, base)
	return nil, m.grantOf(a, base, time.Duration(a.ttl)*time.Second), nil
}

// joinShape says how a join transaction's answer reads. Without a guard or
// a limit it is flat: If(free) Then(hold) Else(queue). Otherwise the outer
// transaction compares the guard (the request record's or the session
// key's absence) and the limit slots' absence; its Then nests the flat one
// first, and its Else reads the guard key (count only) and then each limit
// scope's slots.
type joinShape struct {
	nested  bool
	guarded bool
}

// guardFailed: the outer compare failed because the guard key exists.
func (s joinShape) guardFailed(res txnRes) bool {
	return s.guarded && !res.ok && res.err == nil && res.resps[0].GetResponseRange().GetCount() > 0
}

// slotReads is the index of the first slot read in a failed outer Else.
func (s joinShape) slotReads() int {
	if s.guarded {
		return 1
	}
	return 0
}

// joinTxn commits a's join with the slots sl (held is the record of a
// grant at once): through group commit, except a session's join (which
// writes the session index), committed alone.
func (m *Manager) joinTxn(ctx context.Context, a *attempt, o acquireOptions, sl slots, held record) (txnRes, joinShape) {
	// If the queue is empty and no lock-delay is pending: hold at once.
	// Otherwise: queue, and read the holder.
	delayKey := m.ks.delay(a.name)
	free := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(a.queue), "=", 0).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(delayKey), "=", 0),
	}
	hold := []clientv3.Op{clientv3.OpPut(a.key, held.encode(), clientv3.WithLease(a.id))}
	if a.delay != 0 {
		hold = append(hold, clientv3.OpPut(delayKey, "", clientv3.WithLease(a.delay)))
	}
	queue := []clientv3.Op{
		clientv3.OpPut(a.key, a.rec.encode(), clientv3.WithLease(a.id)),
		// The newest two keys: ours (the put above is visible here) and
		// our immediate predecessor, the first key the wait watches.
		clientv3.OpGet(a.queue, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(2),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend)),
	}
	hold, queue = append(hold, sl.puts(a.id)...), append(queue, sl.puts(a.id)...)
	var (
		guard string // a key that must not exist: the request record, or a session's key in this queue
		extra []clientv3.Op
	)
	switch {
	case o.requestID != "":
		guard = a.rec.Req
		extra = []clientv3.Op{clientv3.OpPut(guard, a.reqRecord, clientv3.WithLease(a.id))}
	case a.session:
		// A session has one key per queue: refuse a second.
		guard = a.key
		extra = []clientv3.Op{clientv3.OpPut(m.ks.sessionIndex(a.id)+escape(a.name), "", clientv3.WithLease(a.id))}
	}
	shape := joinShape{nested: guard != "" || sl.limited(), guarded: guard != ""}
	conflicts := append([]string{a.name}, sl.conflicts()...)
	if !shape.nested {
		return m.batch.doExclusive(ctx, conflicts, free, hold, queue), shape
	}
	cmps, els := sl.cmps(), sl.reads()
	if guard != "" {
		cmps = append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(guard), "=", 0)}, cmps...)
		els = append([]clientv3.Op{clientv3.OpGet(guard, clientv3.WithCountOnly())}, els...)
	}
	then := append([]clientv3.Op{clientv3.OpTxn(free, hold, queue)}, extra...)
	if !a.session {
		return m.batch.doExclusive(ctx, conflicts, cmps, then, els), shape
	}
	resp, err := m.cli.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
	if err != nil {
		return txnRes{err: err}, shape
	}
	return txnRes{rev: resp.Header.Revision, ok: resp.Succeeded, resps: resp.Responses}, shape
}

func (m *Manager) grantOf(a *attempt, refreshed time.Time, ttl time.Duration) *Grant {
	exp := refreshed.Add(ttl)
	return &Grant{Name: a.name, Token: a.token, Handle: a.handle, LeaseID: int64(a.id), TTL: ttl,
		ExpiresAt: exp, SafeUntil: exp.Add(-SafetyMargin(ttl)), AcquiredAt: unixTime(a.rec.Acquired)}
}

// resume finds the live acquisition of (caller, name, o.requestID), or
// returns nil; ErrRequestIDReused if it was made with other parameters.
func (m *Manager) resume(ctx, parent context.Context, name string, o acquireOptions) (*attempt, error) {
	r, err := m.cli.Get(ctx, m.ks.request(o.caller, name, o.requestID))
	if err != nil {
		return nil, m.etcdErr(parent, "read request record", err)
	}
	if len(r.Kvs) == 0 {
		return nil, nil
	}
	req, ok := decodeRequestRecord(r.Kvs[0].Value, r.Kvs[0].Lease)
	if !ok {
		return nil, nil // not ours to interpret; a fresh acquisition replaces it when its lease ends
	}
	if err := req.checkRequest(o); err != nil {
		return nil, err
	}
	id := clientv3.LeaseID(r.Kvs[0].Lease)
	a := &attempt{name: name, queue: m.ks.Queue(name), key: m.ks.key(name, id), id: id}
	k, err := m.cli.Get(ctx, a.key)
	if err != nil {
		return nil, m.etcdErr(parent, "read queue entry", err)
	}
	if len(k.Kvs) == 0 {
		return nil, nil
	}
	a.token, a.modRev = k.Kvs[0].CreateRevision, k.Kvs[0].ModRevision
	a.rec = decodeRecord(k.Kvs[0].Value)
	a.delay = clientv3.LeaseID(a.rec.DelayLease)
	var sum []byte
	a.handle, sum = req.handle(id, o, name)
	if !sameHash(a.rec.HandleHash, sum) {
		return nil, nil
	}
	ttl, err := m.cli.TimeToLive(ctx, id)
	if err != nil {
		return nil, m.etcdErr(parent, "read lease", err)
	}
	if ttl.TTL < 0 { // -1: gone; 0: under a second left
		return nil, nil
	}
	a.ttl = ttl.GrantedTTL
	return a, nil
}

// regrant answers a retry of a granted acquisition: the same grant, its
// lease refreshed (the retry proves the client alive) unless past max hold.
func (m *Manager) regrant(ctx, parent context.Context, a *attempt) (*Grant, error) {
	refreshed := m.now()
	ttl := time.Duration(a.ttl) * time.Second
	if a.rec.MaxHold == 0 || refreshed.Before(unixTime(a.rec.Acquired).Add(time.Duration(a.rec.MaxHold))) {
		ka, err := m.renew(ctx, a.id, a.delay)
		if err != nil {
			return nil, m.etcdErr(parent, "refresh lease", err)
		}
		ttl = time.Duration(ka) * time.Second
	} else {
		t, err := m.cli.TimeToLive(ctx, a.id)
		if err != nil {
			return nil, m.etcdErr(parent, "read lease", err)
		}
		ttl = time.Duration(max(t.TTL, 0)) * time.Second
	}
	g := m.grantOf(a, refreshed, ttl)
	g.TTL = time.Duration(a.ttl) * time.Second
	g.Resumed = true
	return g, nil
}

// renew refreshes a grant's lease and its lock-delay lease, returning the
// grant lease's TTL; ErrNotHeld if the grant's lease is gone.
func (m *Manager) renew(ctx context.Context, id, delay clientv3.LeaseID) (int64, error) {
	if delay != 0 {
		if _, err := m.keepAliveOnce(ctx, delay); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return 0, err
		}
	}
	ttl, err := m.keepAliveOnce(ctx, id)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return 0, ErrNotHeld
	}
	if err != nil {
		return 0, err
	}
	return ttl, nil
}

// queued waits for a queued attempt to head the queue, then claims it.
func (m *Manager) queued(ctx, parent context.Context, a *attempt, o acquireOptions, timeout <-chan time.Time) (*Grant, error) {
	if o.hasWait && o.wait == 0 {
		holder := m.holderToken(ctx, a.queue)
		m.withdraw(a)
		return nil, &NotGrantedError{Name: a.name, HolderToken: holder}
	}
	if err := m.wait(ctx, parent, a, timeout); err != nil {
		m.withdraw(a)
		return nil, err
	}
	g, err := m.claim(ctx, parent, a)
	if err != nil && !errors.Is(err, ErrLostWhileWaiting) {
		m.withdraw(a)
	}
	return g, err
}

// tryClaim marks the attempt granted if, in etcd's view, it heads its
// queue and no lock-delay is pending, in one transaction; the lease refresh
// that a grant needs runs alongside, so a hand-off costs one round trip.
func (m *Manager) tryClaim(ctx context.Context, a *attempt) (bool, error) {
	held := a.rec
	held.Acquired = m.now().UnixNano()
	ops := []clientv3.Op{clientv3.OpPut(a.key, held.encode(), clientv3.WithIgnoreLease())}
	if a.delay != 0 {
		ops = append(ops, clientv3.OpPut(m.ks.delay(a.name), "", clientv3.WithLease(a.delay)))
	}
	type renewal struct {
		at  time.Time
		ttl int64
		err error
	}
	rc := make(chan renewal, 1)
	go func() {
		at := m.now()
		ttl, err := m.renew(ctx, a.id, a.delay)
		rc <- renewal{at, ttl, err}
	}()
	res := m.batch.do(ctx, "", []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(a.key), "=", a.token),
		clientv3.Compare(clientv3.CreateRevision(a.queue), ">", a.token-1).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(m.ks.delay(a.name)), "=", 0),
	}, ops, nil)
	r := <-rc
	if res.err != nil || !res.ok {
		return false, res.err
	}
	a.rec, a.modRev = held, res.rev
	if r.err == nil {
		a.refreshed, a.refreshedTTL = r.at, r.ttl
	}
	m.remember(a, res.rev, a.refreshed)
	return true, nil
}

// claim marks the head of the queue as granted (writing the lock-delay key
// if asked) and refreshes its lease for a full TTL.
func (m *Manager) claim(ctx, parent context.Context, a *attempt) (*Grant, error) {
	if a.rec.Acquired == 0 {
		held := a.rec
		held.Acquired = m.now().UnixNano()
		ops := []clientv3.Op{clientv3.OpPut(a.key, held.encode(), clientv3.WithIgnoreLease())}
		if a.delay != 0 {
			ops = append(ops, clientv3.OpPut(m.ks.delay(a.name), "", clientv3.WithLease(a.delay)))
		}
		tr, err := m.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(a.key), "=", a.token)).
			Then(ops...).
			Commit()
		if err != nil {
			return nil, m.etcdErr(parent, "mark grant", err)
		}
		if !tr.Succeeded {
			return nil, ErrLostWhileWaiting
		}
		a.rec, a.modRev = held, tr.Header.Revision
		m.remember(a, tr.Header.Revision, time.Time{})
	}
	if a.refreshedTTL > 0 { // refreshed alongside the claim
		return m.grantOf(a, a.refreshed, time.Duration(a.refreshedTTL)*time.Second), nil
	}
	refreshed := m.now()
	ttl, err := m.renew(ctx, a.id, a.delay)
	if errors.Is(err, ErrNotHeld) {
		return nil, ErrLostWhileWaiting
	}
	if err != nil {
		return nil, m.etcdErr(parent, "refresh lease", err)
	}
	m.grants.touch(a.key, refreshed)
	return m.grantOf(a, refreshed, time.Duration(ttl)*time.Second), nil
}

func (m *Manager) holderToken(ctx context.Context, queue string) int64 {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if r, err := m.cli.Get(rctx, queue, clientv3.WithFirstCreate()...); err == nil && len(r.Kvs) > 0 {
		return r.Kvs[0].CreateRevision
	}
	return 0
}

var (
	errTimeout = errors.New("wait elapsed")
	errLost    = errors.New("waiter lease lost")
)

// wait blocks until the attempt heads its queue and no other grant's
// lock-delay is pending. It keeps the waiter's lease alive meanwhile (the
// caller is actively waiting), and fails at once with ErrLostWhileWaiting if
// the waiter's own key disappears.
func (m *Manager) wait(ctx, parent context.Context, a *attempt, timeout <-chan time.Time) error {
	ctx, cancel := context.WithCancel(ctx)
	var (
		wg       sync.WaitGroup
		lost     = make(chan struct{})
		lostOnce sync.Once
	)
	markLost := func() { lostOnce.Do(func() { close(lost) }) }
	wg.Add(2)
	go func() {
		defer wg.Done()
		m.keepWaiterAlive(ctx, a, markLost)
	}()
	ownCreated := make(chan error, 1)
	go func() {
		defer wg.Done()
		m.watchOwn(ctx, a, markLost, ownCreated)
	}()
	defer func() { cancel(); wg.Wait() }()
	// own is the state of the watch of our own key: its creation is awaited
	// (and our key checked once after it) together with the first target's.
	own := &ownWatch{created: ownCreated}

	ended := func() error {
		select {
		case <-lost:
			return ErrLostWhileWaiting
		default:
		}
		return m.etcdErr(parent, "wait", ctx.Err())
	}
	delayKey := m.ks.delay(a.name)
	for first := true; ; first = false {
		if !first {
			// Something we waited for is gone: most often we now head the
			// queue, so try to claim the lock in one round trip.
			claimed, err := m.tryClaim(ctx, a)
			if err != nil {
				if ctx.Err() != nil {
					return ended()
				}
				return m.etcdErr(parent, "claim", err)
			}
			if claimed {
				return nil
			}
		}
		// The immediate predecessor: the newest key older than ours (known
		// from the join at first).
		target := ""
		if first && a.pred != "" {
			target = a.pred
		} else if r, err := m.cli.Get(ctx, a.queue, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(a.token-1), clientv3.WithKeysOnly())...); err != nil {
			if ctx.Err() != nil {
				return ended()
			}
			return m.etcdErr(parent, "find predecessor", err)
		} else if len(r.Kvs) > 0 {
			target = string(r.Kvs[0].Key)
		}
		if target == "" {
			// Head of the queue: wait out another grant's lock-delay.
			d, err := m.cli.Get(ctx, delayKey, clientv3.WithKeysOnly())
			if err != nil {
				if ctx.Err() != nil {
					return ended()
				}
				return m.etcdErr(parent, "read lock-delay", err)
			}
			if len(d.Kvs) == 0 || d.Kvs[0].CreateRevision == a.token {
				if err := own.ready(ctx, m, a, markLost); err != nil {
					if ctx.Err() != nil {
						return ended()
					}
					return m.etcdErr(parent, "watch own entry", err)
				}
				select {
				case <-lost:
					return ErrLostWhileWaiting
				default:
				}
				return nil
			}
			target = delayKey
		}
		// Watch from "now" (a synced watcher, woken at once), wait until the
		// watch exists, then re-check: a delete after this Get is seen.
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := m.cli.Watch(wctx, target, clientv3.WithCreatedNotify(), clientv3.WithFilterPut())
		err := m.awaitDelete(ctx, a, target, wch, timeout, lost, own, markLost)
		wcancel()
		switch {
		case errors.Is(err, errTimeout):
			return &NotGrantedError{Name: a.name, HolderToken: m.holderToken(ctx, a.queue)}
		case errors.Is(err, errLost):
			return ended()
		case err != nil:
			if ctx.Err() != nil {
				return ended()
			}
			return m.etcdErr(parent, "watch predecessor", err)
		}
		// The target is gone: find the next one, or hold the lock.
	}
}

// watchOwn closes lost (via markLost) as soon as the attempt's own queue
// key is deleted. It reports on created once the watch is in place; the
// waiter then checks once that the key still exists (ownWatch.ready).
func (m *Manager) watchOwn(ctx context.Context, a *attempt, markLost func(), created chan<- error) {
	wch := m.cli.Watch(clientv3.WithRequireLeader(ctx), a.key, clientv3.WithCreatedNotify(), clientv3.WithFilterPut())
	first := true
	for {
		select {
		case <-ctx.Done():
			if first {
				created <- ctx.Err()
			}
			return
		case wr, ok := <-wch:
			if !ok || wr.Canceled {
				if first {
					// %w keeps etcd's error (no leader, ...) visible to
					// classify: UNAVAILABLE, not INTERNAL.
					err := wr.Err()
					if err == nil {
						err = rpctypes.ErrTimeoutDueToConnectionLost
					}
					created <- fmt.Errorf("watch of own queue entry closed: %w", err)
				}
				return // the keepalive loop still detects a lost lease
			}
			if wr.Created && first {
				first = false
				created <- nil // the waiter checks that the key exists
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					markLost()
					return
				}
			}
		}
	}
}

// ownWatch is a waiter's view of the watch of its own key.
type ownWatch struct {
	created <-chan error
	checked bool // the watch exists and the key was seen after that
}

// ready waits for the own-key watch and then checks the key, unless done.
func (o *ownWatch) ready(ctx context.Context, m *Manager, a *attempt, markLost func()) error {
	if o.checked {
		return nil
	}
	if err := o.await(ctx); err != nil {
		return err
	}
	r, err := m.cli.Get(ctx, a.key, clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	if r.Count == 0 {
		markLost()
	}
	o.checked = true
	return nil
}

func (o *ownWatch) await(ctx context.Context) error {
	select {
	case err := <-o.created:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// awaitDelete returns when key is deleted (or its watch broke, which the
// caller answers by looking again). Once key's watch exists, it checks that
// key still exists, and, the first time, that the waiter's own key does
// (own): both in one read.
func (m *Manager) awaitDelete(ctx context.Context, a *attempt, key string, wch clientv3.WatchChan, timeout <-chan time.Time, lost <-chan struct{}, own *ownWatch, markLost func()) error {
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
				if !own.checked {
					if err := own.await(ctx); err != nil {
						return err
					}
					r, err := m.cli.Txn(ctx).Then(
						clientv3.OpGet(key, clientv3.WithCountOnly()),
						clientv3.OpGet(a.key, clientv3.WithCountOnly())).Commit()
					if err != nil {
						return err
					}
					own.checked = true
					if r.Responses[1].GetResponseRange().GetCount() == 0 {
						markLost()
						return errLost
					}
					if r.Responses[0].GetResponseRange().GetCount() == 0 {
						return nil
					}
					continue
				}
				r, err := m.cli.Get(ctx, key, clientv3.WithCountOnly())
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

// keepWaiterAlive renews a waiter's leases every third of the TTL until ctx
// ends; it calls markLost if the lease is gone.
func (m *Manager) keepWaiterAlive(ctx context.Context, a *attempt, markLost func()) {
	every := max(time.Duration(a.ttl)*time.Second/3, 100*time.Millisecond)
	retry := min(every, 250*time.Millisecond) // after a failed renewal: sooner
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, every)
		_, err := m.renew(rctx, a.id, a.delay)
		cancel()
		switch {
		case errors.Is(err, ErrNotHeld):
			markLost()
			return
		case err != nil && ctx.Err() == nil:
			m.log.Warn("renewing a waiter's lease failed; retrying", "lease", formatLease(a.id), "err", err)
			t.Reset(retry)
		default:
			t.Reset(every)
		}
	}
}
