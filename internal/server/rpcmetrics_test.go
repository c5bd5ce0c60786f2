package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"testing"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRPCMetricsMatchMiddleware feeds the same calls to rpcMetrics and to
// go-grpc-middleware's ServerMetrics (as the daemon configured it before)
// and compares what each registry exposes: every family's name, help and
// type, every series' labels, counter values, histogram counts and bounds
// (not the sums nor the buckets: durations differ).
func TestRPCMetricsMatchMiddleware(t *testing.T) {
	buckets := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}
	mw := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramBuckets(buckets)))
	ours := newRPCMetrics(buckets)
	mwReg, ourReg := prometheus.NewRegistry(), prometheus.NewRegistry()
	mwReg.MustRegister(mw)
	ourReg.MustRegister(ours)

	calls := func(t *testing.T, unary grpc.UnaryServerInterceptor, stream grpc.StreamServerInterceptor) {
		t.Helper()
		for _, err := range []error{nil, nil, status.Error(codes.InvalidArgument, "x"), context.Canceled,
			context.DeadlineExceeded, errors.New("plain"), fmt.Errorf("wrapped: %w", status.Error(codes.NotFound, "x")),
			status.Error(codes.Code(42), "beyond the defined codes")} {
			for _, method := range []string{"/coordinator.v1.LockService/Acquire", "/grpc.health.v1.Health/Check", "nonsense"} {
				_, got := unary(context.Background(), "req", &grpc.UnaryServerInfo{FullMethod: method},
					func(context.Context, any) (any, error) { return "resp", err })
				if !errors.Is(got, err) {
					t.Fatalf("unary returned %v, want %v", got, err)
				}
			}
		}
		for _, end := range []error{nil, status.Error(codes.PermissionDenied, "x")} {
			info := &grpc.StreamServerInfo{FullMethod: "/coordinator.v1.LockService/Hold", IsClientStream: true, IsServerStream: true}
			if got := stream(nil, &fakeStream{}, info, func(_ any, ss grpc.ServerStream) error {
				for range 3 {
					_ = ss.RecvMsg(nil)
					_ = ss.SendMsg(nil)
				}
				return end
			}); !errors.Is(got, end) {
				t.Fatalf("stream returned %v, want %v", got, end)
			}
		}
	}
	t.Run("lazily created series", func(t *testing.T) {
		calls(t, mw.UnaryServerInterceptor(), mw.StreamServerInterceptor())
		calls(t, ours.unary, ours.stream)
		compareFamilies(t, mwReg, ourReg)
	})
	t.Run("initialized series", func(t *testing.T) {
		gs, _ := NewGRPCServer(NewLockService(nil, nil, nil, nil), nil)
		defer gs.Stop() // its stream workers
		mw.InitializeMetrics(gs)
		ours.initialize(gs)
		compareFamilies(t, mwReg, ourReg)
	})
}

// compareFamilies fails t where the registries' exposition differs.
func compareFamilies(t *testing.T, want, got *prometheus.Registry) {
	t.Helper()
	w, g := exposition(t, want), exposition(t, got)
	if len(w) < 10 {
		t.Fatalf("the middleware exposed %d series: the comparison would prove nothing", len(w))
	}
	for k, v := range w {
		if g[k] != v {
			t.Errorf("%s: got %q, want %q (the middleware's)", k, g[k], v)
		}
	}
	for k := range g {
		if _, ok := w[k]; !ok {
			t.Errorf("%s: exposed, the middleware does not", k)
		}
	}
}

// exposition maps each series (family, help, type, labels) of reg to its
// value: a counter's value, or a histogram's count and bucket bounds (not
// what falls in which bucket: that is timing).
func exposition(t *testing.T, reg *prometheus.Registry) map[string]string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(labels)
			key := fmt.Sprintf("%s %s (%s) {%s}", mf.GetName(), mf.GetType(), mf.GetHelp(), strings.Join(labels, ","))
			out[key] = seriesValue(m)
		}
	}
	return out
}

func seriesValue(m *dto.Metric) string {
	if h := m.GetHistogram(); h != nil {
		var b []string
		for _, bk := range h.GetBucket() {
			b = append(b, fmt.Sprint(bk.GetUpperBound()))
		}
		return fmt.Sprintf("count %d buckets %s", h.GetSampleCount(), strings.Join(b, " "))
	}
	return fmt.Sprint(m.GetCounter().GetValue())
}

// fakeStream is a stream whose messages all go through: the interceptors
// only count them.
type fakeStream struct{ grpc.ServerStream }

func (*fakeStream) Context() context.Context { return context.Background() }
func (*fakeStream) SendMsg(any) error        { return nil }
func (*fakeStream) RecvMsg(any) error        { return io.EOF }
