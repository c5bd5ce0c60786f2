package daemon_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/daemon"
)

// The stream caps and the connection cap reach the server.
func TestStreamAndConnectionCapsAreWired(t *testing.T) {
	r := run(t, daemon.Config{MaxWatchStreams: 1, MaxConnections: 2})
	lc := coordinatorv1.NewLockServiceClient(r.conn(t))
	watch := func(lc coordinatorv1.LockServiceClient) error {
		st, err := lc.Watch(ctxT(t), &coordinatorv1.WatchRequest{Name: "w"})
		if err == nil {
			_, err = st.Recv()
		}
		return err
	}
	if err := watch(lc); err != nil {
		t.Fatal(err)
	}
	second := coordinatorv1.NewLockServiceClient(r.conn(t))
	if err := watch(second); status.Code(err) != codes.ResourceExhausted || reason(err) != "TOO_MANY_STREAMS" {
		t.Fatalf("a second Watch with -max-watch-streams-per-caller 1: %v, want RESOURCE_EXHAUSTED TOO_MANY_STREAMS", err)
	}
	third := coordinatorv1.NewLockServiceClient(r.conn(t))
	if _, err := third.Describe(ctxT(t), &coordinatorv1.DescribeRequest{Name: "w"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("a third connection with -max-connections 2: %v, want UNAVAILABLE", err)
	}
	r.stop()
}

// A revoked identity's Watch ends within one reload interval of the policy
// change, with PERMISSION_DENIED (no SIGHUP: the poll finds the change).
func TestRevocationEndsStreamsWithinAReloadInterval(t *testing.T) {
	dir := t.TempDir()
	policy, tokens := filepath.Join(dir, "policy.json"), filepath.Join(dir, "tokens")
	sum := sha256.Sum256([]byte("tok-a"))
	if err := os.WriteFile(tokens, []byte("a "+hex.EncodeToString(sum[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(policy, []byte(`{"identities": {"a": {"lock_prefixes": [""]}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, daemon.Config{AuthPolicy: policy, AuthTokens: tokens, AuthReloadInterval: 200 * time.Millisecond})
	a := coordinatorv1.NewLockServiceClient(r.conn(t, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer("tok-a"))))
	st, err := a.Watch(ctxT(t), &coordinatorv1.WatchRequest{Name: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(policy, []byte(`{"identities": {}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); status.Code(err) != codes.PermissionDenied || reason(err) != "IDENTITY_REVOKED" {
		t.Fatalf("the revoked identity's Watch: %v, want PERMISSION_DENIED IDENTITY_REVOKED", err)
	}
	r.stop()
}
