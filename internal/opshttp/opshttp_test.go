package opshttp_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/coordinatord/coordinatord/internal/opshttp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errDown = errors.New("etcd down")

func TestReadinessFollowsTheProbe(t *testing.T) {
	var failing atomic.Bool
	var mu sync.Mutex
	var changes []bool
	r := opshttp.NewReadiness(5*time.Millisecond, time.Second, func(context.Context) error {
		if failing.Load() {
			return errDown
		}
		return nil
	}, func(ok bool) { mu.Lock(); changes = append(changes, ok); mu.Unlock() })
	h := opshttp.Handler(prometheus.NewRegistry(), r)
	get := func(path string) int {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		return w.Code
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal(what)
			}
		}
	}

	if get("/readyz") != http.StatusServiceUnavailable {
		t.Fatal("ready before the first probe")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	eventually("not ready after a good probe", func() bool { return get("/readyz") == http.StatusOK })
	failing.Store(true)
	eventually("still ready after a failed probe", func() bool { return get("/readyz") == http.StatusServiceUnavailable })
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if w.Code == http.StatusServiceUnavailable && !strings.Contains(w.Body.String(), errDown.Error()) {
		t.Fatalf("/readyz body %q does not give the probe's error %q", w.Body.String(), errDown)
	}
	if get("/healthz") != http.StatusOK {
		t.Fatal("/healthz not 200 while etcd is down")
	}
	failing.Store(false)
	eventually("not ready again", func() bool { return get("/readyz") == http.StatusOK })
	r.Stopping()
	if get("/readyz") != http.StatusServiceUnavailable {
		t.Fatal("ready while stopping")
	}
	cancel()
	<-done
	if ok, _ := r.Ready(); ok {
		t.Fatal("ready after Stopping")
	}
	mu.Lock()
	defer mu.Unlock()
	want := []bool{true, false, true, false}
	if len(changes) != len(want) {
		t.Fatalf("onChange calls %v, want %v", changes, want)
	}
	for i := range want {
		if changes[i] != want[i] {
			t.Fatalf("onChange calls %v, want %v", changes, want)
		}
	}
	if get("/metrics") != http.StatusOK {
		t.Fatal("/metrics not served")
	}
}
