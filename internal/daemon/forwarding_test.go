package daemon_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/daemon"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
)

// The daemon's wiring of the shard core's forwarding: a member that
// advertises its listener's address (no -advertise), and a relay (-role
// relay) in front of it, both with authorization and the same member
// secret file. Alice's calls through the relay are the member's, as alice.
func TestRelayDaemonForwardsToTheMember(t *testing.T) {
	e, err := embedetcd.Start(context.Background(), t.TempDir(), embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close) // after the daemons stop (cleanups run last first)
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hash := func(tok string) string { s := sha256.Sum256([]byte(tok)); return hex.EncodeToString(s[:]) }
	base := daemon.Config{EtcdEndpoints: e.Endpoints(), KeyPrefix: "/fwd/", Core: daemon.CoreShard, ShardLeaseTTL: 2 * time.Second,
		AuthPolicy:       write("policy.json", `{"identities": {"alice": {"lock_prefixes": ["jobs/"]}, "bob": {"lock_prefixes": ["jobs/"]}}}`),
		AuthTokens:       write("tokens", "alice "+hash("tok-alice")+"\nbob "+hash("tok-bob")+"\n"),
		MemberSecretFile: write("member-secret", "0123456789abcdef0123456789abcdef\n")}
	member := run(t, base)
	relayCfg := base
	relayCfg.Role = daemon.RoleRelay
	relay := run(t, relayCfg)

	ctx := ctxT(t)
	alice := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer tok-alice")
	bob := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer tok-bob")
	viaRelay := coordinatorv1.NewLockServiceClient(relay.conn(t))
	direct := coordinatorv1.NewLockServiceClient(member.conn(t))
	var g *coordinatorv1.AcquireResponse
	eventually(t, "an Acquire through the relay succeeds", func() bool {
		g, err = viaRelay.Acquire(alice, &coordinatorv1.AcquireRequest{Name: "jobs/a", Ttl: durationpb.New(10 * time.Second)})
		return err == nil
	})
	d, err := direct.Describe(alice, &coordinatorv1.DescribeRequest{Name: "jobs/a"})
	if err != nil || d.GetHolder().GetToken() != g.GetToken() {
		t.Fatalf("describe on the member = %v, %v", d, err)
	}
	if r, err := direct.Release(bob, &coordinatorv1.ReleaseRequest{Name: "jobs/a", Token: g.GetToken(), Handle: g.GetHandle()}); err != nil || r.GetReleased() {
		t.Fatalf("bob releases alice's grant on the member = %v, %v; want released false", r, err)
	}
	l, err := viaRelay.List(alice, &coordinatorv1.ListRequest{Prefix: "jobs/"})
	if err != nil || len(l.GetHolders()) != 1 || l.GetHolders()[0].GetToken() != g.GetToken() {
		t.Fatalf("list through the relay = %v, %v", l, err)
	}
	if _, err := viaRelay.Describe(ctx, &coordinatorv1.DescribeRequest{Name: "jobs/a"}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a call without credentials through the relay = %v, want UNAUTHENTICATED", err)
	}
	if r, err := viaRelay.Release(alice, &coordinatorv1.ReleaseRequest{Name: "jobs/a", Token: g.GetToken(), Handle: g.GetHandle()}); err != nil || !r.GetReleased() {
		t.Fatalf("alice releases through the relay = %v, %v", r, err)
	}
}
