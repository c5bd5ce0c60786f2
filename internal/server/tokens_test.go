package server

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/epoch"
	"github.com/coordinatord/coordinatord/internal/fence"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// pausingEpochs is epoch 0 whose n-th call answers paused.
type pausingEpochs struct {
	calls, pauseAt atomic.Int64
}

func (p *pausingEpochs) Epoch(context.Context, int64) (int64, error) {
	if p.calls.Add(1) == p.pauseAt.Load() {
		return 0, &epoch.PausedError{Reason: "a check failed"}
	}
	return 0, nil
}

func (*pausingEpochs) Status() epoch.State { return epoch.State{} }

func (*pausingEpochs) Changed(int64) <-chan struct{} { return nil }

// TestAcquirePausedMidCallLeavesNoGrant: the token epoch pauses between
// the start of an Acquire and its grant (a check of etcd's history failed,
// or a restore was found). The call answers UNAVAILABLE, EPOCH_PAUSED, and
// gives the grant up: the retry is granted at once instead of waiting for
// the orphan's TTL (the epoch restore tests saw such retries time out).
func TestAcquirePausedMidCallLeavesNoGrant(t *testing.T) {
	for _, core := range cores {
		t.Run(core, func(t *testing.T) { acquirePausedMidCall(t, core) })
	}
}

// cores are the lock cores the epoch tests run on.
var cores = []string{"queue", "shard"}

func acquirePausedMidCall(t *testing.T, core string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svc, ep := pausingService(t, ctx, core)
	ep.pauseAt.Store(ep.calls.Load() + 2) // the check after the grant
	req := &coordinatorv1.AcquireRequest{Name: "l", Ttl: durationpb.New(30 * time.Second), Wait: durationpb.New(0)}
	_, err := svc.Acquire(ctx, req)
	if status.Code(err) != codes.Unavailable || reasonOf(err) != "EPOCH_PAUSED" {
		t.Fatalf("Acquire paused mid-call: %v; want UNAVAILABLE, EPOCH_PAUSED", err)
	}
	g, err := svc.Acquire(ctx, req) // wait 0: granted only if nothing holds l
	if err != nil || g.GetToken() <= 0 {
		t.Fatalf("the retry: %v, %v; want granted at once (no orphaned grant)", g, err)
	}
}

// pausingService is a LockService on core over a fresh embedded etcd whose
// epoch pauses as its pausingEpochs says (stopped at the test's end).
func pausingService(t *testing.T, ctx context.Context, core string) (*LockService, *pausingEpochs) {
	t.Helper()
	e, err := embedetcd.Start(ctx, t.TempDir(), embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	mgr, err := lease.New(cli, lease.WithKeyPrefix("/paused/"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mgr.Close)
	ep := &pausingEpochs{}
	opts := []ServiceOption{WithEpochs(ep)}
	if core == "shard" {
		own, err := shard.NewOwner(ctx, cli, "/paused/", shard.WithShards(8), shard.WithLeaseTTL(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer ccancel()
			own.Close(cctx)
		})
		for own.Status().Serving < 8 {
			if ctx.Err() != nil {
				t.Fatalf("the shard core serves %d of 8 shards", own.Status().Serving)
			}
			time.Sleep(10 * time.Millisecond)
		}
		opts = append(opts, WithShardCore(own))
	}
	return NewLockService(mgr, fence.New(cli, mgr.Keyspace()), nil, nil, opts...), ep
}

func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(interface{ GetReason() string }); ok {
			return info.GetReason()
		}
	}
	return ""
}

// TestReleaseAndRenewalPausedMidCallAnswerUnavailable: the token epoch
// pauses while a Release or a KeepAlive is at etcd (etcd went away and may
// come back restored: the chaos suite's restore scenario saw a Release
// called before the restore, retried into the restored history, delete the
// key of a holder that came back with the snapshot and answer
// released=true for a token superseded before the restore). Neither call
// answers its success across the pause: UNAVAILABLE, EPOCH_PAUSED.
func TestReleaseAndRenewalPausedMidCallAnswerUnavailable(t *testing.T) {
	for _, core := range cores {
		t.Run(core, func(t *testing.T) { releaseAndRenewalPausedMidCall(t, core) })
	}
}

func releaseAndRenewalPausedMidCall(t *testing.T, core string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svc, ep := pausingService(t, ctx, core)
	for _, tc := range []struct {
		name string
		call func(g *coordinatorv1.AcquireResponse) error
	}{
		{"release", func(g *coordinatorv1.AcquireResponse) error {
			_, err := svc.Release(ctx, &coordinatorv1.ReleaseRequest{Name: "l", Token: g.GetToken(), Handle: g.GetHandle()})
			return err
		}},
		{"renewal", func(g *coordinatorv1.AcquireResponse) error {
			_, err := svc.KeepAlive(ctx, &coordinatorv1.KeepAliveRequest{Name: "l", Token: g.GetToken(), Handle: g.GetHandle()})
			return err
		}},
		{"force-release", func(g *coordinatorv1.AcquireResponse) error {
			_, err := svc.ForceRelease(ctx, &coordinatorv1.ForceReleaseRequest{Name: "l", Token: g.GetToken()})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := svc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "l", Ttl: durationpb.New(30 * time.Second), Wait: durationpb.New(5 * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			ep.pauseAt.Store(ep.calls.Load() + 2) // the check after the call's etcd work
			if err := tc.call(g); status.Code(err) != codes.Unavailable || reasonOf(err) != "EPOCH_PAUSED" {
				t.Fatalf("paused mid-call: %v; want UNAVAILABLE, EPOCH_PAUSED", err)
			}
			// Clean up for the next case (the release ends the grant if
			// the call did not).
			_, _ = svc.Release(ctx, &coordinatorv1.ReleaseRequest{Name: "l", Token: g.GetToken(), Handle: g.GetHandle()})
		})
	}
}
