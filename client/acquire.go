package client

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

type acquireOptions struct {
	ttl       time.Duration
	wait      *time.Duration
	owner     string
	requestID string
	maxHold   time.Duration
	lockDelay time.Duration
	session   string // the session handle: set only by Session.Acquire
	limit     int32  // WithLimit (Semaphore)
	shared    bool   // WithShared (RWMutex.RLock)

	releaseOnDisconnect bool // Hold only
}

// AcquireOption configures one Acquire.
type AcquireOption func(*acquireOptions)

// WithTTL asks for a lease TTL (default: the coordinator's, 15s out of the
// box); the coordinator rounds it up to a whole second.
func WithTTL(d time.Duration) AcquireOption { return func(o *acquireOptions) { o.ttl = d } }

// WithWait bounds the wait in the queue; 0 tries once. Without it, Acquire
// waits until ctx ends.
func WithWait(d time.Duration) AcquireOption { return func(o *acquireOptions) { o.wait = &d } }

// WithOwner describes the caller (host, pod, job) for Describe and List.
func WithOwner(s string) AcquireOption { return func(o *acquireOptions) { o.owner = s } }

// WithRequestID sets the idempotency key of the acquisition (default: 128
// random bits, new for each Acquire call). Every retry of this Acquire sends
// the same key, so a grant whose answer was lost is returned, not doubled.
func WithRequestID(id string) AcquireOption { return func(o *acquireOptions) { o.requestID = id } }

// WithMaxHold bounds how long the lock can be renewed (default: the
// coordinator's cap, --max-hold). Past acquisition + maxHold the coordinator
// refuses renewals and the Lock reports ErrLost.
func WithMaxHold(d time.Duration) AcquireOption { return func(o *acquireOptions) { o.maxHold = d } }

// WithLockDelay asks that, if this grant ends involuntarily (expiry, forced
// release), nobody be granted the lock for d afterwards; a Release never
// delays. Default: no delay.
func WithLockDelay(d time.Duration) AcquireOption { return func(o *acquireOptions) { o.lockDelay = d } }

func newRequestID() string {
	var b [16]byte
	_, _ = cryptorand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// resolveAcquire applies opts; every acquisition outside a session gets a
// request id, so that its retries are one acquisition.
func resolveAcquire(opts []AcquireOption) acquireOptions {
	o := acquireOptions{}
	for _, opt := range opts {
		opt(&o)
	}
	if o.requestID == "" && o.session == "" {
		o.requestID = newRequestID()
	}
	return o
}

// request is the one AcquireRequest every acquisition of the SDK sends.
func (o *acquireOptions) request(name string) *coordinatorv1.AcquireRequest {
	req := &coordinatorv1.AcquireRequest{Name: name, Owner: o.owner, RequestId: o.requestID, SessionHandle: o.session}
	if o.ttl != 0 {
		req.Ttl = durationpb.New(o.ttl)
	}
	if o.wait != nil {
		req.Wait = durationpb.New(*o.wait)
	}
	if o.maxHold != 0 {
		req.MaxHold = durationpb.New(o.maxHold)
	}
	if o.lockDelay != 0 {
		req.LockDelay = durationpb.New(o.lockDelay)
	}
	req.Limit = o.limit
	if o.shared {
		req.Mode = coordinatorv1.LockMode_LOCK_MODE_SHARED
	}
	return req
}

// acquire sends the acquisition, retrying UNAVAILABLE with the same request
// id (a session acquisition has none, and is sent once), and returns the
// grant with the local time of the first send: the lease cannot end before
// it plus the TTL.
func (c *Client) acquire(ctx context.Context, name string, o acquireOptions) (Grant, time.Time, error) {
	if c.isClosed() {
		return Grant{}, time.Time{}, ErrClosed
	}
	req := o.request(name)
	var (
		resp     *coordinatorv1.AcquireResponse
		first    time.Time
		attempts int
	)
	call := func(ctx context.Context) error {
		if attempts == 0 {
			first = time.Now()
		}
		attempts++
		var err error
		resp, err = c.lc.Acquire(ctx, req)
		return err
	}
	var err error
	if o.session != "" {
		err = call(ctx)
	} else {
		err = c.retry(ctx, call)
	}
	if err != nil {
		if ReasonOf(err) == ReasonLockHeld {
			return Grant{}, first, &HeldError{Name: name, HolderToken: holderToken(err), err: err}
		}
		return Grant{}, first, err
	}
	return grantOf(name, resp), first, nil
}

// Acquire waits for the lock name and returns it held, with heartbeats
// running. It retries UNAVAILABLE answers with jittered exponential backoff,
// always with the same request id, until ctx ends. When the lock is not
// granted within WithWait, the error is a *HeldError (errors.Is ErrLockHeld);
// other errors are gRPC status errors (INVALID_ARGUMENT, DEADLINE_EXCEEDED,
// ...), or ErrClosed.
func (c *Client) Acquire(ctx context.Context, name string, opts ...AcquireOption) (*Lock, error) {
	g, first, err := c.acquire(ctx, name, resolveAcquire(opts))
	if err != nil {
		return nil, err
	}
	return c.start(ctx, newLock(c), g, first)
}

// start makes l the held lock of grant g, first asked for at the local time
// first, and starts its heartbeat.
func (c *Client) start(ctx context.Context, l *Lock, g Grant, first time.Time) (*Lock, error) {
	l.ref, l.ttl, l.margin = g.GrantRef, g.TTL, c.margin(g.TTL)
	l.slot, l.shared = g.Slot, g.Shared
	// The lease ends no earlier than the first send plus the TTL: a grant
	// (or the refresh at the end of a wait) happens after that.
	l.safeUntil = first.Add(g.TTL - l.margin)
	if !c.track(l) {
		rctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		_ = l.end(rctx, ErrClosed) // best effort: an unreleased grant ends with its TTL
		cancel()
		return nil, ErrClosed
	}
	// After a long wait (or a retry), that bound may be close: confirm the
	// grant with a renewal before handing it out.
	if time.Since(first) > l.interval() {
		if err := l.confirm(ctx); err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
			_ = l.end(rctx, err) // best effort: an unreleased grant ends with its TTL; err is the answer
			cancel()
			return nil, fmt.Errorf("client: lock %q granted (token %d) but not confirmed: %w", g.Name, g.Token, err)
		}
	}
	hctx, stop := context.WithCancel(c.root)
	l.stop = stop
	go l.heartbeat(hctx)
	return l, nil
}

// TryAcquire is Acquire that does not wait: a held lock answers a
// *HeldError (errors.Is ErrLockHeld) at once.
func (c *Client) TryAcquire(ctx context.Context, name string, opts ...AcquireOption) (*Lock, error) {
	return c.Acquire(ctx, name, append(opts, WithWait(0))...)
}

// holderToken reads the holder's token from the LOCK_HELD ErrorInfo of an
// Acquire (0 if it has none).
func holderToken(err error) int64 {
	n, _ := strconv.ParseInt(MetadataOf(err)["holderToken"], 10, 64)
	return n
}
