package server

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The lazy logging path logs exactly what the plain interceptor would: no
// line for a routine call at info level, a "finished call" line with the
// code, method and the handler's real duration for a server-side failure,
// and every call at debug level.
func TestLazyLoggingLogsWhatTheInterceptorWould(t *testing.T) {
	info := &grpc.UnaryServerInfo{FullMethod: "/coordinator.v1.LockService/Acquire"}
	cases := []struct {
		name  string
		level slog.Level
		err   error
		lines int
	}{
		{"ok at info: silent", slog.LevelInfo, nil, 0},
		{"not found at info: silent", slog.LevelInfo, status.Error(codes.NotFound, "gone"), 0},
		{"internal at info: logged", slog.LevelInfo, status.Error(codes.Internal, "boom"), 1},
		{"unavailable at info: logged", slog.LevelInfo, status.Error(codes.Unavailable, "no etcd"), 1},
		{"ok at debug: logged", slog.LevelDebug, nil, 1},
		{"internal at error: logged", slog.LevelError, status.Error(codes.Internal, "boom"), 1},
		{"unavailable at error: silent", slog.LevelError, status.Error(codes.Unavailable, "no etcd"), 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var buf bytes.Buffer
			log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: c.level}))
			full := logging.UnaryServerInterceptor(interceptorLogger(log), logging.WithLogOnEvents(logging.FinishCall), logging.WithLevels(callLevel))
			ic := lazyLogging(log, full)
			calls := 0
			resp, err := ic(context.Background(), "req", info, func(context.Context, any) (any, error) {
				calls++
				time.Sleep(20 * time.Millisecond)
				return "resp", c.err
			})
			if calls != 1 || resp != "resp" || status.Code(err) != status.Code(c.err) {
				t.Fatalf("handler ran %d times, answered %v, %v", calls, resp, err)
			}
			lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
			if buf.Len() == 0 {
				lines = nil
			}
			if len(lines) != c.lines {
				t.Fatalf("%d log lines, want %d: %q", len(lines), c.lines, buf.String())
			}
			if c.lines == 0 {
				return
			}
			var rec map[string]any
			if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
				t.Fatal(err)
			}
			if rec["msg"] != "finished call" || rec["grpc.code"] != status.Code(c.err).String() || rec["grpc.method"] != "Acquire" {
				t.Fatalf("log line %v", rec)
			}
			ms, err := strconv.ParseFloat(rec["grpc.time_ms"].(string), 64)
			if err != nil || ms < 20 {
				t.Fatalf("grpc.time_ms = %v (%v), want the handler's >= 20 ms", rec["grpc.time_ms"], err)
			}
		})
	}
}
