package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// The receiving side of a forwarded call's identity (see forward.go): a
// peer asserts its caller's identity with the member secret; this replica
// takes it, for authentication (identify), only with its own secret. A
// client can never claim another identity by pretending to be a replica.

// memberInterceptors check the identity a peer asserts for a forwarded
// call ("coordinatord-identity"): accepted, for identify, only with this
// replica's member secret ("coordinatord-member-secret", compared in
// constant time); otherwise the call is refused UNAUTHENTICATED
// (CREDENTIALS_INVALID) before any other interceptor sees it. A call that
// asserts no identity passes untouched. Without a member secret they are
// not installed, and identify refuses every asserted identity.
func memberInterceptors(secret []byte) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	want := sha256.Sum256(secret) // hashed: the comparison's time tells nothing of the length either
	verify := func(ctx context.Context, method string) (context.Context, error) {
		ids := metadata.ValueFromIncomingContext(ctx, mdIdentity)
		if len(ids) == 0 || exempt(method) {
			return ctx, nil
		}
		secrets := metadata.ValueFromIncomingContext(ctx, mdMemberSecret)
		ok := len(ids) == 1 && ids[0] != "" && len(secrets) == 1
		if ok {
			got := sha256.Sum256([]byte(secrets[0]))
			ok = subtle.ConstantTimeCompare(got[:], want[:]) == 1
		}
		if !ok {
			return nil, errForwardedIdentity("the member secret it came with is wrong or missing")
		}
		return context.WithValue(ctx, memberVerifiedKey{}, ids[0]), nil
	}
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, err := verify(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		ctx, err := verify(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return h(srv, &memberStream{ServerStream: ss, ctx: ctx})
	}
	return unary, stream
}

// memberVerifiedKey carries, from memberInterceptors to identify, the
// identity a peer asserted with the right member secret.
type memberVerifiedKey struct{}

type memberStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *memberStream) Context() context.Context { return s.ctx }

// forwardedIdentity is the identity a peer asserted for a forwarded call.
// claimed is false if the call asserts none; then identify goes on with the
// call's own credentials. An asserted identity that memberInterceptors did
// not verify is refused.
func forwardedIdentity(ctx context.Context) (id string, claimed bool, err error) {
	ids := metadata.ValueFromIncomingContext(ctx, mdIdentity)
	if len(ids) == 0 {
		return "", false, nil
	}
	if v, ok := ctx.Value(memberVerifiedKey{}).(string); ok && len(ids) == 1 && ids[0] == v {
		return v, true, nil
	}
	return "", true, errForwardedIdentity("this replica has no member secret (-member-secret-file)")
}

// errForwardedIdentity refuses an identity asserted in metadata without
// proof of membership.
func errForwardedIdentity(why string) error {
	return errUnauthenticated("the call asserts a forwarded identity (metadata " + mdIdentity + "), which only a member replica may do, and " +
		why + "; clients authenticate with a client certificate or a bearer token")
}
