package chaos

import (
	"context"
	"log/slog"
	"sync"
)

// Events counts the warnings a replica logs, by message, so that a scenario
// can report how often a watch path broke and started over (the holder
// view, the lock-end watch) under its faults and the compaction.
type Events struct {
	mu     sync.Mutex
	counts map[string]int
}

// NewEvents returns an empty count.
func NewEvents() *Events { return &Events{counts: map[string]int{}} }

// Logger is a logger whose warnings (and errors) Events counts.
func (e *Events) Logger() *slog.Logger { return slog.New(eventHandler{e}) }

// Counts is a copy of the counts so far, by message.
func (e *Events) Counts() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]int, len(e.counts))
	for k, v := range e.counts {
		out[k] = v
	}
	return out
}

type eventHandler struct{ e *Events }

func (h eventHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h eventHandler) Handle(_ context.Context, r slog.Record) error {
	h.e.mu.Lock()
	h.e.counts[r.Message]++
	h.e.mu.Unlock()
	return nil
}

func (h eventHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h eventHandler) WithGroup(string) slog.Handler      { return h }
