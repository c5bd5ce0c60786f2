package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/authz"
)

// BenchmarkUnaryChain is the CPU and the allocations the interceptors of
// NewGRPCServer add to one unary call, without the network and with a
// handler that answers at once: what BenchmarkNoopRPC's health Check skips
// (authentication, authorization and the rate limit exempt it). The chain is
// the daemon's: metrics, logging at info, the codec's check, bearer-token
// authentication, the rate limit, recovery. Run in parallel: the chain's
// locks are shared by every call.
func BenchmarkUnaryChain(b *testing.B) {
	store := benchAuthStore(b)
	m := NewMetrics(prometheus.NewRegistry())
	au, as := AuthInterceptors(store)
	ru, rs := RateLimit(1e12, 1<<30) // never refuses
	var o serverOptions
	for _, opt := range []Option{m.Option(), WithInnerInterceptors([]grpc.UnaryServerInterceptor{au, ru}, []grpc.StreamServerInterceptor{as, rs})} {
		opt(&o)
	}
	unary, _ := interceptorChains(slog.New(slog.DiscardHandler), &o, newCodec().bad)
	if len(unary) == 0 {
		b.Fatal("no interceptors")
	}
	call := chainUnary(unary)
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}})
	ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer tok-bench"))
	for _, bc := range []struct {
		name   string
		method string
		req    any
		resp   any
	}{
		{"ValidateToken", coordinatorv1.LockService_ValidateToken_FullMethodName,
			&coordinatorv1.ValidateTokenRequest{Name: "a/x", Token: 7},
			&coordinatorv1.ValidateTokenResponse{Valid: true, Reason: coordinatorv1.ValidateTokenResponse_REASON_CURRENT, CurrentToken: 7}},
		{"Hit", coordinatorv1.CounterService_Hit_FullMethodName,
			&coordinatorv1.HitRequest{Name: "a/x", Limit: 10},
			&coordinatorv1.HitResponse{Allowed: true, Count: 1, Remaining: 9}},
	} {
		info := &grpc.UnaryServerInfo{FullMethod: bc.method}
		h := func(context.Context, any) (any, error) { return bc.resp, nil }
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := processCPU(b)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := call(ctx, bc.req, info, h); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// chainUnary chains interceptors as grpc.ChainUnaryInterceptor does, the
// first outermost.
func chainUnary(is []grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		var next func(i int) grpc.UnaryHandler
		next = func(i int) grpc.UnaryHandler {
			if i == len(is) {
				return h
			}
			return func(ctx context.Context, req any) (any, error) { return is[i](ctx, req, info, next(i+1)) }
		}
		return next(0)(ctx, req)
	}
}

// benchAuthStore is a policy letting identity "bench" (token "tok-bench")
// use the lock names under "a/".
func benchAuthStore(b *testing.B) *authz.Store {
	b.Helper()
	dir := b.TempDir()
	pf, tf := filepath.Join(dir, "policy.json"), filepath.Join(dir, "tokens")
	sum := sha256.Sum256([]byte("tok-bench"))
	if err := os.WriteFile(pf, []byte(`{"identities": {"bench": {"lock_prefixes": ["a/"]}}}`), 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(tf, []byte("bench "+hex.EncodeToString(sum[:])+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	s, err := authz.NewStore(pf, tf)
	if err != nil {
		b.Fatal(err)
	}
	return s
}
