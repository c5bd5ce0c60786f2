package fence_test

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/coordinatord/coordinatord/client"
	"github.com/coordinatord/coordinatord/fence"
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Many writers with random tokens: the guard admits a token only if no
// greater one was admitted before, and the writes it admits never overlap
// (the race detector checks the unsynchronized log).
func TestGuardAdmitsOnlyNonDecreasingTokens(t *testing.T) {
	g := fence.NewGuard(0)
	var (
		log  []int64 // written only under the guard
		wg   sync.WaitGroup
		mu   sync.Mutex
		refs []error
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				tok := rand.Int64N(1000) + 1
				err := g.Do(tok, func() error {
					log = append(log, tok)
					return nil
				})
				if err != nil {
					mu.Lock()
					refs = append(refs, err)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	for i := 1; i < len(log); i++ {
		if log[i] < log[i-1] {
			t.Fatalf("write %d with token %d admitted after token %d", i, log[i], log[i-1])
		}
	}
	if len(log)+len(refs) != 8*200 {
		t.Fatalf("%d writes + %d refusals != %d calls", len(log), len(refs), 8*200)
	}
	for _, err := range refs {
		var se *fence.StaleError
		if !errors.As(err, &se) || !errors.Is(err, fence.ErrStale) || se.Token >= se.Highest {
			t.Fatalf("refusal %v is not a StaleError below the mark", err)
		}
	}
	if g.Highest() != log[len(log)-1] {
		t.Fatalf("Highest %d, last write %d", g.Highest(), log[len(log)-1])
	}
}

func TestGuardEdges(t *testing.T) {
	g := fence.NewGuard(10)
	if err := g.Admit(9); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("Admit(9) with mark 10: %v", err)
	}
	if err := g.Admit(10); err != nil {
		t.Fatalf("Admit(10), equal to the mark: %v", err)
	}
	if err := g.Admit(0); !errors.Is(err, fence.ErrMissing) {
		t.Fatalf("Admit(0): %v", err)
	}
	boom := errors.New("boom")
	if err := g.Do(12, func() error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Do returned %v, want the write's error", err)
	}
	if err := g.Admit(11); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("a failed write must still raise the mark: Admit(11) = %v", err)
	}
}

// httpPut sends a write with a token; it returns the status code.
func httpPut(t *testing.T, url, lock string, token int64) int {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctxT(t, 10*time.Second), http.MethodPut, url, nil)
	if lock != "" || token != 0 {
		fence.SetHeaders(req.Header, lock, token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func TestMiddlewareWithGuard(t *testing.T) {
	var written []int64
	gate, err := fence.NewGate(fence.WithGuard(fence.NewGuard(0)), fence.WithLock("jobs/a"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gate.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := fence.FromContext(r.Context())
		if !ok {
			t.Error("handler reached without an admitted token")
		}
		written = append(written, a.Token)
	})))
	defer srv.Close()

	for _, tc := range []struct {
		name  string
		lock  string
		token string
		want  int
	}{
		{"no headers", "", "", http.StatusBadRequest},
		{"no token", "jobs/a", "", http.StatusBadRequest},
		{"not a number", "jobs/a", "12abc", http.StatusBadRequest},
		{"negative", "jobs/a", "-4", http.StatusBadRequest},
		{"no lock", "", "5", http.StatusBadRequest},
		{"first", "jobs/a", "5", http.StatusOK},
		{"lower", "jobs/a", "3", http.StatusConflict},
		{"same again", "jobs/a", "5", http.StatusOK},
		{"another lock", "jobs/b", "50", http.StatusForbidden},
		{"higher", "jobs/a", "8", http.StatusOK},
		{"the old one again", "jobs/a", "5", http.StatusConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
			if tc.lock != "" {
				req.Header.Set(fence.HeaderLock, tc.lock)
			}
			if tc.token != "" {
				req.Header.Set(fence.HeaderToken, tc.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
	if want := []int64{5, 5, 8}; len(written) != 3 || written[0] != 5 || written[1] != 5 || written[2] != 8 {
		t.Fatalf("handler ran for tokens %v, want %v", written, want)
	}
}

// With the coordinator: a holder's token is admitted and raises the
// resource's mark in etcd; after the lock changes hands, the old token is
// refused, by a gate with a fresh local guard too (a restarted resource
// process), because the coordinator's mark refuses it.
func TestMiddlewareWithCoordinator(t *testing.T) {
	c, err := client.Dial(coordinatorAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	newServer := func() *httptest.Server {
		gate, err := fence.NewGate(fence.WithCoordinator(c, "bucket/photos"), fence.WithGuard(fence.NewGuard(0)), fence.WithLock("photos"))
		if err != nil {
			t.Fatal(err)
		}
		return httptest.NewServer(gate.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	}
	srv := newServer()
	defer srv.Close()

	a, err := c.Acquire(ctxT(t, 10*time.Second), "photos", client.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if s := httpPut(t, srv.URL, "photos", a.Token()); s != http.StatusOK {
		t.Fatalf("holder's write: %d", s)
	}
	if s := httpPut(t, srv.URL, "photos", a.Token()+1000); s != http.StatusConflict {
		t.Fatalf("write with a token never issued: %d, want 409", s)
	}
	if err := a.Release(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if s := httpPut(t, srv.URL, "photos", a.Token()); s != http.StatusConflict {
		t.Fatalf("write after release: %d, want 409 (not held)", s)
	}
	b, err := c.Acquire(ctxT(t, 10*time.Second), "photos", client.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Release(context.Background()) }()
	if s := httpPut(t, srv.URL, "photos", b.Token()); s != http.StatusOK {
		t.Fatalf("new holder's write: %d", s)
	}
	fresh := newServer()
	defer fresh.Close()
	if s := httpPut(t, fresh.URL, "photos", a.Token()); s != http.StatusConflict {
		t.Fatalf("old token at a restarted resource: %d, want 409 (fenced by the coordinator's mark)", s)
	}
	v, err := c.ValidateToken(ctxT(t, 10*time.Second), "photos", a.Token(), "bucket/photos")
	if err != nil || v.Reason.String() != "REASON_FENCED" {
		t.Fatalf("coordinator's verdict on the old token: %+v, %v; want REASON_FENCED", v, err)
	}
	if s := httpPut(t, fresh.URL, "photos", b.Token()); s != http.StatusOK {
		t.Fatalf("holder's write at a restarted resource: %d", s)
	}
}

// A gate that admits any lock, over a resource the coordinator already
// binds to another lock: the coordinator's refusal is the gate's
// ErrWrongLock (403), not a coordinator failure to retry (503), and the
// handler does not run.
func TestMiddlewareResourceOwnedByAnotherLock(t *testing.T) {
	c, err := client.Dial(coordinatorAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	gate, err := fence.NewGate(fence.WithCoordinator(c, "bucket/owned"))
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	srv := httptest.NewServer(gate.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran++ })))
	defer srv.Close()
	owner, err := c.Acquire(ctxT(t, 10*time.Second), "owned-writer", client.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = owner.Release(context.Background()) }()
	other, err := c.Acquire(ctxT(t, 10*time.Second), "other-writer", client.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Release(context.Background()) }()
	if s := httpPut(t, srv.URL, "owned-writer", owner.Token()); s != http.StatusOK {
		t.Fatalf("owner's write: %d", s)
	}
	if s := httpPut(t, srv.URL, "other-writer", other.Token()); s != http.StatusForbidden {
		t.Fatalf("another lock's write: %d, want 403", s)
	}
	if ran != 1 {
		t.Fatalf("handler ran %d times, want once (the owner's write)", ran)
	}
}

// The coordinator cannot be reached: 503 once the check timeout passes,
// and the handler does not run.
func TestMiddlewareCoordinatorDown(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens there
	c, err := client.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	gate, err := fence.NewGate(fence.WithCoordinator(c, "r"), fence.WithCheckTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	srv := httptest.NewServer(gate.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran = true })))
	defer srv.Close()
	if s := httpPut(t, srv.URL, "l", 7); s != http.StatusServiceUnavailable {
		t.Fatalf("status %d with the coordinator down, want 503", s)
	}
	if ran {
		t.Fatal("handler ran without a validated token")
	}
}

func TestNewGateNeedsACheck(t *testing.T) {
	if _, err := fence.NewGate(); err == nil {
		t.Fatal("NewGate() without a guard or coordinator succeeded")
	}
	if _, err := fence.NewGate(fence.WithCoordinator(nil, "")); err == nil {
		t.Fatal("NewGate with an empty resource succeeded")
	}
}

// The gRPC interceptor, around the standard health service as the
// "protected" service.
func TestUnaryInterceptor(t *testing.T) {
	gate, _ := fence.NewGate(fence.WithGuard(fence.NewGuard(0)), fence.WithExemptMethods("/grpc.health.v1.Health/List"))
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(gate.UnaryServerInterceptor()))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	call := func(ctx context.Context) codes.Code {
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		return status.Code(err)
	}
	base := ctxT(t, 10*time.Second)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want codes.Code
	}{
		{"no metadata", base, codes.InvalidArgument},
		{"bad token", fence.AppendToOutgoingContext(base, "l", -1), codes.InvalidArgument},
		{"admitted", fence.AppendToOutgoingContext(base, "l", 20), codes.OK},
		{"stale", fence.AppendToOutgoingContext(base, "l", 19), codes.FailedPrecondition},
		{"same", fence.AppendToOutgoingContext(base, "l", 20), codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := call(tc.ctx); got != tc.want {
				t.Fatalf("code %v, want %v", got, tc.want)
			}
		})
	}
	if _, err := hc.List(base, &healthpb.HealthListRequest{}); err != nil {
		t.Fatalf("exempt method refused: %v", err)
	}
}
