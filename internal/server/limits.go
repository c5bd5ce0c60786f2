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

// Limits bound what one request may ask of the queue. The limits on how
// many may queue (waiters per lock, locks per identity) are the lease
// domain's (lease.WithMaxWaitersPerLock, lease.WithMaxLocksPerIdentity):
// exact only where the join is committed, they are enforced in its etcd
// transaction, not here.
type Limits struct {
	// MaxWait bounds the queue wait of Acquire; 0: no bound. An Acquire
	// without a wait waits at most this long (then ABORTED); one asking for
	// more is INVALID_ARGUMENT (field "wait"), like a TTL above the max TTL.
	MaxWait time.Duration
}

// ownedOptions name the authenticated identity (never a request field) to
// the lease domain, which counts the acquisition against that identity's
// limit (lease.WithMaxLocksPerIdentity). Without an identity (no
// authorization policy) there is nothing to count against: client
// addresses are shared behind NAT and a Service, so they would make a poor
// quota key.
func ownedOptions(ctx context.Context) []lease.AcquireOption {
	id, ok := authz.FromContext(ctx)
	if !ok || id == "" {
		return nil
	}
	return []lease.AcquireOption{lease.WithIdentity(id)}
}

// Interceptor enforces the limits on Acquire.
func (l Limits) Interceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if r, ok := req.(*coordinatorv1.AcquireRequest); ok && info.FullMethod == coordinatorv1.LockService_Acquire_FullMethodName {
			if err := l.check(r); err != nil {
				return nil, err
			}
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
		return h(srv, &limitStream{ServerStream: ss, l: l})
	}
}

type limitStream struct {
	grpc.ServerStream
	l Limits
}

func (s *limitStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if r, ok := m.(*coordinatorv1.HoldRequest); ok && r.GetAcquire().GetRequest() != nil {
		return s.l.check(r.GetAcquire().GetRequest())
	}
	return nil
}

func (l Limits) check(r *coordinatorv1.AcquireRequest) error {
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
