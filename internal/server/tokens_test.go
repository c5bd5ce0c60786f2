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

// pausingEpochs is epoch 0 whose n-th call answers paused; with exhausted
// set, its calls from the n-th on answer that etcd's revisions ran out.
type pausingEpochs struct {
	calls, pauseAt atomic.Int64
	exhausted      atomic.Bool
}

func (p *pausingEpochs) Epoch(context.Context, int64) (int64, error) {
	n, at := p.calls.Add(1), p.pauseAt.Load()
	switch {
	case p.exhausted.Load() && at > 0 && n >= at:
		return 0, &epoch.ExhaustedError{Revision: epoch.MaxRevision + 1}
	case n == at:
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

// TestWireTokenNeverWraps (issue 26, item 4): a revision past 2^48 - 1
// spilled into the epoch bits, and the token fell below the ones before
// it; it has no token now (0, which no resource accepts).
func TestWireTokenNeverWraps(t *testing.T) {
	for _, tc := range []struct{ epoch, rev, want int64 }{
		{0, 5, 5},
		{1, 5, 1<<48 + 5},
		{1, epoch.MaxRevision, 1<<49 - 1},
		{1, epoch.MaxRevision + 1, 0},
		{0, epoch.MaxRevision + 41, 0},
		{3, 0, 0},
	} {
		if got := wireToken(tc.epoch, tc.rev); got != tc.want {
			t.Errorf("wireToken(%d, %d) = %d, want %d", tc.epoch, tc.rev, got, tc.want)
		}
	}
}

// TestTokensExhaustedAcrossACall (issue 26, item 4), on both cores: a grant
// after which the keeper has seen etcd past 2^48 - 1 is not answered
// (FAILED_PRECONDITION, TOKENS_EXHAUSTED) and is given up, so the retry of
// a try-lock is granted; a release whose own write took etcd past it
// answers its result (its token fits); every call after is refused.
func TestTokensExhaustedAcrossACall(t *testing.T) {
	for _, core := range cores {
		t.Run(core, func(t *testing.T) { tokensExhaustedAcrossACall(t, core) })
	}
}

func tokensExhaustedAcrossACall(t *testing.T, core string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svc, ep := pausingService(t, ctx, core)
	ep.exhausted.Store(true)
	exhausted := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.FailedPrecondition || reasonOf(err) != "TOKENS_EXHAUSTED" {
			t.Fatalf("%s: %v; want FAILED_PRECONDITION, TOKENS_EXHAUSTED", what, err)
		}
	}
	req := &coordinatorv1.AcquireRequest{Name: "l", Ttl: durationpb.New(30 * time.Second), Wait: durationpb.New(0)}
	ep.pauseAt.Store(ep.calls.Load() + 2) // the check after the grant
	_, err := svc.Acquire(ctx, req)
	exhausted("Acquire whose grant passed 2^48 - 1", err)

	ep.pauseAt.Store(0)
	g, err := svc.Acquire(ctx, req) // wait 0: granted only if nothing holds l
	if err != nil || g.GetToken() <= 0 {
		t.Fatalf("the retry: %v, %v; want granted at once (the refused grant given up)", g, err)
	}
	ep.pauseAt.Store(ep.calls.Load() + 2) // the check after the release's etcd work
	r, err := svc.Release(ctx, &coordinatorv1.ReleaseRequest{Name: "l", Token: g.GetToken(), Handle: g.GetHandle()})
	if err != nil || !r.GetReleased() {
		t.Fatalf("Release across the last revision: %v, %v; want released", r, err)
	}
	_, err = svc.Acquire(ctx, req)
	exhausted("Acquire after", err)
	_, err = svc.KeepAlive(ctx, &coordinatorv1.KeepAliveRequest{Name: "l", Token: g.GetToken(), Handle: g.GetHandle()})
	exhausted("KeepAlive after", err)
}
