package server

import (
	"sync"

	"google.golang.org/grpc"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// StreamCaps bound the Watch and Hold streams one caller may have open at
// once on this replica; 0 leaves a kind uncapped. Each open stream costs
// goroutines and buffers (10,000 Watch streams of one client: +206 MB), so
// without a cap one client can exhaust the replica.
//
// The caller is the one of the rate limit: the authenticated identity, or,
// without authorization, the client's IP address. Clients behind one NAT or
// proxy therefore share a cap when the daemon runs without -auth-policy: a
// deliberate choice, since a cap per connection would bound nothing (a
// client opens more connections) and one shared bucket would let one client
// lock out all others.
type StreamCaps struct {
	MaxWatch int // concurrent Watch streams per caller
	MaxHold  int // concurrent Hold streams per caller
}

// Interceptor refuses a Watch or Hold stream beyond the caller's cap with
// RESOURCE_EXHAUSTED (reason TOO_MANY_STREAMS) before its handler runs. It
// must run after authentication, which names the caller.
func (c StreamCaps) Interceptor() grpc.StreamServerInterceptor {
	open := &streamCounts{n: map[streamKey]int{}}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		var (
			limit int
			kind  string
		)
		switch info.FullMethod {
		case coordinatorv1.LockService_Watch_FullMethodName:
			limit, kind = c.MaxWatch, "Watch"
		case coordinatorv1.LockService_Hold_FullMethodName:
			limit, kind = c.MaxHold, "Hold"
		}
		if limit <= 0 {
			return h(srv, ss)
		}
		k := streamKey{caller: caller(ss.Context()), method: kind}
		if !open.take(k, limit) {
			return errTooManyStreams(k.caller, kind, limit)
		}
		defer open.give(k)
		return h(srv, ss)
	}
}

type streamKey struct{ caller, method string }

// streamCounts are the open streams per caller and kind; a caller with none
// has no entry, so the map is as large as the callers with open streams.
type streamCounts struct {
	mu sync.Mutex
	n  map[streamKey]int
}

// take counts one more stream of k if fewer than limit are open.
func (s *streamCounts) take(k streamKey, limit int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n[k] >= limit {
		return false
	}
	s.n[k]++
	return true
}

func (s *streamCounts) give(k streamKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n[k]--; s.n[k] <= 0 {
		delete(s.n, k)
	}
}
