package server_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/authz"
	"github.com/coordinatord/coordinatord/internal/server"
	"github.com/coordinatord/coordinatord/internal/testpki"
)

const testPolicy = `{
  "admins": ["ops"],
  "identities": {
    "spiffe://test/team-a": {"lock_prefixes": ["a/", "shared/"], "resource_prefixes": ["res-a/"]},
    "b.example":            {"lock_prefixes": ["b/", "shared/"]}
  }
}`

func tokenHash(tok string) string { s := sha256.Sum256([]byte(tok)); return hex.EncodeToString(s[:]) }

// authStore writes the test policy and a token file (token "tok-<id>" for
// each listed identity) and loads them.
func authStore(t *testing.T, policy string, tokenIDs ...string) (*authz.Store, string) {
	t.Helper()
	dir := t.TempDir()
	pf, tf := filepath.Join(dir, "policy.json"), filepath.Join(dir, "tokens")
	var tokens string
	for _, id := range tokenIDs {
		tokens += id + " " + tokenHash("tok-"+id) + "\n"
	}
	if err := os.WriteFile(pf, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tf, []byte(tokens), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := authz.NewStore(pf, tf)
	if err != nil {
		t.Fatal(err)
	}
	return s, pf
}

func authOption(s *authz.Store) server.Option { return authOptionWith(s) }

func authOptionWith(s *authz.Store, opts ...server.AuthOption) server.Option {
	u, st := server.AuthInterceptors(s, opts...)
	return server.WithInnerInterceptors([]grpc.UnaryServerInterceptor{u}, []grpc.StreamServerInterceptor{st})
}

func TestAuthorizationMatrix(t *testing.T) {
	ca := testpki.NewCA("coordinatord test CA")
	store, _ := authStore(t, testPolicy)
	e := newEnvWith(t, []server.Option{tlsServer(t, ca, true), authOption(store)})

	// The identity comes from the URI SAN, else the DNS SAN (never the CN by
	// default: TestCertificateCNIsNoIdentityByDefault).
	client := func(l testpki.Leaf) coordinatorv1.LockServiceClient {
		return e.dialWith(withTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Issue(l).TLS()}}))
	}
	callers := map[string]coordinatorv1.LockServiceClient{
		"a":        client(testpki.Leaf{CN: "ops", DNS: []string{"b.example"}, URIs: []string{"spiffe://test/team-a"}}),
		"b":        client(testpki.Leaf{CN: "ops", DNS: []string{"b.example"}}),
		"ops":      client(testpki.Leaf{CN: "stranger", DNS: []string{"ops"}}),
		"stranger": client(testpki.Leaf{CN: "ops", DNS: []string{"stranger"}}),
	}
	ops := callers["ops"]
	held := map[string]*coordinatorv1.AcquireResponse{}
	for _, n := range []string{"a/held", "b/held"} {
		r, err := ops.Acquire(ctxT(t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: n, Ttl: dur(time.Minute)})
		if err != nil {
			t.Fatalf("admin acquire %s: %v", n, err)
		}
		held[n] = r
	}
	wrongHandle := map[string]string{"a/held": held["b/held"].Handle, "b/held": held["a/held"].Handle}

	type op struct {
		name    string
		call    func(lc coordinatorv1.LockServiceClient, lock string) error
		allowed codes.Code // the answer when authorized
		needs   func(caller, lock string) bool
	}
	inLock := func(caller, lock string) bool { return caller == "ops" || caller == lock[:1] }
	ctx := func() context.Context { return ctxT(t, 10*time.Second) }
	opsTable := []op{
		{"Acquire", func(lc coordinatorv1.LockServiceClient, lock string) error {
			_, err := lc.Acquire(ctx(), &coordinatorv1.AcquireRequest{Name: lock, Wait: dur(0)})
			return err
		}, codes.Aborted, inLock},
		{"Release", func(lc coordinatorv1.LockServiceClient, lock string) error {
			r, err := lc.Release(ctx(), &coordinatorv1.ReleaseRequest{Name: lock, Token: held[lock].Token, Handle: wrongHandle[lock]})
			if err == nil && r.Released {
				return fmt.Errorf("released with a wrong handle")
			}
			return err
		}, codes.OK, inLock},
		{"KeepAlive", func(lc coordinatorv1.LockServiceClient, lock string) error {
			_, err := lc.KeepAlive(ctx(), &coordinatorv1.KeepAliveRequest{Name: lock, Token: held[lock].Token, Handle: wrongHandle[lock]})
			return err
		}, codes.NotFound, inLock},
		{"ValidateToken", func(lc coordinatorv1.LockServiceClient, lock string) error {
			r, err := lc.ValidateToken(ctx(), &coordinatorv1.ValidateTokenRequest{Name: lock, Token: held[lock].Token})
			if err == nil && !r.Valid {
				return fmt.Errorf("valid=false for the holder's token")
			}
			return err
		}, codes.OK, inLock},
		{"ValidateToken with resource", func(lc coordinatorv1.LockServiceClient, lock string) error {
			// A resource per lock: a mark belongs to the first lock that raised it.
			_, err := lc.ValidateToken(ctx(), &coordinatorv1.ValidateTokenRequest{Name: lock, Token: held[lock].Token, Resource: "res-a/db-" + lock})
			return err
		}, codes.OK, func(caller, lock string) bool { return caller == "ops" || caller == "a" && lock == "a/held" }},
		{"Describe", func(lc coordinatorv1.LockServiceClient, lock string) error {
			r, err := lc.Describe(ctx(), &coordinatorv1.DescribeRequest{Name: lock})
			if err == nil && r.GetHolder().GetToken() != held[lock].Token {
				return fmt.Errorf("Describe shows holder %v", r.GetHolder())
			}
			return err
		}, codes.OK, inLock},
		{"List own prefix", func(lc coordinatorv1.LockServiceClient, lock string) error {
			r, err := lc.List(ctx(), &coordinatorv1.ListRequest{Prefix: lock[:2]})
			if err == nil && len(r.Holders) != 1 {
				return fmt.Errorf("List %q shows %d holders", lock[:2], len(r.Holders))
			}
			return err
		}, codes.OK, inLock},
		{"List everything", func(lc coordinatorv1.LockServiceClient, lock string) error {
			r, err := lc.List(ctx(), &coordinatorv1.ListRequest{})
			if err == nil && len(r.Holders) != 2 {
				return fmt.Errorf("List shows %d holders", len(r.Holders))
			}
			return err
		}, codes.OK, func(caller, _ string) bool { return caller == "ops" }},
	}
	for _, o := range opsTable {
		for caller, lc := range callers {
			for _, lock := range []string{"a/held", "b/held"} {
				t.Run(fmt.Sprintf("%s/%s/%s", o.name, caller, lock), func(t *testing.T) {
					want := codes.PermissionDenied
					if o.needs(caller, lock) {
						want = o.allowed
					}
					err := o.call(lc, lock)
					if code(err) != want || want == codes.OK && err != nil {
						t.Fatalf("%s by %s on %s = %v, want %v", o.name, caller, lock, err, want)
					}
				})
			}
		}
	}
	// Nothing above changed the grants.
	for n, g := range held {
		if v, err := ops.ValidateToken(ctx(), &coordinatorv1.ValidateTokenRequest{Name: n, Token: g.Token}); err != nil || !v.Valid {
			t.Fatalf("%s no longer held after the matrix: %v, %v", n, v, err)
		}
	}
}

func TestAnotherIdentitysGrantCannotBeTakenByGuessing(t *testing.T) {
	ca := testpki.NewCA("coordinatord test CA")
	store, _ := authStore(t, testPolicy)
	e := newEnvWith(t, []server.Option{tlsServer(t, ca, true), authOption(store)})
	a := e.dialWith(withTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Issue(testpki.Leaf{URIs: []string{"spiffe://test/team-a"}}).TLS()}}))
	b := e.dialWith(withTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Issue(testpki.Leaf{DNS: []string{"b.example"}}).TLS()}}))

	g, err := a.Acquire(ctxT(t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: "shared/job", Ttl: dur(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	guess := func() string {
		s := make([]byte, 16)
		_, _ = rand.Read(s)
		return fmt.Sprintf("%016x.%s", uint64(g.LeaseId), base64.RawURLEncoding.EncodeToString(s))
	}
	ctx := ctxT(t, 60*time.Second)
	for i := range 1000 {
		token := g.Token
		if i%2 == 1 {
			token = g.Token + int64(i%7) - 3 // near-miss tokens as well
		}
		if i%4 < 2 {
			r, err := b.Release(ctx, &coordinatorv1.ReleaseRequest{Name: "shared/job", Token: token, Handle: guess()})
			if err != nil && code(err) != codes.InvalidArgument || err == nil && r.Released {
				t.Fatalf("guess %d: Release = %v, %v", i, r, err)
			}
		} else {
			_, err := b.KeepAlive(ctx, &coordinatorv1.KeepAliveRequest{Name: "shared/job", Token: token, Handle: guess()})
			if c := code(err); c != codes.NotFound && c != codes.InvalidArgument {
				t.Fatalf("guess %d: KeepAlive = %v, want NOT_FOUND", i, err)
			}
		}
	}
	if v, err := a.ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: "shared/job", Token: g.Token}); err != nil || !v.Valid {
		t.Fatalf("after 1000 guesses the grant is gone: %v, %v", v, err)
	}
	// The right token without the handle is not enough either.
	if r, err := b.Release(ctx, &coordinatorv1.ReleaseRequest{Name: "shared/job", Token: g.Token, Handle: guess()}); err != nil || r.Released {
		t.Fatalf("release by b = %v, %v", r, err)
	}
	if r, err := a.Release(ctx, &coordinatorv1.ReleaseRequest{Name: "shared/job", Token: g.Token, Handle: g.Handle}); err != nil || !r.Released {
		t.Fatalf("release by the grantee = %v, %v", r, err)
	}
}

// fakeStream feeds one request message to a stream handler.
type fakeStream struct {
	grpc.ServerStream
	ctx context.Context
	req *coordinatorv1.DescribeRequest
}

func (f *fakeStream) Context() context.Context { return f.ctx }

func (f *fakeStream) RecvMsg(m any) error {
	m.(*coordinatorv1.DescribeRequest).Name = f.req.Name
	return nil
}

func TestAdminOnlyMethodsAndStreams(t *testing.T) {
	store, _ := authStore(t, testPolicy, "ops", "b.example")
	unary, stream := server.AuthInterceptors(store)
	as := func(id string) context.Context {
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer tok-"+id))
	}
	ok := func(context.Context, any) (any, error) { return "ran", nil }
	const force = "/coordinator.v1.LockService/ForceRelease"
	for _, tc := range []struct {
		id, method string
		req        any
		want       codes.Code
	}{
		{"ops", force, &coordinatorv1.DescribeRequest{Name: "b/1"}, codes.OK},
		{"b.example", force, &coordinatorv1.DescribeRequest{Name: "b/1"}, codes.PermissionDenied},
		{"b.example", "/coordinator.v1.LockService/Future", &healthpb.HealthCheckRequest{}, codes.PermissionDenied}, // names no lock: admins only
		{"ops", "/coordinator.v1.LockService/Future", &healthpb.HealthCheckRequest{}, codes.OK},
	} {
		_, err := unary(as(tc.id), tc.req, &grpc.UnaryServerInfo{FullMethod: tc.method}, ok)
		if code(err) != tc.want {
			t.Errorf("%s calling %s = %v, want %v", tc.id, tc.method, err, tc.want)
		}
	}

	// Streams: every received message is checked.
	for _, tc := range []struct {
		id, name string
		want     codes.Code
	}{
		{"b.example", "b/1", codes.OK},
		{"b.example", "a/1", codes.PermissionDenied},
		{"ops", "a/1", codes.OK},
	} {
		err := stream(nil, &fakeStream{ctx: as(tc.id), req: &coordinatorv1.DescribeRequest{Name: tc.name}},
			&grpc.StreamServerInfo{FullMethod: "/coordinator.v1.LockService/Watch"},
			func(_ any, ss grpc.ServerStream) error {
				if id, _ := authz.FromContext(ss.Context()); id != tc.id {
					return fmt.Errorf("identity in context %q", id)
				}
				return ss.RecvMsg(&coordinatorv1.DescribeRequest{})
			})
		if code(err) != tc.want {
			t.Errorf("stream by %s on %s = %v, want %v", tc.id, tc.name, err, tc.want)
		}
	}
	err := stream(nil, &fakeStream{ctx: as("b.example")}, &grpc.StreamServerInfo{FullMethod: force}, func(any, grpc.ServerStream) error { return nil })
	if code(err) != codes.PermissionDenied {
		t.Errorf("admin-only stream by a non-admin = %v", err)
	}
}

func TestAuthorizationOfStreamsSessionsAndForceRelease(t *testing.T) {
	store, _ := authStore(t, testPolicy, "ops", "b.example", "stranger")
	e := newEnvWith(t, []server.Option{authOption(store)})
	as := func(id string) coordinatorv1.LockServiceClient {
		return e.dialWith(plaintext(), grpc.WithPerRPCCredentials(bearer("tok-"+id)))
	}
	b, ops, stranger := as("b.example"), as("ops"), as("stranger")
	ctx := func() context.Context { return ctxT(t, 10*time.Second) }

	hold := func(lc coordinatorv1.LockServiceClient, first *coordinatorv1.HoldRequest) (*coordinatorv1.HoldResponse, error) {
		st, err := lc.Hold(ctx())
		if err != nil {
			return nil, err
		}
		if err := st.Send(first); err != nil {
			return nil, err
		}
		return st.Recv()
	}
	acq := func(name string) *coordinatorv1.HoldRequest {
		return &coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Acquire{Acquire: &coordinatorv1.HoldAcquire{
			Request: &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(time.Minute)}}}}
	}
	if _, err := hold(b, acq("a/held")); code(err) != codes.PermissionDenied {
		t.Fatalf("Hold acquire outside the prefixes: %v, want PERMISSION_DENIED", err)
	}
	r, err := hold(b, acq("b/held"))
	if err != nil || r.GetGranted() == nil {
		t.Fatalf("Hold acquire inside the prefixes: %v, %v", r, err)
	}
	g := r.GetGranted()
	resume := func(name string) *coordinatorv1.HoldRequest {
		return &coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Resume{Resume: &coordinatorv1.HoldResume{Name: name, Token: g.Token, Handle: g.Handle}}}
	}
	if _, err := hold(b, resume("a/held")); code(err) != codes.PermissionDenied {
		t.Fatalf("Hold resume outside the prefixes: %v, want PERMISSION_DENIED", err)
	}
	if _, err := hold(stranger, resume("b/held")); code(err) != codes.PermissionDenied {
		t.Fatalf("Hold resume by an identity without a policy: %v, want PERMISSION_DENIED", err)
	}

	watch := func(lc coordinatorv1.LockServiceClient, name string) error {
		st, err := lc.Watch(ctx(), &coordinatorv1.WatchRequest{Name: name})
		if err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	}
	if err := watch(b, "a/held"); code(err) != codes.PermissionDenied {
		t.Fatalf("Watch outside the prefixes: %v, want PERMISSION_DENIED", err)
	}
	if err := watch(b, "b/held"); err != nil {
		t.Fatalf("Watch inside the prefixes: %v", err)
	}

	if _, err := b.ForceRelease(ctx(), &coordinatorv1.ForceReleaseRequest{Name: "b/held", Token: g.Token}); code(err) != codes.PermissionDenied {
		t.Fatalf("ForceRelease by a non-admin, own prefix: %v, want PERMISSION_DENIED", err)
	}

	for _, tc := range []struct {
		lc   coordinatorv1.LockServiceClient
		who  string
		want codes.Code
	}{{b, "b", codes.OK}, {ops, "ops", codes.OK}, {stranger, "stranger", codes.PermissionDenied}} {
		s, err := tc.lc.OpenSession(ctx(), &coordinatorv1.OpenSessionRequest{Ttl: dur(10 * time.Second)})
		if code(err) != tc.want {
			t.Fatalf("OpenSession by %s: %v, want %v", tc.who, err, tc.want)
		}
		if err == nil {
			if _, err := tc.lc.CloseSession(ctx(), &coordinatorv1.CloseSessionRequest{Handle: s.Handle}); err != nil {
				t.Fatalf("CloseSession by %s: %v", tc.who, err)
			}
		}
	}

	fr, err := ops.ForceRelease(ctx(), &coordinatorv1.ForceReleaseRequest{Name: "b/held", Token: g.Token})
	if err != nil || !fr.Released {
		t.Fatalf("ForceRelease by an admin: %v, %v", fr, err)
	}
}
