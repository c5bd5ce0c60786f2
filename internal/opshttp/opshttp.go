// Package opshttp serves the operator endpoints over HTTP: Prometheus
// metrics (/metrics), liveness (/healthz) and readiness (/readyz, which
// follows a periodic probe: the daemon's checks etcd and the token epoch).
package opshttp

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Readiness tracks whether the coordinator can serve: the last probe
// succeeded, recently, and the coordinator is not shutting down.
type Readiness struct {
	interval, timeout time.Duration
	probe             func(context.Context) error
	onChange          func(ready bool)

	mu       sync.Mutex
	ok       bool
	at       time.Time
	lastErr  error
	stopping bool
}

// NewReadiness probes every interval, each probe bounded by timeout.
// onChange, if set, is called when readiness flips (and once at the first
// probe).
func NewReadiness(interval, timeout time.Duration, probe func(context.Context) error, onChange func(bool)) *Readiness {
	return &Readiness{interval: interval, timeout: timeout, probe: probe, onChange: onChange}
}

// Run probes until ctx ends.
func (r *Readiness) Run(ctx context.Context) {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	first := true
	for {
		pctx, cancel := context.WithTimeout(ctx, r.timeout)
		err := r.probe(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		r.mu.Lock()
		was := r.ok
		r.ok, r.at, r.lastErr = err == nil, time.Now(), err
		now := r.ok && !r.stopping
		r.mu.Unlock()
		if r.onChange != nil && (first || was != (err == nil)) {
			r.onChange(now)
		}
		first = false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Stopping marks the coordinator not ready for good (shutdown).
func (r *Readiness) Stopping() {
	r.mu.Lock()
	r.stopping = true
	r.mu.Unlock()
	if r.onChange != nil {
		r.onChange(false)
	}
}

// Ready tells whether the coordinator is ready, and why not.
func (r *Readiness) Ready() (bool, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.stopping:
		return false, "shutting down"
	case r.at.IsZero():
		return false, "not probed yet"
	case !r.ok:
		return false, r.lastErr.Error() // the probe's error says why
	case time.Since(r.at) > 3*r.interval+r.timeout:
		return false, "the last probe is stale"
	}
	return true, "ok"
}

// Handler serves /metrics from g, /healthz (200 while the process runs) and
// /readyz (200 when r is ready, else 503 with the reason: the probe's
// error).
func Handler(g prometheus.Gatherer, r *Readiness) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, why := r.Ready()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = fmt.Fprintln(w, why)
	})
	return mux
}
