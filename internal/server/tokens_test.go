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

// TestAcquirePausedMidCallLeavesNoGrant: the token epoch pauses between
// the start of an Acquire and its grant (a check of etcd's history failed,
// or a restore was found). The call answers UNAVAILABLE, EPOCH_PAUSED, and
// gives the grant up: the retry is granted at once instead of waiting for
// the orphan's TTL (the epoch restore tests saw such retries time out).
func TestAcquirePausedMidCallLeavesNoGrant(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := embedetcd.Start(ctx, t.TempDir(), embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	mgr, err := lease.New(cli, lease.WithKeyPrefix("/paused/"))
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	ep := &pausingEpochs{}
	ep.pauseAt.Store(2) // the check after the grant
	svc := NewLockService(mgr, fence.New(cli, mgr.Keyspace()), nil, nil, WithEpochs(ep))
	req := &coordinatorv1.AcquireRequest{Name: "l", Ttl: durationpb.New(30 * time.Second), Wait: durationpb.New(0)}
	_, err = svc.Acquire(ctx, req)
	if status.Code(err) != codes.Unavailable || reasonOf(err) != "EPOCH_PAUSED" {
		t.Fatalf("Acquire paused mid-call: %v; want UNAVAILABLE, EPOCH_PAUSED", err)
	}
	g, err := svc.Acquire(ctx, req) // wait 0: granted only if nothing holds l
	if err != nil || g.GetToken() <= 0 {
		t.Fatalf("the retry: %v, %v; want granted at once (no orphaned grant)", g, err)
	}
}

func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(interface{ GetReason() string }); ok {
			return info.GetReason()
		}
	}
	return ""
}
