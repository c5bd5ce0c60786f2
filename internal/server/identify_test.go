package server_test

import (
	"crypto/tls"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/server"
	"github.com/coordinatord/coordinatord/internal/testpki"
)

func TestBearerTokensAndExemptServices(t *testing.T) {
	store, pf := authStore(t, testPolicy, "b.example", "unlisted")
	e := newEnvWith(t, []server.Option{authOption(store)})
	call := func(lc coordinatorv1.LockServiceClient, name string) error {
		_, err := lc.Acquire(ctxT(t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: name, Wait: dur(0), Ttl: dur(time.Minute)})
		return err
	}
	for _, tc := range []struct {
		name string
		opts []grpc.DialOption
		lock string
		want codes.Code
	}{
		{"no token", nil, "b/1", codes.Unauthenticated},
		{"unknown token", []grpc.DialOption{grpc.WithPerRPCCredentials(bearer("guess"))}, "b/1", codes.Unauthenticated},
		{"token hash instead of token", []grpc.DialOption{grpc.WithPerRPCCredentials(bearer(tokenHash("tok-b.example")))}, "b/1", codes.Unauthenticated},
		{"valid token, own prefix", []grpc.DialOption{grpc.WithPerRPCCredentials(bearer("tok-b.example"))}, "b/1", codes.OK},
		{"valid token, other prefix", []grpc.DialOption{grpc.WithPerRPCCredentials(bearer("tok-b.example"))}, "a/1", codes.PermissionDenied},
		{"token of an identity without a policy", []grpc.DialOption{grpc.WithPerRPCCredentials(bearer("tok-unlisted"))}, "b/2", codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lc := e.dialWith(append([]grpc.DialOption{plaintext()}, tc.opts...)...)
			if err := call(lc, tc.lock); code(err) != tc.want {
				t.Fatalf("Acquire %s = %v, want %v", tc.lock, err, tc.want)
			}
		})
	}
	t.Run("malformed authorization", func(t *testing.T) {
		ctx := metadata.AppendToOutgoingContext(ctxT(t, 10*time.Second), "authorization", "Basic dG9rLWI=")
		if _, err := e.lc.Describe(ctx, &coordinatorv1.DescribeRequest{Name: "b/1"}); code(err) != codes.Unauthenticated {
			t.Fatalf("Describe with Basic auth = %v, want UNAUTHENTICATED", err)
		}
	})

	t.Run("health and reflection need no identity", func(t *testing.T) {
		if _, err := healthpb.NewHealthClient(e.conn).Check(ctxT(t, 10*time.Second), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("health: %v", err)
		}
		rs, err := reflectionpb.NewServerReflectionClient(e.conn).ServerReflectionInfo(ctxT(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if err := rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
			t.Fatal(err)
		}
		if _, err := rs.Recv(); err != nil {
			t.Fatalf("reflection: %v", err)
		}
		_ = rs.CloseSend()
	})

	t.Run("policy reload takes effect", func(t *testing.T) {
		lc := e.dialWith(plaintext(), grpc.WithPerRPCCredentials(bearer("tok-b.example")))
		if err := call(lc, "a/reload"); code(err) != codes.PermissionDenied {
			t.Fatalf("before reload: %v", err)
		}
		if err := os.WriteFile(pf, []byte(`{"identities": {"b.example": {"lock_prefixes": ["a/"]}}}`), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := store.Reload(); err != nil {
			t.Fatal(err)
		}
		if err := call(lc, "a/reload"); err != nil {
			t.Fatalf("after reload: %v", err)
		}
		if err := call(lc, "b/reload"); code(err) != codes.PermissionDenied {
			t.Fatalf("after reload, a removed prefix: %v", err)
		}
	})
}

// A CA-signed certificate whose subject CN is an admin's SPIFFE ID, and
// which has no SANs, is not that admin: by default it names no identity
// (UNAUTHENTICATED); its CN counts only with WithIdentityFromCN.
func TestCertificateCNIsNoIdentityByDefault(t *testing.T) {
	const admin = "spiffe://test/admin"
	store, _ := authStore(t, `{"admins": ["`+admin+`"], "identities": {"cn-only": {"lock_prefixes": ["c/"]}}}`)
	ca := testpki.NewCA("coordinatord test CA")
	dial := func(e *env, l testpki.Leaf) coordinatorv1.LockServiceClient {
		return e.dialWith(withTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Issue(l).TLS()}}))
	}
	forceRelease := func(lc coordinatorv1.LockServiceClient) error {
		_, err := lc.ForceRelease(ctxT(t, 10*time.Second), &coordinatorv1.ForceReleaseRequest{Name: "x", Token: 1})
		return err
	}
	list := func(lc coordinatorv1.LockServiceClient) error {
		_, err := lc.List(ctxT(t, 10*time.Second), &coordinatorv1.ListRequest{})
		return err
	}

	byDefault := newEnvWith(t, []server.Option{tlsServer(t, ca, true), authOption(store)})
	fromCN := newEnvWith(t, []server.Option{tlsServer(t, ca, true), authOptionWith(store, server.WithIdentityFromCN())})
	for _, tc := range []struct {
		name string
		e    *env
		leaf testpki.Leaf
		call func(coordinatorv1.LockServiceClient) error
		want codes.Code
	}{
		{"CN of the admin, no SANs: ForceRelease", byDefault, testpki.Leaf{CN: admin}, forceRelease, codes.Unauthenticated},
		{"CN of the admin, no SANs: List", byDefault, testpki.Leaf{CN: admin}, list, codes.Unauthenticated},
		{"CN of the admin, a DNS SAN of a stranger", byDefault, testpki.Leaf{CN: admin, DNS: []string{"stranger.example"}}, list, codes.PermissionDenied},
		{"URI SAN of the admin", byDefault, testpki.Leaf{URIs: []string{admin}}, list, codes.OK},
		{"with -tls-identity-from-cn: CN of the admin", fromCN, testpki.Leaf{CN: admin}, list, codes.OK},
		{"with -tls-identity-from-cn: a SAN still wins", fromCN, testpki.Leaf{CN: admin, DNS: []string{"stranger.example"}}, list, codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(dial(tc.e, tc.leaf)); code(err) != tc.want {
				t.Fatalf("%v, want %v", err, tc.want)
			}
		})
	}
}

// The authorization scheme is case-insensitive (RFC 9110, 11.1).
func TestBearerSchemeInAnyCase(t *testing.T) {
	store, _ := authStore(t, testPolicy, "b.example")
	e := newEnvWith(t, []server.Option{authOption(store)})
	for _, tc := range []struct {
		value string
		want  codes.Code
	}{
		{"Bearer tok-b.example", codes.OK},
		{"bearer tok-b.example", codes.OK},
		{"BEARER tok-b.example", codes.OK},
		{"bEaReR tok-b.example", codes.OK},
		{"Bearer", codes.Unauthenticated},
		{"Bearer ", codes.Unauthenticated},
		{"Bearertok-b.example", codes.Unauthenticated},
		{"Basic tok-b.example", codes.Unauthenticated},
	} {
		t.Run(tc.value, func(t *testing.T) {
			ctx := metadata.AppendToOutgoingContext(ctxT(t, 10*time.Second), "authorization", tc.value)
			if _, err := e.lc.Describe(ctx, &coordinatorv1.DescribeRequest{Name: "b/1"}); code(err) != tc.want {
				t.Fatalf("authorization %q: %v, want %v", tc.value, err, tc.want)
			}
		})
	}
}
