package coordinator_test

import (
	"context"
	"net"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/coordinator"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/testcoord"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testcoord.LeakIgnores...) }

// start assembles a coordinator over a fresh embedded etcd, serves it on
// loopback and returns it with a client of it; everything ends with t.
func start(t *testing.T) (*coordinator.Coordinator, *grpc.ClientConn) {
	t.Helper()
	e, err := embedetcd.Start(context.Background(), t.TempDir(), embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	c, err := coordinator.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()},
		coordinator.WithLease(lease.WithKeyPrefix("/t/")))
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
	return c, conn
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Every assembled coordinator follows the holder view from New to Close:
// two test setups once built theirs by hand and forgot it.
func TestNewStartsTheHolderViewAndCloseStopsIt(t *testing.T) {
	c, _ := start(t)
	// A Follow with an ended context returns at once: an error while the
	// view runs (at most one per validator), nil when it does not.
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for deadline := time.Now().Add(5 * time.Second); c.Fence().Follow(ended, nil) == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no holder view running 5s after New")
		}
	}
	c.Close()
	c.Close() // idempotent
	if err := c.Fence().Follow(ended, nil); err != nil {
		t.Fatalf("Follow after Close: %v; the holder view still runs", err)
	}
}

// Drain, in its documented order: health NOT_SERVING, waiting Acquires
// ended (UNAVAILABLE) with their queue keys removed while etcd is still
// open, grants left alone, then gRPC stopped gracefully.
func TestDrainEndsWaitersBeforeStoppingGRPC(t *testing.T) {
	c, conn := start(t)
	lc := coordinatorv1.NewLockServiceClient(conn)
	if _, err := lc.Acquire(ctxT(t), &coordinatorv1.AcquireRequest{Name: "d", Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	waited := make(chan error, 1)
	go func() {
		_, err := lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "d"})
		waited <- err
	}()
	queue := c.Leases().Keyspace().Queue("d")
	keys := func() int64 {
		r, err := c.Etcd().Get(ctxT(t), queue, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return r.Count
	}
	for deadline := time.Now().Add(10 * time.Second); keys() != 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the waiter never queued")
		}
	}
	if cut := c.Drain(ctxT(t)); cut {
		t.Fatal("Drain cut calls that had ended")
	}
	if err := <-waited; status.Code(err) != codes.Unavailable {
		t.Fatalf("waiter at Drain: %v, want UNAVAILABLE", err)
	}
	if n := keys(); n != 1 {
		t.Fatalf("%d queue keys after Drain, want the holder's only", n)
	}
	if st := healthStatus(c); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health after Drain: %v, want NOT_SERVING", st)
	}
}

// healthStatus is the status of the overall service ("") in c's health
// server.
func healthStatus(c *coordinator.Coordinator) healthpb.HealthCheckResponse_ServingStatus {
	r, err := c.Health().Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN
	}
	return r.GetStatus()
}

// Crash cuts etcd first: a waiter's queue key is not removed (it stays
// until its lease expires), unlike Close.
func TestCrashCleansNothingUp(t *testing.T) {
	c, conn := start(t)
	lc := coordinatorv1.NewLockServiceClient(conn)
	if _, err := lc.Acquire(ctxT(t), &coordinatorv1.AcquireRequest{Name: "c", Ttl: durationpb.New(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	waited := make(chan error, 1)
	go func() {
		_, err := lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "c", Ttl: durationpb.New(time.Minute)})
		waited <- err
	}()
	// A second client of the same etcd, to look after the crash.
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Etcd().Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	queue := c.Leases().Keyspace().Queue("c")
	keys := func() int64 {
		r, err := cli.Get(ctxT(t), queue, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return r.Count
	}
	for deadline := time.Now().Add(10 * time.Second); keys() != 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the waiter never queued")
		}
	}
	c.Crash()
	if err := <-waited; err == nil {
		t.Fatal("the waiter was granted across a crash")
	}
	if n := keys(); n != 2 {
		t.Fatalf("%d queue keys after Crash, want both (nothing cleaned up)", n)
	}
}
