package server

import "google.golang.org/grpc"

type serverOptions struct {
	outerUnary  []grpc.UnaryServerInterceptor
	outerStream []grpc.StreamServerInterceptor
	innerUnary  []grpc.UnaryServerInterceptor
	innerStream []grpc.StreamServerInterceptor
	grpc        []grpc.ServerOption
}

// Option configures NewGRPCServer.
type Option func(*serverOptions)

// WithOuterInterceptors adds interceptors that run before logging (metrics).
func WithOuterInterceptors(u []grpc.UnaryServerInterceptor, s []grpc.StreamServerInterceptor) Option {
	return func(o *serverOptions) {
		o.outerUnary = append(o.outerUnary, u...)
		o.outerStream = append(o.outerStream, s...)
	}
}

// WithInnerInterceptors adds interceptors that run after logging and before
// panic recovery (authentication, authorization, limits), in order.
func WithInnerInterceptors(u []grpc.UnaryServerInterceptor, s []grpc.StreamServerInterceptor) Option {
	return func(o *serverOptions) {
		o.innerUnary = append(o.innerUnary, u...)
		o.innerStream = append(o.innerStream, s...)
	}
}

// WithServerOptions adds grpc.ServerOptions (credentials, message sizes,
// keepalive enforcement).
func WithServerOptions(opts ...grpc.ServerOption) Option {
	return func(o *serverOptions) { o.grpc = append(o.grpc, opts...) }
}
