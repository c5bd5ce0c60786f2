package main_test

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/testpki"
)

func tlsClient(t *testing.T, addr string, ca *testpki.CA, leaf *testpki.Issued) *grpc.ClientConn {
	t.Helper()
	cfg := &tls.Config{RootCAs: ca.Pool()}
	if leaf != nil {
		cfg.Certificates = []tls.Certificate{leaf.TLS()}
	}
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestDaemonMutualTLSAndPolicyReloadOnSIGHUP(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA("daemon test CA")
	cert, key := ca.Localhost().Write(dir, "server")
	caFile := ca.WriteCA(dir, "ca")
	policy := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(policy, []byte(`{"identities": {"team-a": {"lock_prefixes": ["a/"]}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startDaemon(t, "--data-dir", filepath.Join(dir, "data"), "--tls-cert", cert, "--tls-key", key,
		"--tls-client-ca", caFile, "--auth-policy", policy, "--auth-reload-interval", "1h")

	teamA := ca.Issue(testpki.Leaf{DNS: []string{"team-a"}})
	conn := tlsClient(t, p.addr, ca, &teamA)
	lc := coordinatorv1.NewLockServiceClient(conn)
	acquire := func(name string) error {
		_, err := lc.Acquire(ctxT(t), &coordinatorv1.AcquireRequest{Name: name, Wait: durationpb.New(0)})
		return err
	}
	if err := acquire("a/1"); err != nil {
		t.Fatalf("team-a acquires a/1: %v", err)
	}
	if err := acquire("b/1"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("team-a acquires b/1: %v, want PERMISSION_DENIED", err)
	}
	if h, err := healthpb.NewHealthClient(conn).Check(ctxT(t), &healthpb.HealthCheckRequest{}); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health over mTLS: %v, %v", h, err)
	}
	noCert := coordinatorv1.NewLockServiceClient(tlsClient(t, p.addr, ca, nil))
	if _, err := noCert.Describe(ctxT(t), &coordinatorv1.DescribeRequest{Name: "a/1"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("a client without a certificate: %v, want UNAVAILABLE (handshake refused)", err)
	}

	if err := os.WriteFile(policy, []byte(`{"identities": {"team-a": {"lock_prefixes": ["a/", "b/"]}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for acquire("b/1") != nil {
		if time.Now().After(deadline) {
			t.Fatal("the policy change was not in force 20s after SIGHUP")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !p.sawLog("authorization files reloaded") {
		t.Error("no log line for the reload")
	}
	p.stop(t)
}
