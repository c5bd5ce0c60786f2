package chaos_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/chaos"
)

// TestCancelledWaiterStorm: 1,000 waiters queue behind a
// holder and are cancelled; no queue key, lease or goroutine is left behind.
func TestCancelledWaiterStorm(t *testing.T) {
	scenario(t, false)
	n := 1000
	// The cause of any INTERNAL answer goes to the test's output.
	chaos.ServerLog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	defer func() { chaos.ServerLog = nil }()
	e := newEnv(t, 2)
	ctx := context.Background()
	lcs := clients(e)
	g, err := lcs[0].Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "storm", Ttl: durationpb.New(5 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	leases := func() int {
		r, err := e.Etcd.Leases(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(r.Leases)
	}
	time.Sleep(200 * time.Millisecond)
	baseOwn, _ := goroutines(ownPkgs, sharedStreams...)
	baseAll, _ := goroutines(transportPkgs)
	baseL := leases()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	codesSeen := make(chan codes.Code, n)
	var early atomic.Int64
	queued := func() int64 {
		c, err := e.CountKeys(ctx, "locks/storm/")
		if err != nil {
			return -1
		}
		return c - 1
	}
	// Batches of 100, so that a loaded 2-core machine keeps its etcd
	// leader: the property is about clean-up, not join throughput.
	for b := 0; b < n; b += 100 {
		for i := b; i < min(b+100, n); i++ {
			wg.Go(func() {
				for {
					_, err := lcs[i%len(lcs)].Acquire(wctx, &coordinatorv1.AcquireRequest{Name: "storm", Ttl: durationpb.New(time.Minute)})
					if wctx.Err() == nil && status.Code(err) != codes.Unavailable {
						// etcd trouble must answer UNAVAILABLE (safe to retry).
						t.Errorf("waiter %d: %v", i, err)
					}
					if wctx.Err() != nil || status.Code(err) != codes.Unavailable {
						codesSeen <- status.Code(err)
						return
					}
					early.Add(1) // etcd overloaded: join again
					time.Sleep(100 * time.Millisecond)
				}
			})
		}
		eventually(t, 2*time.Minute, fmt.Sprintf("waiters %d..%d queued", b, min(b+100, n)-1), func() bool { return queued() == int64(min(b+100, n)) })
	}
	t.Logf("%d waiters queued (%d joins retried after UNAVAILABLE)", n, early.Load())
	cancel()
	wg.Wait()
	close(codesSeen)
	for c := range codesSeen {
		if c != codes.Canceled {
			t.Fatalf("a cancelled waiter got %v", c)
		}
	}
	// Within 30s, half the waiters' TTL: removed by the coordinator, not
	// left to expire.
	eventually(t, 30*time.Second, "only the holder's key is left", func() bool { return queued() == 0 })
	// A join that failed with UNAVAILABLE (etcd overloaded) may leave its
	// lease to end by its TTL, as the contract allows.
	leaseBound := 30 * time.Second
	if early.Load() > 0 {
		leaseBound = 90 * time.Second
	}
	eventually(t, leaseBound, "no waiter lease is left", func() bool { return leases() <= baseL })
	// The coordinator's own goroutines (lease, fence, server handlers) go
	// back to the baseline; gRPC and etcd-client streams, shared by all
	// waiters, may stay open but do not grow with the number of waiters.
	deadline := time.Now().Add(time.Minute)
	for {
		own, _ := goroutines(ownPkgs, sharedStreams...)
		all, dump := goroutines(transportPkgs, etcdServer)
		if own <= baseOwn && all <= baseAll+20 {
			t.Logf("goroutines: coordinator %d (baseline %d), with transports %d (baseline %d)", own, baseOwn, all, baseAll)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d coordinator goroutines (baseline %d), %d with transports (baseline %d) after %d waiters ended:\n%s", own, baseOwn, all, baseAll, n, dump)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// etcd may change leader in the storm's wake; UNAVAILABLE is the
	// contract's "safe to retry", so the checks below retry it as a client would.
	var v *coordinatorv1.ValidateTokenResponse
	err = untilAvailable(t, func() (err error) {
		v, err = lcs[1].ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: "storm", Token: g.GetToken()})
		return err
	})
	if err != nil || !v.GetValid() {
		t.Fatalf("the holder lost the lock in the storm: %v %v", v, err)
	}
	retried := false
	var r *coordinatorv1.ReleaseResponse
	err = untilAvailable(t, func() (err error) {
		r, err = lcs[0].Release(ctx, &coordinatorv1.ReleaseRequest{Name: "storm", Token: g.GetToken(), Handle: g.GetHandle()})
		retried = retried || status.Code(err) == codes.Unavailable
		return err
	})
	// A retried release whose first attempt landed answers released=false.
	if err != nil || (!r.GetReleased() && !retried) {
		t.Fatalf("release: %v %v", r, err)
	}
	if err := untilAvailable(t, func() error {
		_, err := lcs[1].Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "storm", Ttl: durationpb.New(5 * time.Second), Wait: durationpb.New(0)})
		return err
	}); err != nil {
		t.Fatalf("try-lock after the storm: %v", err)
	}
}

// untilAvailable calls f until it answers something other than
// UNAVAILABLE, for at most 30 s, and returns its last error.
func untilAvailable(t *testing.T, f func() error) error {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			return err
		}
		t.Logf("retrying after %v", err)
		time.Sleep(100 * time.Millisecond)
	}
}

var (
	ownPkgs       = []string{"coordinatord/internal/lease.", "coordinatord/internal/server.", "coordinatord/internal/fence."}
	transportPkgs = append([]string{"go.etcd.io/etcd/client/v3.", "google.golang.org/grpc."}, ownPkgs...)
)

// sharedStreams are the coordinator's own goroutines that serve every
// waiter alike and do not grow with them: the receive loops of the shared
// lease keepalive streams (at most 4 per replica, opened on first use, so
// a storm whose waiters renew opens more than the baseline had).
var sharedStreams = []string{"internal/lease.(*keepalives).recv"}

// etcdServer marks the in-process etcd members' own goroutines (the server
// side of every stream the replicas opened, such as the shared keepalive
// streams a storm opens): they belong to etcd, not to the coordinator, and
// end with the streams.
const etcdServer = "go.etcd.io/etcd/server/"

// goroutines counts the goroutines whose stack mentions one of pkgs and
// none of skip.
func goroutines(pkgs []string, skip ...string) (int, string) {
	buf := make([]byte, 16<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	var b strings.Builder
next:
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, s := range skip {
			if strings.Contains(g, s) {
				continue next
			}
		}
		for _, pkg := range pkgs {
			if strings.Contains(g, pkg) {
				n++
				b.WriteString(g + "\n\n")
				break
			}
		}
	}
	return n, b.String()
}
