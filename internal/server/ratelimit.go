package server

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"github.com/coordinatord/coordinatord/internal/authz"
)

// RateLimit returns interceptors that allow each caller rps requests per
// second with bursts of burst, and answer RESOURCE_EXHAUSTED (reason
// RATE_LIMITED) beyond. The caller is the authenticated identity, or,
// without authorization, the client's IP address. Opening a stream is one
// request and so is every further message the client sends on it (each
// Hold heartbeat renews a lease in etcd, like a KeepAlive call): a message
// beyond the limit ends the stream with that error. Health and reflection
// are not limited.
func RateLimit(rps float64, burst int) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	rl := &rateLimiter{rps: rate.Limit(rps), burst: burst, m: map[callerKey]*callerLimit{}}
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
	m     map[callerKey]*callerLimit
}

type callerLimit struct {
	lim  *rate.Limiter
	seen time.Time
}

// caller is the key of the per-caller limits (the rate limit, the stream
// caps): the authenticated identity, or, without authorization, the
// client's IP address.
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

// callerKey is caller's identity as a map key, built without allocating
// for a TCP peer (caller's string was a third of the rate limit's CPU): the
// identity, else the IP address (compared as caller compares its string
// form: an IPv4-mapped IPv6 address is its IPv4 address), else caller.
type callerKey struct {
	id    string
	ip    netip.Addr
	other string
}

func rateKey(ctx context.Context) callerKey {
	if id, ok := authz.FromContext(ctx); ok {
		return callerKey{id: id}
	}
	if p, ok := peer.FromContext(ctx); ok {
		if a, ok := p.Addr.(*net.TCPAddr); ok && a != nil {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				return callerKey{ip: ip.Unmap().WithZone(a.Zone)}
			}
		}
	}
	return callerKey{other: caller(ctx)}
}

func (r *rateLimiter) allow(ctx context.Context) error {
	key := rateKey(ctx)
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
	var wait time.Duration
	if !ok {
		wait = tokenWait(c.lim.TokensAt(now), r.rps)
	}
	r.mu.Unlock()
	if !ok {
		return errRateLimited(float64(r.rps), r.burst, wait)
	}
	return nil
}

// tokenWait is how long a bucket holding tokens (less than one) takes to
// refill to one token at rps: the RetryInfo of a RATE_LIMITED refusal.
func tokenWait(tokens float64, rps rate.Limit) time.Duration {
	if rps <= 0 || tokens >= 1 {
		return 0
	}
	return time.Duration((1 - tokens) / float64(rps) * float64(time.Second))
}
