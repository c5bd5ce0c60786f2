package server_test

import (
	"crypto/tls"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/server"
	"github.com/coordinatord/coordinatord/internal/testpki"
	"github.com/coordinatord/coordinatord/internal/tlsconf"
)

// tlsServer writes a server certificate (and, for mTLS, the client CA) and
// returns the server option.
func tlsServer(t *testing.T, ca *testpki.CA, mutual bool) server.Option {
	t.Helper()
	dir := t.TempDir()
	cert, key := ca.Localhost().Write(dir, "server")
	caFile := ""
	if mutual {
		caFile = ca.WriteCA(dir, "ca")
	}
	s, err := tlsconf.NewServer(cert, key, caFile)
	if err != nil {
		t.Fatal(err)
	}
	return server.WithServerOptions(grpc.Creds(credentials.NewTLS(s.Config())))
}

func TestMutualTLS(t *testing.T) {
	ca, other := testpki.NewCA("coordinatord test CA"), testpki.NewCA("another CA")
	e := newEnvWith(t, []server.Option{tlsServer(t, ca, true)})

	valid := ca.Issue(testpki.Leaf{CN: "client"}).TLS()
	expired := ca.Issue(testpki.Leaf{CN: "client", NotAfter: time.Now().Add(-time.Minute)}).TLS()
	foreign := other.Issue(testpki.Leaf{CN: "client"}).TLS()
	for _, tc := range []struct {
		name  string
		certs []tls.Certificate
		max   uint16
		want  codes.Code
	}{
		{"valid certificate", []tls.Certificate{valid}, 0, codes.OK},
		{"valid certificate, TLS 1.2", []tls.Certificate{valid}, tls.VersionTLS12, codes.OK},
		{"no certificate", nil, 0, codes.Unavailable},
		{"certificate from another CA", []tls.Certificate{foreign}, 0, codes.Unavailable},
		{"expired certificate", []tls.Certificate{expired}, 0, codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lc := e.dialWith(withTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: tc.certs, MaxVersion: tc.max}))
			_, err := lc.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: "n", Token: 1})
			if code(err) != tc.want {
				t.Fatalf("ValidateToken = %v, want %v", err, tc.want)
			}
		})
	}
	t.Run("TLS 1.1 is refused", func(t *testing.T) {
		lc := e.dialWith(withTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{valid}, MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}))
		if _, err := lc.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: "n", Token: 1}); code(err) != codes.Unavailable {
			t.Fatalf("ValidateToken over TLS 1.1 = %v, want UNAVAILABLE", err)
		}
	})
	t.Run("plaintext is refused", func(t *testing.T) {
		lc := e.dialWith(plaintext())
		if _, err := lc.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: "n", Token: 1}); code(err) != codes.Unavailable {
			t.Fatalf("ValidateToken in plaintext = %v, want UNAVAILABLE", err)
		}
	})
}

func TestServerTLSWithoutClientCertificates(t *testing.T) {
	ca := testpki.NewCA("coordinatord test CA")
	e := newEnvWith(t, []server.Option{tlsServer(t, ca, false)})
	lc := e.dialWith(withTLS(&tls.Config{RootCAs: ca.Pool()}))
	if _, err := lc.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: "n", Token: 1}); err != nil {
		t.Fatalf("ValidateToken over server-only TLS: %v", err)
	}
	untrusting := e.dialWith(withTLS(&tls.Config{RootCAs: testpki.NewCA("other").Pool()}))
	if _, err := untrusting.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: "n", Token: 1}); code(err) != codes.Unavailable {
		t.Fatalf("a client that does not trust the server's CA got %v, want UNAVAILABLE", err)
	}
}
