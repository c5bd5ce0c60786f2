package server

import (
	"context"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/coordinatord/coordinatord/internal/authz"
)

// identify names the caller of a call (authentication): the identity a
// member replica asserted for a call it forwarded, verified by its member
// secret (forwardedIdentity; refused without it), else the verified client
// certificate, else the bearer token; never a request field.
func identify(ctx context.Context, store *authz.Store, fromCN bool) (string, error) {
	if id, claimed, err := forwardedIdentity(ctx); claimed {
		return id, err
	}
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 && len(ti.State.VerifiedChains[0]) > 0 {
			if id := authz.IdentityFromCert(ti.State.VerifiedChains[0][0], fromCN); id != "" {
				return id, nil
			}
			if fromCN {
				return "", errUnauthenticated("the client certificate names no identity (no URI SAN, DNS SAN or CN)")
			}
			return "", errUnauthenticated("the client certificate names no identity: it has no URI SAN (e.g. a SPIFFE ID) or DNS SAN; " +
				"issue it with one (its subject CN counts only with --tls-identity-from-cn)")
		}
	}
	// Not FromIncomingContext: it copies every key of the metadata on
	// every call (28% of the interceptor chain's CPU with a bearer token).
	vals := metadata.ValueFromIncomingContext(ctx, "authorization")
	if len(vals) == 0 {
		return "", errNoCredentials("no client certificate and no bearer token: present a client certificate or the metadata \"authorization: Bearer <token>\"")
	}
	tok, ok := bearerToken(vals[0])
	if !ok || len(vals) > 1 {
		return "", errUnauthenticated("malformed authorization metadata: want exactly one \"Bearer <token>\"")
	}
	id, ok := store.Tokens().Lookup(tok)
	if !ok {
		return "", errUnauthenticated("unknown bearer token")
	}
	return id, nil
}

// bearerToken is the token of an "authorization" value "Bearer <token>";
// the scheme is case-insensitive (RFC 9110, section 11.1), so "bearer" and
// "BEARER" are the same.
func bearerToken(v string) (string, bool) {
	scheme, tok, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return "", false
	}
	return tok, true
}
