package server

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/authz"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// Limits protect the service from one lock's crowd.
type Limits struct {
	// MaxWaiters is the most contenders that may wait for one lock (the
	// holder not counted); 0: no limit. Acquire beyond it (unless it is a
	// try-lock) answers RESOURCE_EXHAUSTED. It is a soft limit: the queue is
	// counted just before joining, so concurrent joiners may overshoot it
	// by a few.
	MaxWaiters int64
	// MaxWait bounds the queue wait of Acquire; 0: no bound. An Acquire
	// without a wait waits at most this long (then ABORTED); one asking for
	// more is INVALID_ARGUMENT (field "wait"), like a TTL above the max TTL.
	MaxWait time.Duration
	// QueueLen counts a lock's contenders, holder included.
	QueueLen func(ctx context.Context, name string) (int64, error)
	// MaxLocksPerIdentity is the most locks one authenticated identity may
	// hold or wait for at once, across every replica sharing the key prefix
	// (holders and waiters count alike); 0: no limit. An Acquire (or Hold)
	// beyond it answers RESOURCE_EXHAUSTED, writing nothing; a retry with
	// the request id of a live acquisition is still answered. It is a soft
	// limit: the identity's acquisitions are counted just before joining, so
	// concurrent acquisitions may overshoot it by a few. Without an identity
	// (no authorization policy) it does not apply: client addresses are
	// shared behind NAT and a Service, so they would make a poor quota key.
	MaxLocksPerIdentity int64
}

// ownedLimitKey carries the per-identity limit from the Limits interceptors
// to the Acquire and Hold handlers, which pass it to the lease package.
type ownedLimitKey struct{}

type ownedLimit struct {
	identity string
	max      int64
}

// withOwnedLimit returns ctx carrying the per-identity limit if it applies
// (a limit is set and the caller is authenticated).
func (l Limits) withOwnedLimit(ctx context.Context) context.Context {
	if l.MaxLocksPerIdentity <= 0 {
		return ctx
	}
	id, ok := authz.FromContext(ctx)
	if !ok || id == "" {
		return ctx
	}
	return context.WithValue(ctx, ownedLimitKey{}, ownedLimit{identity: id, max: l.MaxLocksPerIdentity})
}

// ownedOptions are the lease options of the per-identity limit in ctx: the
// acquisition is indexed under the authenticated identity (never a request
// field) and refused beyond the limit.
func ownedOptions(ctx context.Context) []lease.AcquireOption {
	ol, ok := ctx.Value(ownedLimitKey{}).(ownedLimit)
	if !ok {
		return nil
	}
	return []lease.AcquireOption{lease.WithIdentity(ol.identity), lease.WithOwnedLimit(ol.max)}
}

// Interceptor enforces the limits on Acquire.
func (l Limits) Interceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if r, ok := req.(*coordinatorv1.AcquireRequest); ok && info.FullMethod == coordinatorv1.LockService_Acquire_FullMethodName {
			if err := l.check(ctx, r); err != nil {
				return nil, err
			}
			ctx = l.withOwnedLimit(ctx)
		}
		return h(ctx, req)
	}
}

// StreamInterceptor enforces the limits on the acquire message of Hold
// streams.
func (l Limits) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if info.FullMethod != coordinatorv1.LockService_Hold_FullMethodName {
			return h(srv, ss)
		}
		return h(srv, &limitStream{ServerStream: ss, l: l, ctx: l.withOwnedLimit(ss.Context())})
	}
}

type limitStream struct {
	grpc.ServerStream
	l   Limits
	ctx context.Context
}

func (s *limitStream) Context() context.Context { return s.ctx }

func (s *limitStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if r, ok := m.(*coordinatorv1.HoldRequest); ok && r.GetAcquire().GetRequest() != nil {
		return s.l.check(s.Context(), r.GetAcquire().GetRequest())
	}
	return nil
}

func (l Limits) check(ctx context.Context, r *coordinatorv1.AcquireRequest) error {
	if l.MaxWait > 0 {
		switch w := r.GetWait(); {
		case w == nil:
			r.Wait = durationpb.New(l.MaxWait)
		case w.CheckValid() == nil && w.AsDuration() > l.MaxWait:
			st := status.New(codes.InvalidArgument, fmt.Sprintf("wait: is %v; the server allows at most %v (--max-wait)", w.AsDuration(), l.MaxWait))
			return withDetails(st, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
				{Field: "wait", Description: fmt.Sprintf("at most %v (--max-wait)", l.MaxWait)},
			}})
		}
	}
	tryLock := r.GetWait() != nil && r.GetWait().AsDuration() == 0
	if l.MaxWaiters > 0 && l.QueueLen != nil && !tryLock {
		// On error (bad name, etcd down) the handler answers properly.
		if n, err := l.QueueLen(ctx, r.GetName()); err == nil && n-1 >= l.MaxWaiters {
			return status.Errorf(codes.ResourceExhausted,
				"lock %q already has %d waiters, the most allowed (--max-waiters-per-lock); retry later", r.GetName(), n-1)
		}
	}
	return nil
}

// RateLimit returns interceptors that allow each caller rps requests per
// second with bursts of burst, and answer RESOURCE_EXHAUSTED (reason
// RATE_LIMITED) beyond. The caller is the authenticated identity, or,
// without authorization, the client's IP address. Opening a stream is one
// request and so is every further message the client sends on it (each
// Hold heartbeat renews a lease in etcd, like a KeepAlive call): a message
// beyond the limit ends the stream with that error. Health and reflection
// are not limited.
func RateLimit(rps float64, burst int) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	rl := &rateLimiter{rps: rate.Limit(rps), burst: burst, m: map[string]*callerLimit{}}
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if !exempt(info.FullMethod) {
			if err := rl.allow(ctx); err != nil {
				return nil, err
			}
		}
		return h(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if exempt(info.FullMethod) {
			return h(srv, ss)
		}
		if err := rl.allow(ss.Context()); err != nil {
			return err
		}
		return h(srv, &rateStream{ServerStream: ss, rl: rl})
	}
	return unary, stream
}

// rateStream counts every message after the first against the rate limit
// (the first is the stream's opening, counted already).
type rateStream struct {
	grpc.ServerStream
	rl       *rateLimiter
	received bool
}

func (s *rateStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if !s.received {
		s.received = true
		return nil
	}
	return s.rl.allow(s.Context())
}

// maxCallers bounds the limiter table; idle callers are dropped beyond it.
const maxCallers = 10000

type rateLimiter struct {
	rps   rate.Limit
	burst int
	mu    sync.Mutex
	m     map[string]*callerLimit
}

type callerLimit struct {
	lim  *rate.Limiter
	seen time.Time
}

func caller(ctx context.Context) string {
	if id, ok := authz.FromContext(ctx); ok {
		return "id:" + id
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
			return "ip:" + host
		}
		return "addr:" + p.Addr.String()
	}
	return "unknown"
}

func (r *rateLimiter) allow(ctx context.Context) error {
	key := caller(ctx)
	now := time.Now()
	r.mu.Lock()
	c, ok := r.m[key]
	if !ok {
		if len(r.m) >= maxCallers {
			for k, v := range r.m {
				if now.Sub(v.seen) > time.Minute {
					delete(r.m, k)
				}
			}
		}
		c = &callerLimit{lim: rate.NewLimiter(r.rps, r.burst)}
		r.m[key] = c
	}
	c.seen = now
	ok = c.lim.AllowN(now, 1)
	r.mu.Unlock()
	if !ok {
		return withReason(codes.ResourceExhausted,
			fmt.Sprintf("rate limit of %g requests/s (burst %d) exceeded for this caller (--rate-limit; every stream message counts); slow down and retry", float64(r.rps), r.burst),
			"RATE_LIMITED", map[string]string{"limit": strconv.FormatFloat(float64(r.rps), 'g', -1, 64), "burst": strconv.Itoa(r.burst)})
	}
	return nil
}
