package server

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// rpcMetrics are the per-RPC metrics of go-grpc-middleware's
// providers/prometheus ServerMetrics with its handling-time histogram, the
// same series with the same names, help, labels and values:
//
//	grpc_server_started_total{grpc_type,grpc_service,grpc_method}
//	grpc_server_handled_total{grpc_type,grpc_service,grpc_method,grpc_code}
//	grpc_server_msg_received_total, grpc_server_msg_sent_total{grpc_type,grpc_service,grpc_method}
//	grpc_server_handling_seconds{grpc_type,grpc_service,grpc_method}
//
// but each method's series are looked up once, not on every call: the
// middleware hashes the labels of five series per unary call under the
// vectors' shared locks and allocates a reporter, about a fifth of the
// interceptor chain's CPU on a ValidateToken (BenchmarkUnaryChain).
type rpcMetrics struct {
	started, handled, received, sent *prometheus.CounterVec
	seconds                          *prometheus.HistogramVec
	methods                          sync.Map // full method name -> *methodSeries
}

// The grpc_type label values.
const (
	typeUnary        = "unary"
	typeClientStream = "client_stream"
	typeServerStream = "server_stream"
	typeBidiStream   = "bidi_stream"
)

func newRPCMetrics(buckets []float64) *rpcMetrics {
	labels := []string{"grpc_type", "grpc_service", "grpc_method"}
	return &rpcMetrics{
		started: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_started_total", Help: "Total number of RPCs started on the server.",
		}, labels),
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_handled_total", Help: "Total number of RPCs completed on the server, regardless of success or failure.",
		}, append(labels[:3:3], "grpc_code")),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_msg_received_total", Help: "Total number of RPC stream messages received on the server.",
		}, labels),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_msg_sent_total", Help: "Total number of gRPC stream messages sent by the server.",
		}, labels),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "grpc_server_handling_seconds",
			Help:    "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
			Buckets: buckets,
		}, labels),
	}
}

func (r *rpcMetrics) Describe(ch chan<- *prometheus.Desc) {
	r.started.Describe(ch)
	r.handled.Describe(ch)
	r.received.Describe(ch)
	r.sent.Describe(ch)
	r.seconds.Describe(ch)
}

func (r *rpcMetrics) Collect(ch chan<- prometheus.Metric) {
	r.started.Collect(ch)
	r.handled.Collect(ch)
	r.received.Collect(ch)
	r.sent.Collect(ch)
	r.seconds.Collect(ch)
}

// methodSeries are one method's series; those of grpc_server_handled_total
// are resolved at a code's first use, so that only the codes a method
// answered appear (unless initialize created them all).
type methodSeries struct {
	typ, service, method    string
	started, received, sent prometheus.Counter
	seconds                 prometheus.Observer
	handled                 [codes.Unauthenticated + 1]atomic.Pointer[prometheus.Counter]
}

// series returns the series of fullMethod, of type typ, creating them.
func (r *rpcMetrics) series(fullMethod, typ string) *methodSeries {
	if s, ok := r.methods.Load(fullMethod); ok {
		return s.(*methodSeries)
	}
	svc, method, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !ok {
		svc, method = "unknown", "unknown"
	}
	s := &methodSeries{typ: typ, service: svc, method: method,
		started:  r.started.WithLabelValues(typ, svc, method),
		received: r.received.WithLabelValues(typ, svc, method),
		sent:     r.sent.WithLabelValues(typ, svc, method),
		seconds:  r.seconds.WithLabelValues(typ, svc, method)}
	v, _ := r.methods.LoadOrStore(fullMethod, s)
	return v.(*methodSeries)
}

// done records the end of a call of s that returned err after d.
func (r *rpcMetrics) done(s *methodSeries, err error, d time.Duration) {
	r.handledSeries(s, rpcCode(err)).Inc()
	s.seconds.Observe(d.Seconds())
}

func (r *rpcMetrics) handledSeries(s *methodSeries, c codes.Code) prometheus.Counter {
	if int(c) >= len(s.handled) {
		return r.handled.WithLabelValues(s.typ, s.service, s.method, c.String())
	}
	if p := s.handled[c].Load(); p != nil {
		return *p
	}
	ctr := r.handled.WithLabelValues(s.typ, s.service, s.method, c.String())
	s.handled[c].Store(&ctr)
	return ctr
}

// rpcCode is the code of a handler's error as the middleware reads it: a
// status, else a context error's code, else Unknown.
func rpcCode(err error) codes.Code {
	if st, ok := status.FromError(err); ok {
		return st.Code()
	}
	return status.FromContextError(err).Code()
}

// initialize creates every series of every method of gs at zero (every code
// of grpc_server_handled_total).
func (r *rpcMetrics) initialize(gs *grpc.Server) {
	for svc, info := range gs.GetServiceInfo() {
		for _, mi := range info.Methods {
			typ := streamType(mi.IsClientStream, mi.IsServerStream)
			s := r.series("/"+svc+"/"+mi.Name, typ)
			for c := range codes.Unauthenticated + 1 {
				r.handledSeries(s, c)
			}
		}
	}
}

func streamType(client, server bool) string {
	switch {
	case !client && !server:
		return typeUnary
	case client && !server:
		return typeClientStream
	case !client && server:
		return typeServerStream
	}
	return typeBidiStream
}

// unary counts a unary call: started, one message each way (also when it
// fails, as the middleware counts them), handled by code, and its duration.
func (r *rpcMetrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	start := time.Now()
	s := r.series(info.FullMethod, typeUnary)
	s.started.Inc()
	s.received.Inc()
	resp, err := h(ctx, req)
	s.sent.Inc()
	r.done(s, err, time.Since(start))
	return resp, err
}

// stream counts a stream: started, every message each way (every RecvMsg
// and SendMsg, failed ones included, as the middleware counts them),
// handled by code, and its duration.
func (r *rpcMetrics) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	start := time.Now()
	s := r.series(info.FullMethod, streamType(info.IsClientStream, info.IsServerStream))
	s.started.Inc()
	err := h(srv, &countedStream{ServerStream: ss, s: s})
	r.done(s, err, time.Since(start))
	return err
}

type countedStream struct {
	grpc.ServerStream
	s *methodSeries
}

func (c *countedStream) SendMsg(m any) error {
	err := c.ServerStream.SendMsg(m)
	c.s.sent.Inc()
	return err
}

func (c *countedStream) RecvMsg(m any) error {
	err := c.ServerStream.RecvMsg(m)
	c.s.received.Inc()
	return err
}
