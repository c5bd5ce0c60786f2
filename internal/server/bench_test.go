package server_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/coordinator"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// End-to-end benchmarks: a real gRPC client over loopback TCP, the real
// handlers, a real embedded etcd with etcd's default timings (as the daemon
// runs it). They run only with -bench; go test compiles them. Run with
// go test -run '^$' -bench . ./internal/server
//
// cmd/coordbench compares the same paths with etcd's own locks; these are
// for spotting regressions.

// benchEnv starts etcd, a coordinator and a client connection for b.
func benchEnv(b *testing.B) coordinatorv1.LockServiceClient {
	b.Helper()
	e, err := embedetcd.Start(context.Background(), b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.Close)
	// Assembled as the daemon assembles it: validations follow the holder view.
	c, err := coordinator.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second},
		coordinator.WithLease(lease.WithKeyPrefix("/bench/")))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	c.ServeInBackground(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return coordinatorv1.NewLockServiceClient(conn)
}

// cycle acquires and releases name once.
func cycle(ctx context.Context, lc coordinatorv1.LockServiceClient, name string) error {
	g, err := lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(30 * time.Second)})
	if err != nil {
		return err
	}
	r, err := lc.Release(ctx, &coordinatorv1.ReleaseRequest{Name: name, Token: g.GetToken(), Handle: g.GetHandle()})
	if err != nil {
		return err
	}
	if !r.GetReleased() {
		return fmt.Errorf("release of %q: released=false", name)
	}
	return nil
}

// BenchmarkAcquireRelease is one client's uncontended Acquire+Release
// latency; the parallel variant is throughput with GOMAXPROCS*8 clients on
// distinct names over one connection.
func BenchmarkAcquireRelease(b *testing.B) {
	lc := benchEnv(b)
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		for b.Loop() {
			if err := cycle(ctx, lc, "bench/serial"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		var id atomic.Int64
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			name := fmt.Sprintf("bench/parallel/%d", id.Add(1))
			for pb.Next() {
				if err := cycle(ctx, lc, name); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkValidateToken is ValidateToken of a held lock, serial and with
// GOMAXPROCS*8 concurrent callers.
func BenchmarkValidateToken(b *testing.B) {
	lc := benchEnv(b)
	ctx := context.Background()
	g, err := lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "bench/validate", Ttl: dur(5 * time.Minute)})
	if err != nil {
		b.Fatal(err)
	}
	req := &coordinatorv1.ValidateTokenRequest{Name: "bench/validate", Token: g.GetToken()}
	check := func() error {
		r, err := lc.ValidateToken(ctx, req)
		if err == nil && !r.GetValid() {
			err = fmt.Errorf("token %d: %v", g.GetToken(), r.GetReason())
		}
		return err
	}
	b.Run("serial", func(b *testing.B) {
		for b.Loop() {
			if err := check(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := check(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
