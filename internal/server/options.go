package server

import (
	"bytes"

	"google.golang.org/grpc"
)

type serverOptions struct {
	outerUnary  []grpc.UnaryServerInterceptor
	outerStream []grpc.StreamServerInterceptor
	innerUnary  []grpc.UnaryServerInterceptor
	innerStream []grpc.StreamServerInterceptor
	grpc        []grpc.ServerOption

	memberSecret []byte            // WithMemberSecret
	peerDial     []grpc.DialOption // WithPeerDialOptions
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

// WithMemberSecret sets the secret the member replicas of the shard core
// share (-member-secret-file; printable ASCII, at least MinMemberSecret
// bytes): this replica sends it with the identity of every call it
// forwards, and accepts an identity asserted by a peer only with it
// (compared in constant time). Without it, an asserted identity is refused
// UNAUTHENTICATED and authenticated calls are not forwarded.
func WithMemberSecret(secret []byte) Option {
	return func(o *serverOptions) { o.memberSecret = bytes.Clone(secret) }
}

// WithPeerDialOptions sets the options of the connections to peers that
// calls are forwarded to (their transport credentials: TLS when the
// replicas serve TLS; default: plaintext).
func WithPeerDialOptions(opts ...grpc.DialOption) Option {
	return func(o *serverOptions) { o.peerDial = append(o.peerDial, opts...) }
}
