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
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/daemon"
)

// -max-locks-per-identity is enforced on the shard core too (it was
// silently not): the second lock of an identity limited to one is refused,
// another identity's is not, and a release gives the slot back.
func TestMaxLocksPerIdentityIsWiredOnTheShardCore(t *testing.T) {
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
	r := run(t, daemon.Config{Core: daemon.CoreShard, AuthPolicy: policy, AuthTokens: tokens, AuthReloadInterval: time.Hour, MaxLocksPerIdentity: 1})
	client := func(id string) coordinatorv1.LockServiceClient {
		return coordinatorv1.NewLockServiceClient(r.conn(t, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithPerRPCCredentials(bearer("tok-"+id))))
	}
	a, b := client("a"), client("b")
	try := func(lc coordinatorv1.LockServiceClient, name string) (*coordinatorv1.AcquireResponse, error) {
		return lc.Acquire(ctxT(t), &coordinatorv1.AcquireRequest{Name: name, Wait: durationpb.New(0)})
	}
	held, err := try(a, "a/1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := try(a, "a/2"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a/2: %v, want RESOURCE_EXHAUSTED", err)
	}
	if _, err := try(b, "b/1"); err != nil {
		t.Fatalf("b/1: %v", err)
	}
	if _, err := a.Release(ctxT(t), &coordinatorv1.ReleaseRequest{Name: "a/1", Token: held.GetToken(), Handle: held.GetHandle()}); err != nil {
		t.Fatal(err)
	}
	if _, err := try(a, "a/2"); err != nil {
		t.Fatalf("a/2 after a/1 was released: %v", err)
	}
	r.stop()
}
