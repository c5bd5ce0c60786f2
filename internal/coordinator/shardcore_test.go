package coordinator_test

import (
	"context"
	"net"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/coordinator"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// startSharded is start on the shard-owner core, serving once every shard
// is loaded.
func startSharded(t *testing.T) (*coordinator.Coordinator, coordinatorv1.LockServiceClient) {
	t.Helper()
	e, err := embedetcd.Start(context.Background(), t.TempDir(), embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	c, err := coordinator.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()},
		coordinator.WithLease(lease.WithKeyPrefix("/t/")), coordinator.WithShardCore(shard.WithShards(16), shard.WithLeaseTTL(2*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.ServeInBackground(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cli := coordinatorv1.NewLockServiceClient(conn)
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := cli.List(context.Background(), &coordinatorv1.ListRequest{}); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the shard core serves no List 15s after New: %v", err)
		}
	}
	return c, cli
}

// reasonOf is a status's ErrorInfo reason.
func reasonOf(err error) string {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// The lock calls over gRPC on the shard-owner core, with the error
// contract of the queue core.
func TestShardCoreOverGRPC(t *testing.T) {
	_, cli := startSharded(t)
	ctx := ctxT(t)
	g, err := cli.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "jobs/a", Ttl: durationpb.New(5 * time.Second), Owner: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	if g.GetToken() <= 0 || g.GetHandle() == "" || !g.GetSafeUntil().AsTime().Before(g.GetExpiresAt().AsTime()) {
		t.Fatalf("grant %v", g)
	}
	v, err := cli.ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: "jobs/a", Token: g.GetToken()})
	if err != nil || !v.GetValid() {
		t.Fatalf("validate = %v, %v", v, err)
	}
	d, err := cli.Describe(ctx, &coordinatorv1.DescribeRequest{Name: "jobs/a"})
	if err != nil || d.GetHolder().GetToken() != g.GetToken() || d.GetHolder().GetOwner() != "w1" {
		t.Fatalf("describe = %v, %v", d, err)
	}
	if _, err := cli.KeepAlive(ctx, &coordinatorv1.KeepAliveRequest{Name: "jobs/a", Token: g.GetToken(), Handle: g.GetHandle()}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		call   func() error
		code   codes.Code
		reason string
	}{
		{"try-lock of a held lock", func() error {
			_, err := cli.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "jobs/a", Wait: durationpb.New(0)})
			return err
		}, codes.Aborted, "LOCK_HELD"},
		{"bad name", func() error {
			_, err := cli.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: ""})
			return err
		}, codes.InvalidArgument, "INVALID_FIELD"},
		{"renewal with a wrong handle", func() error {
			_, err := cli.KeepAlive(ctx, &coordinatorv1.KeepAliveRequest{Name: "jobs/a", Token: g.GetToken(), Handle: "x" + g.GetHandle()})
			return err
		}, codes.NotFound, "NOT_HELD"},
		{"renewal of a session that does not exist", func() error {
			_, err := cli.KeepAliveSession(ctx, &coordinatorv1.KeepAliveSessionRequest{Handle: "s00000000000000000000000000000000.AAAAAAAAAAAAAAAAAAAAAA"})
			return err
		}, codes.NotFound, "SESSION_NOT_FOUND"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if status.Code(err) != tc.code || reasonOf(err) != tc.reason {
				t.Fatalf("%v (reason %q), want %v %s", err, reasonOf(err), tc.code, tc.reason)
			}
		})
	}
	r, err := cli.Release(ctx, &coordinatorv1.ReleaseRequest{Name: "jobs/a", Token: g.GetToken(), Handle: g.GetHandle()})
	if err != nil || !r.GetReleased() {
		t.Fatalf("release = %v, %v", r, err)
	}
	v, err = cli.ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: "jobs/a", Token: g.GetToken()})
	if err != nil || v.GetValid() {
		t.Fatalf("validate after release = %v, %v", v, err)
	}
}

// A replica past its lease deadline answers nothing for its shards:
// SHARD_NOT_SERVED, never a stale validation.
func TestShardCoreAnswersNothingPastItsDeadline(t *testing.T) {
	c, cli := startSharded(t)
	ctx := ctxT(t)
	g, err := cli.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "d", Ttl: durationpb.New(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	c.Etcd().Close() // renewals stop: the deadline passes within the lease TTL
	deadline := c.Shards().Lease().Deadline()
	for time.Now().Before(deadline.Add(100 * time.Millisecond)) {
		time.Sleep(50 * time.Millisecond)
	}
	_, err = cli.ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: "d", Token: g.GetToken()})
	if status.Code(err) != codes.Unavailable || reasonOf(err) != "SHARD_NOT_SERVED" {
		t.Fatalf("validation past the deadline = %v (reason %q), want UNAVAILABLE SHARD_NOT_SERVED", err, reasonOf(err))
	}
}
