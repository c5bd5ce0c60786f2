package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// lazyLogging wraps go-grpc-middleware's logging interceptor for unary
// calls: when the logger drops debug lines (the default), a call's log
// fields are built only if its outcome is to be logged, by replaying the
// finished call through the interceptor with its real duration. A busy
// coordinator answers mostly routine calls, logged at debug: building their
// fields anyway cost about a tenth of a ValidateToken's CPU.
func lazyLogging(log *slog.Logger, full grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if log.Enabled(ctx, slog.LevelDebug) {
			return full(ctx, req, info, h)
		}
		start := time.Now()
		resp, err := h(ctx, req)
		if !log.Enabled(ctx, slog.Level(callLevel(status.Code(err)))) {
			return resp, err
		}
		ctx = logging.InjectFields(ctx, logging.Fields{"grpc.time_ms", fmt.Sprintf("%.3f", float64(time.Since(start).Nanoseconds())/1e6)})
		return full(ctx, req, info, func(context.Context, any) (any, error) { return resp, err })
	}
}
