package server

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// flowWindow is the HTTP/2 flow-control window of every stream and
// connection: 1 MiB, four times the default largest request
// (-max-recv-msg-size).
const flowWindow = 1 << 20

// MaxHeaderListSize bounds the request headers (metadata) gRPC parses
// before any interceptor, authentication included: 16 KiB, far above what
// a call carries (a bearer token, a deadline, a user agent), where gRPC's
// default of 16 MiB let 20 unauthenticated requests cost 227 MB. A request
// beyond it is reset (RST_STREAM) without reaching a handler.
// Every gRPC server of the daemon should set it (grpc.MaxHeaderListSize).
const MaxHeaderListSize = 16 << 10

// NewGRPCServer returns a gRPC server with the LockService, the standard
// health service (returned so the caller can flip it) and reflection
// registered. Interceptors run in the order of docs/CONTRIBUTING.md: the
// outer ones (metrics), logging, the refusal of requests that are not
// protobuf (see codec), the inner ones (auth, limits), then panic recovery
// (last, closest to the handler).
func NewGRPCServer(svc *LockService, log *slog.Logger, opts ...Option) (*grpc.Server, *health.Server) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var o serverOptions
	for _, opt := range opts {
		opt(&o)
	}
	c := newCodec()
	unary, stream := interceptorChains(log, &o, c.bad)
	all := append([]grpc.ServerOption{
		grpc.ForceServerCodecV2(c),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(stream...),
		// Fixed flow-control windows turn off the bandwidth estimator's
		// pings (a packet each way for most requests; messages here are
		// small).
		grpc.InitialWindowSize(flowWindow), grpc.InitialConnWindowSize(flowWindow),
		grpc.MaxHeaderListSize(MaxHeaderListSize),
		// Calls run on reused workers, whose stacks have already grown:
		// a new goroutine per call grew its stack on every call (copystack
		// was 6% of the CPU of a no-op call, BenchmarkNoopRPC). Calls
		// beyond the workers still get a goroutine each.
		grpc.NumStreamWorkers(streamWorkers()),
	}, o.grpc...)
	gs := grpc.NewServer(all...)
	svc.forwardTo(o.memberSecret, o.peerDial, log)
	coordinatorv1.RegisterLockServiceServer(gs, svc)
	coordinatorv1.RegisterFenceServiceServer(gs, svc.FenceService())
	if cs := svc.CounterService(); cs != nil {
		coordinatorv1.RegisterCounterServiceServer(gs, cs)
	}
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	return gs, hs
}

// streamWorkers is the number of gRPC stream workers: many per core, as
// most calls wait on etcd (64 clients' hits on one counter, each waiting
// for its batch, kept 8 workers busy and grew a new goroutine's stack per
// call: 9% of the coordinator's CPU). An idle worker costs its stack.
func streamWorkers() uint32 { return uint32(32 * runtime.GOMAXPROCS(0)) }

// interceptorChains are the unary and stream interceptors of
// NewGRPCServer, outermost first.
func interceptorChains(log *slog.Logger, o *serverOptions, bad *badMessages) ([]grpc.UnaryServerInterceptor, []grpc.StreamServerInterceptor) {
	logOpts := []logging.Option{logging.WithLogOnEvents(logging.FinishCall), logging.WithLevels(callLevel)}
	recOpts := []recovery.Option{recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		log.ErrorContext(ctx, "handler panic", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		return errInternal()
	})}
	badUnary, badStream := bad.interceptors()
	var unary []grpc.UnaryServerInterceptor
	unary = append(unary, o.outerUnary...)
	unary = append(unary, lazyLogging(log, logging.UnaryServerInterceptor(interceptorLogger(log), logOpts...)), badUnary)
	var memberStream []grpc.StreamServerInterceptor
	if len(o.memberSecret) > 0 { // before authentication, which reads its verdict
		mu, ms := memberInterceptors(o.memberSecret)
		unary, memberStream = append(unary, mu), []grpc.StreamServerInterceptor{ms}
	}
	unary = append(unary, o.innerUnary...)
	unary = append(unary, recovery.UnaryServerInterceptor(recOpts...))
	var stream []grpc.StreamServerInterceptor
	stream = append(stream, o.outerStream...)
	stream = append(stream, logging.StreamServerInterceptor(interceptorLogger(log), logOpts...), badStream)
	stream = append(stream, memberStream...)
	stream = append(stream, o.innerStream...)
	stream = append(stream, recovery.StreamServerInterceptor(recOpts...))
	return unary, stream
}

// callLevel logs routine outcomes at debug level, so a busy coordinator is
// quiet at info, and server-side failures loudly.
func callLevel(c codes.Code) logging.Level {
	switch c {
	case codes.OK, codes.Canceled, codes.DeadlineExceeded, codes.Aborted, codes.NotFound, codes.InvalidArgument:
		return logging.LevelDebug
	case codes.Unknown, codes.Internal, codes.DataLoss:
		return logging.LevelError
	}
	return logging.LevelWarn
}

// interceptorLogger adapts slog to go-grpc-middleware's logging. Finished
// calls log at debug level unless they failed with a server-side code.
func interceptorLogger(l *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		l.Log(ctx, slog.Level(lvl), msg, fields...)
	})
}
