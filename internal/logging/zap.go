// Package logging bridges the zap logs of etcd's libraries into log/slog.
package logging

import (
	"context"
	"log/slog"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// noise are substrings of etcd log lines that are harmless and expected: the
// listeners closing on shutdown, the single-port warning of an embedded
// member, and a start-up race in the storage-version check.
var noise = []string{
	"use of closed network connection",
	"server closed",
	"Running http and grpc server on single port",
	"simple token is not cryptographically signed",
	"cannot detect storage schema version",
	"Failed to detect schema version",
	"check file permission",
}

// Zap returns a zap logger that writes entries at level min and above to l
// (nothing if l is nil), tagged component=etcd, without the known noise.
func Zap(l *slog.Logger, min zapcore.Level) *zap.Logger {
	return zap.New(&core{logger: l, level: min})
}

type core struct {
	logger *slog.Logger
	level  zapcore.Level
	fields []zapcore.Field
}

func (c *core) Enabled(l zapcore.Level) bool { return c.logger != nil && l >= c.level }

func (c *core) With(fs []zapcore.Field) zapcore.Core {
	cp := *c
	cp.fields = append(append([]zapcore.Field(nil), c.fields...), fs...)
	return &cp
}

func (c *core) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func isNoise(s string) bool {
	s = strings.ToLower(s)
	for _, n := range noise {
		if strings.Contains(s, strings.ToLower(n)) {
			return true
		}
	}
	return false
}

func (c *core) Write(e zapcore.Entry, fs []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fs {
		f.AddTo(enc)
	}
	if isNoise(e.Message) {
		return nil
	}
	attrs := make([]slog.Attr, 0, len(enc.Fields)+1)
	attrs = append(attrs, slog.String("component", "etcd"))
	for k, v := range enc.Fields {
		if s, ok := v.(string); ok && isNoise(s) {
			return nil
		}
		attrs = append(attrs, slog.Any(k, v))
	}
	lvl := slog.LevelInfo
	switch {
	case e.Level >= zapcore.ErrorLevel:
		lvl = slog.LevelError
	case e.Level >= zapcore.WarnLevel:
		lvl = slog.LevelWarn
	case e.Level < zapcore.InfoLevel:
		lvl = slog.LevelDebug
	}
	c.logger.LogAttrs(context.Background(), lvl, e.Message, attrs...)
	return nil
}

func (c *core) Sync() error { return nil }
