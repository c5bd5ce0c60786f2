package daemon_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/daemon"
)

// Issue 13 row 8, end to end: under sustained acquire/release load, a tiny
// embedded store (1 MiB) fills with history. While it is full, Acquire
// answers RESOURCE_EXHAUSTED with reason STORE_FULL and /readyz is 503; then
// the daemon reclaims the space by itself (compaction, defragmentation, the
// NOSPACE alarm disarmed) and serves again, with nobody intervening. The
// space keeper looks every 2s and the load fills the store faster, so it
// fills, recovers and fills again; readiness is probed every 100ms.
func TestFullEmbeddedStoreRefusesWritesThenRecoversByItself(t *testing.T) {
	if testing.Short() {
		t.Skip("fills an embedded store under load: ~17 s")
	}
	if raceEnabled {
		t.Skip("a race with time: under the race detector the load is slower than the space keeper, which then compacts before the store fills")
	}
	r := run(t, daemon.Config{MetricsListen: "127.0.0.1:0", EtcdQuotaBackendBytes: 1 << 20,
		EtcdSpaceCheck: 2 * time.Second, ReadinessInterval: 100 * time.Millisecond})
	lc := coordinatorv1.NewLockServiceClient(r.conn(t))
	owner := strings.Repeat("o", 256)

	var (
		storeFull, unready, recovered atomic.Int64 // recovered: grants after a STORE_FULL
		unexpected                    = make(chan error, 1)
	)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil && recovered.Load() < 20; i++ {
				name := fmt.Sprintf("load-%d-%d", w, i%4)
				a, err := lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: name, Owner: owner, Ttl: durationpb.New(10 * time.Second)})
				if err == nil && storeFull.Load() > 0 && unready.Load() > 0 {
					recovered.Add(1)
				}
				if err == nil {
					_, err = lc.Release(ctx, &coordinatorv1.ReleaseRequest{Name: name, Token: a.GetToken(), Handle: a.GetHandle()})
				}
				switch {
				case err == nil || ctx.Err() != nil:
				case reason(err) == "STORE_FULL" && status.Code(err) == codes.ResourceExhausted:
					storeFull.Add(1)
					time.Sleep(50 * time.Millisecond)
				default:
					select {
					case unexpected <- err:
					default:
					}
					return
				}
			}
		})
	}
	wg.Go(func() {
		for ctx.Err() == nil && recovered.Load() < 20 {
			if code, _ := get(t, "http://"+r.metrics+"/readyz"); code == http.StatusServiceUnavailable && storeFull.Load() > 0 {
				unready.Add(1)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	wg.Wait()
	select {
	case err := <-unexpected:
		t.Fatalf("a call failed other than with STORE_FULL: %v", err)
	default:
	}
	t.Logf("STORE_FULL answers %d, /readyz 503 seen %d times, grants after both %d", storeFull.Load(), unready.Load(), recovered.Load())
	if storeFull.Load() == 0 || unready.Load() == 0 || recovered.Load() < 20 {
		t.Fatal("want writes refused with STORE_FULL, /readyz unready, then writes accepted again by themselves")
	}
	// Once the load stops, the daemon ends ready.
	deadline := time.Now().Add(10 * time.Second)
	for code, _ := get(t, "http://"+r.metrics+"/readyz"); code != http.StatusOK; code, _ = get(t, "http://"+r.metrics+"/readyz") {
		if time.Now().After(deadline) {
			t.Fatal("/readyz not 200 within 10s of the load's end")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// reason is the ErrorInfo reason of a gRPC error, "" if none.
func reason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			return ei.GetReason()
		}
	}
	return ""
}
