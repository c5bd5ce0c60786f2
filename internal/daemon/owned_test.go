package daemon_test

import (
	"context"
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
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/daemon"
)

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }

// MaxLocksPerIdentity reaches the server: with bearer-token identities, the
// second lock of an identity limited to one is refused, another identity's
// is not.
func TestMaxLocksPerIdentityIsWired(t *testing.T) {
	dir := t.TempDir()
	policy, tokens := filepath.Join(dir, "policy.json"), filepath.Join(dir, "tokens")
	var lines string
	for _, id := range []string{"a", "b"} {
		sum := sha256.Sum256([]byte("tok-" + id))
		lines += id + " " + hex.EncodeToString(sum[:]) + "\n"
	}
	if err := os.WriteFile(tokens, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(policy, []byte(`{"identities": {"a": {"lock_prefixes": [""]}, "b": {"lock_prefixes": [""]}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, daemon.Config{AuthPolicy: policy, AuthTokens: tokens, AuthReloadInterval: time.Hour, MaxLocksPerIdentity: 1})
	client := func(id string) coordinatorv1.LockServiceClient {
		return coordinatorv1.NewLockServiceClient(r.conn(t, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithPerRPCCredentials(bearer("tok-"+id))))
	}
	a, b := client("a"), client("b")
	try := func(lc coordinatorv1.LockServiceClient, name string) error {
		_, err := lc.Acquire(ctxT(t), &coordinatorv1.AcquireRequest{Name: name, Wait: durationpb.New(0)})
		return err
	}
	for _, tc := range []struct {
		lc   coordinatorv1.LockServiceClient
		name string
		want codes.Code
	}{
		{a, "a/1", codes.OK},
		{a, "a/2", codes.ResourceExhausted},
		{b, "b/1", codes.OK},
	} {
		if err := try(tc.lc, tc.name); status.Code(err) != tc.want {
			t.Fatalf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	r.stop()
}
