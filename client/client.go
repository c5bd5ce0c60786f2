// Package client is the Go SDK of coordinatord: it acquires locks, keeps
// them alive in the background and tells the holder, through Lock.Done, the
// moment it must stop working under a lock.
//
// A lease is not proof of exclusive execution: a process can be paused or
// cut off past its lease and still believe it holds the lock. The SDK closes
// Lock.Done when the lease is lost and also when the lock's safe-until time
// passes without a confirmed renewal, and Done and Err check the clock
// themselves, so a process that wakes up from a pause sees the loss before
// it touches anything. Between that check and a write, a pause can still
// happen: pass Lock.Token with every write to a resource that checks it (see
// package fence).
//
// Safe-until time: each Acquire and each confirmed renewal sets
//
//	safe_until = (local time just before the request was sent) + granted TTL - margin
//
// The lease cannot end before the request was sent plus the TTL (etcd starts
// the TTL when the request arrives, or later), so the bound holds whatever
// the clocks of the coordinator and etcd say. The margin, max(TTL/10, 500ms)
// capped at TTL/2 unless WithSafetyMargin says otherwise, covers the local
// clock's drift over one TTL and the time between checking Done and acting.
//
// Heartbeats (KeepAlive) run every third of (TTL - margin), with ±10%
// jitter; a failed heartbeat is retried with jittered exponential backoff
// until it succeeds or safe_until passes. Hold is Acquire over one Hold
// stream, which carries the heartbeats and on which the coordinator pushes
// the grant's end: its Lock notices a force-release at once, not at the next
// heartbeat. Lock.Context is cancelled with Done, for the work done under
// the lock.
//
// Beside Acquire and Hold, the SDK has the whole API for tools and operators (it is
// all coordctl uses): AcquireGrant, a grant nothing renews, renewed and
// released by its GrantRef (KeepAlive, Release) from any process;
// ValidateToken; Describe; List and Pages over the held locks; Watch;
// ForceRelease; sessions (OpenSession), one lease for many locks; and the
// resources' high-water marks (GetMark, Marks, DeleteMark, RebindMark); and
// rate-limit counters (Hit, Counter, ResetCounter, and Limiter.Allow). Each
// call retries UNAVAILABLE as Acquire does when a retry is safe, and says
// so; its other errors are gRPC status errors.
package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// Errors a Lock reports through Err, and Acquire through its error.
var (
	// ErrLockHeld: Acquire was not granted within its wait (TryAcquire:
	// at once). The error is a *HeldError carrying the holder's token.
	ErrLockHeld = errors.New("client: lock held by someone else")
	// ErrLost: the coordinator says the grant is gone (expired, released by
	// someone with the handle, or renewal refused by policy). Stop working
	// under the lock; acquire again.
	ErrLost = errors.New("client: lock lost: the grant is gone")
	// ErrExpired: safe_until passed without a confirmed renewal (the process
	// was paused, or the coordinator was unreachable). Stop working under
	// the lock; acquire again.
	ErrExpired = errors.New("client: lock expired: safe-until time passed without a confirmed renewal")
	// ErrReleased: Release was called.
	ErrReleased = errors.New("client: lock released")
	// ErrClosed: the Client was closed.
	ErrClosed = errors.New("client: client closed")
)

// HeldError is the error of an Acquire not granted within its wait.
type HeldError struct {
	Name string
	// HolderToken is the current holder's token, 0 if the coordinator did
	// not say (or the lock was free by the time it looked).
	HolderToken int64
	err         error
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("client: lock %q held by token %d", e.Name, e.HolderToken)
}

// Is makes errors.Is(err, ErrLockHeld) true.
func (e *HeldError) Is(target error) bool { return target == ErrLockHeld }

// Unwrap returns the gRPC status error (ABORTED).
func (e *HeldError) Unwrap() error { return e.err }

// Defaults.
const (
	DefaultBackoffBase = 50 * time.Millisecond
	DefaultBackoffMax  = 2 * time.Second
	// minMargin is the smallest default safety margin.
	minMargin = 500 * time.Millisecond
	// releaseTimeout bounds the best-effort release of a lock abandoned by
	// its heartbeat (expired) or by Close.
	releaseTimeout = 2 * time.Second
)

type options struct {
	creds       credentials.TransportCredentials
	dialOpts    []grpc.DialOption
	backoffBase time.Duration
	backoffMax  time.Duration
	margin      time.Duration // 0: the default rule
}

// Option configures a Client.
type Option func(*options)

// WithTransportCredentials sets the connection's credentials (default:
// plaintext, for a loopback sidecar; use credentials.NewTLS for a daemon run
// with -tls-cert, adding a client certificate when it sets -tls-client-ca).
func WithTransportCredentials(c credentials.TransportCredentials) Option {
	return func(o *options) { o.creds = c }
}

// WithDialOptions adds gRPC dial options (interceptors, keepalive, ...).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
}

// WithBackoff sets the retry backoff of UNAVAILABLE answers: the n-th retry
// waits a random time in [d/2, d] with d = min(base * 2^n, max). Defaults:
// DefaultBackoffBase, DefaultBackoffMax.
func WithBackoff(base, max time.Duration) Option {
	return func(o *options) { o.backoffBase, o.backoffMax = base, max }
}

// WithSafetyMargin fixes the margin subtracted from each lease to compute
// safe_until (default: max(TTL/10, 500ms), at most TTL/2). It is capped at
// TTL/2 whatever is asked.
func WithSafetyMargin(d time.Duration) Option { return func(o *options) { o.margin = d } }

// Client talks to a coordinator. It is safe for concurrent use.
type Client struct {
	conn *grpc.ClientConn // nil when the caller owns the connection
	lc   coordinatorv1.LockServiceClient
	fc   coordinatorv1.FenceServiceClient
	cc   coordinatorv1.CounterServiceClient
	o    options

	root context.Context // cancelled by Close
	halt context.CancelFunc

	mu     sync.Mutex
	closed bool
	locks  map[*Lock]struct{}
}

// Dial connects to the coordinator at target (e.g. "127.0.0.1:7070", or any
// gRPC target such as "dns:///coordinatord:7070"). The connection is made
// lazily: Dial does not fail when the coordinator is down.
func Dial(target string, opts ...Option) (*Client, error) {
	o := newOptions(opts)
	creds := o.creds
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(target, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, o.dialOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("client: dial %q: %w", target, err)
	}
	c := newClient(conn, o)
	c.conn = conn
	return c, nil
}

// New returns a Client over a connection the caller made and closes.
// WithTransportCredentials and WithDialOptions are ignored.
func New(cc grpc.ClientConnInterface, opts ...Option) *Client {
	return newClient(cc, newOptions(opts))
}

func newOptions(opts []Option) options {
	o := options{backoffBase: DefaultBackoffBase, backoffMax: DefaultBackoffMax}
	for _, opt := range opts {
		opt(&o)
	}
	if o.backoffBase <= 0 {
		o.backoffBase = DefaultBackoffBase
	}
	if o.backoffMax < o.backoffBase {
		o.backoffMax = o.backoffBase
	}
	return o
}

func newClient(cc grpc.ClientConnInterface, o options) *Client {
	root, halt := context.WithCancel(context.Background())
	return &Client{lc: coordinatorv1.NewLockServiceClient(cc), fc: coordinatorv1.NewFenceServiceClient(cc), cc: coordinatorv1.NewCounterServiceClient(cc),
		o: o, root: root, halt: halt, locks: map[*Lock]struct{}{}}
}

// Close releases every lock still held (best effort, each bounded by 2s: a
// lock not released ends with its TTL), stops their heartbeats, and closes
// the connection if Dial made it. Locks report ErrClosed unless they were
// lost before.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	locks := make([]*Lock, 0, len(c.locks))
	for l := range c.locks {
		locks = append(locks, l)
	}
	c.mu.Unlock()
	for _, l := range locks {
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		_ = l.end(ctx, ErrClosed) // best effort, as promised: an unreleased lock ends with its TTL
		cancel()
	}
	c.halt()
	if c.conn != nil {
		return c.conn.Close()
	}
	return nil
}

// margin is the safety margin for a lease of ttl.
func (c *Client) margin(ttl time.Duration) time.Duration {
	m := c.o.margin
	if m <= 0 {
		m = max(ttl/10, minMargin)
	}
	return min(m, ttl/2)
}

// backoff is the jittered wait before retry n (0-based).
func (c *Client) backoff(n int) time.Duration {
	d := c.o.backoffMax
	if n < 30 {
		d = min(c.o.backoffBase<<n, c.o.backoffMax)
	}
	return d/2 + rand.N(d/2+1)
}

// retry calls f until it answers something other than UNAVAILABLE, waiting
// c.backoff between attempts; it gives up when ctx ends, returning the last
// error.
func (c *Client) retry(ctx context.Context, f func(context.Context) error) error {
	for n := 0; ; n++ {
		err := f(ctx)
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(c.backoff(n))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-c.root.Done():
			t.Stop()
			return ErrClosed
		case <-t.C:
		}
	}
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func (c *Client) track(l *Lock) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.locks[l] = struct{}{}
	return true
}

func (c *Client) untrack(l *Lock) {
	c.mu.Lock()
	delete(c.locks, l)
	c.mu.Unlock()
}
