package daemon_test

import (
	"crypto/tls"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/daemon"
	"github.com/coordinatord/coordinatord/internal/testpki"
)

func TestMutualTLSWithPlaintextHealthListener(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA("daemon CA")
	cert, key := ca.Localhost().Write(dir, "server")
	r := run(t, daemon.Config{TLSCert: cert, TLSKey: key, TLSClientCA: ca.WriteCA(dir, "ca"), HealthListen: "127.0.0.1:0"})

	client := ca.Issue(testpki.Leaf{CN: "c"}).TLS()
	secure := r.conn(t, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{client}})))
	if _, err := coordinatorv1.NewLockServiceClient(secure).ValidateToken(ctxT(t), &coordinatorv1.ValidateTokenRequest{Name: "n", Token: 1}); err != nil {
		t.Fatalf("mTLS client: %v", err)
	}
	if _, err := coordinatorv1.NewLockServiceClient(r.conn(t)).ValidateToken(ctxT(t), &coordinatorv1.ValidateTokenRequest{Name: "n", Token: 1}); status.Code(err) != codes.Unavailable {
		t.Fatalf("plaintext client on the TLS port: %v, want UNAVAILABLE", err)
	}

	// The probe port: plaintext, health only.
	hc, err := grpc.NewClient(r.health, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	eventually(t, "readiness SERVING on the probe port", func() bool {
		h, err := healthpb.NewHealthClient(hc).Check(ctxT(t), &healthpb.HealthCheckRequest{Service: "coordinator.v1.LockService"})
		return err == nil && h.Status == healthpb.HealthCheckResponse_SERVING
	})
	if h, err := healthpb.NewHealthClient(hc).Check(ctxT(t), &healthpb.HealthCheckRequest{}); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("liveness on the probe port: %v, %v", h, err)
	}
	if _, err := coordinatorv1.NewLockServiceClient(hc).ValidateToken(ctxT(t), &coordinatorv1.ValidateTokenRequest{Name: "n", Token: 1}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("LockService on the probe port: %v, want UNIMPLEMENTED", err)
	}
	r.stop()
}
