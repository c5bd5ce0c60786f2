package server

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// NewGRPCServer returns a gRPC server with the LockService, the standard
// health service (returned so the caller can flip it) and reflection
// registered. Interceptors run logging, then recovery (last, closest to the
// handler).
func NewGRPCServer(svc *LockService, log *slog.Logger, opts ...grpc.ServerOption) (*grpc.Server, *health.Server) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	logOpts := []logging.Option{logging.WithLogOnEvents(logging.FinishCall), logging.WithLevels(callLevel)}
	recOpts := []recovery.Option{recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		log.ErrorContext(ctx, "handler panic", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error; the coordinator logged the cause")
	})}
	all := append([]grpc.ServerOption{
		grpc.ForceServerCodecV2(newCodec()),
		grpc.ChainUnaryInterceptor(
			logging.UnaryServerInterceptor(interceptorLogger(log), logOpts...),
			recovery.UnaryServerInterceptor(recOpts...),
		),
		grpc.ChainStreamInterceptor(
			logging.StreamServerInterceptor(interceptorLogger(log), logOpts...),
			recovery.StreamServerInterceptor(recOpts...),
		),
	}, opts...)
	gs := grpc.NewServer(all...)
	coordinatorv1.RegisterLockServiceServer(gs, svc)
	coordinatorv1.RegisterFenceServiceServer(gs, svc.FenceService())
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	return gs, hs
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
