package server

import (
	"context"
	"time"

	"google.golang.org/grpc"
)

// Limits once bounded, in an interceptor, the queue wait of Acquire by
// rewriting the request. Every limit on an acquisition is the lease
// domain's now, enforced where the queue is (lease.WithMaxWait,
// lease.WithMaxWaitersPerLock, lease.WithMaxLocksPerIdentity), and refused
// with a domain error that toStatus maps.
//
// Deprecated: pass lease.WithMaxWait(MaxWait) to lease.New. Interceptor and
// StreamInterceptor call the handler unchanged; they stay only until the
// last caller from before the move is gone.
type Limits struct {
	MaxWait time.Duration
}

// Interceptor calls the handler unchanged (see Limits).
func (l Limits) Interceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return h(ctx, req)
	}
}

// StreamInterceptor calls the handler unchanged (see Limits).
func (l Limits) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return h(srv, ss)
	}
}
