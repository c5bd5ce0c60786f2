package server_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/coordinatord/coordinatord/internal/server"
)

// The gRPC hop alone: a no-op unary call (the standard health Check) at 64
// concurrent callers over 4 loopback TCP connections (as cmd/coordbench
// shares its connections), through
//
//	bare:         grpc-go's server with no options and no interceptors;
//	coordinatord: the server as server.NewGRPCServer builds it, with the
//	              daemon's default chain (metrics, logging, the codec, the
//	              rate limit, recovery).
//
// Whatever a counter Hit or a ValidateToken costs comes on top of the
// second: its calls/s is their ceiling on this machine. Compare the two in
// one run (go test -run '^$' -bench NoopRPC -count 5 ./internal/server),
// never against absolute figures from another run.

// Besides calls/s, cpu-ns/call is the process's CPU time (user+system, the
// callers' included) per call: on a shared machine it moves less than the
// rate, and the difference between the two servers is the chain's cost.

// noopCallers is the number of concurrent callers, noopConns the
// connections they share round-robin.
const (
	noopCallers = 64
	noopConns   = 4
)

func BenchmarkNoopRPC(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		gs := grpc.NewServer()
		healthpb.RegisterHealthServer(gs, health.NewServer())
		benchNoop(b, gs)
	})
	b.Run("coordinatord", func(b *testing.B) {
		m := server.NewMetrics(prometheus.NewRegistry())
		u, s := server.RateLimit(1000, 2000) // the daemon's defaults (-rate-limit, -rate-burst)
		gs, _ := server.NewGRPCServer(server.NewLockService(nil, nil, nil, nil), nil,
			m.Option(), server.WithInnerInterceptors([]grpc.UnaryServerInterceptor{u}, []grpc.StreamServerInterceptor{s}))
		m.Initialize(gs)
		benchNoop(b, gs)
	})
}

// benchNoop serves gs on loopback TCP and reports the calls/s of
// noopCallers callers doing health Checks.
func benchNoop(b *testing.B, gs *grpc.Server) {
	b.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = gs.Serve(lis) }()
	b.Cleanup(func() { gs.Stop(); <-served })
	clients := make([]healthpb.HealthClient, noopConns)
	for i := range clients {
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { conn.Close() })
		clients[i] = healthpb.NewHealthClient(conn)
	}
	ctx := context.Background()
	for _, c := range clients { // connect before the clock starts
		if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			b.Fatal(err)
		}
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	cpu0 := processCPU(b)
	b.ResetTimer()
	for w := range noopCallers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[w%noopConns]
			req := &healthpb.HealthCheckRequest{}
			for left.Add(-1) >= 0 {
				r, err := c.Check(ctx, req)
				if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					b.Errorf("health Check: %v %v", r.GetStatus(), err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/call")
}

// processCPU is the user and system CPU time the process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
