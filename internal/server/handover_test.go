package server_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/coordinator"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// A graceful hand-over under load (issue 24 item 7): a rolling restart of
// 3 members, each drained as the daemon drains it (SIGTERM: Drain, then
// Close) and started again on its address, while clients cycle
// acquire+release through every member in turn, as a balancer in front
// of them would. The stop hands the member's shards to the others, its
// return makes the others hand some back (rebalancing): both are graceful
// hand-overs, and neither may cost a caller anything but a short pause.

// TestHandoverRollingRestartFailsNoCall: no call fails and every release
// of a grant answers released=true (a release in flight across a
// hand-over commits and is answered, or is refused unapplied and retried).
// The UNAVAILABLE answers the clients retried are logged: those of the
// transport come from a member whose gRPC server has stopped (nothing
// reached it); a replica's own are refusals the forwarders did not absorb
// (none, unless a hand-over outlasts their patience).
func TestHandoverRollingRestartFailsNoCall(t *testing.T) {
	e := startEtcdForShards(t)
	ids := []string{"a", "b", "c"}
	members := make([]*fwdReplica, len(ids))
	addrs := make([]string, len(ids))
	for i, id := range ids {
		members[i] = startReplica(t, e, "/t/", id, false)
		addrs[i] = members[i].addr
	}
	waitSplit(t, members)

	load := startHandoverLoad(t, addrs, 16)
	load.await(t, 200)
	for i, id := range ids {
		drainMember(t, members[i])
		rest := append(append([]*fwdReplica{}, members[:i]...), members[i+1:]...)
		waitSplit(t, rest)
		load.await(t, 200)
		members[i] = startMemberAt(t, e, "/t/", id, addrs[i])
		waitSplit(t, members)
		load.await(t, 200)
	}
	res := load.stop()

	t.Logf("%d cycles; UNAVAILABLE answers retried: %d from the transport (a stopped member), %d from replicas %v",
		res.cycles, res.transportUnavailable, len(res.replicaUnavailable), byCause(res.replicaUnavailable))
	if len(res.failed) > 0 {
		t.Errorf("%d cycles failed across the graceful hand-overs, e.g. %s", len(res.failed), strings.Join(first(res.failed, 5), "; "))
	}
	if len(res.releasedNothing) > 0 {
		t.Errorf("%d releases of a held grant answered released=false (a release in flight across a hand-over "+
			"was answered UNAVAILABLE though it committed), e.g. %s", len(res.releasedNothing), strings.Join(first(res.releasedNothing, 5), "; "))
	}
}

// A member that has handed its shards over (Drain's step before gRPC
// stops) still answers the calls that reach it, on the shards it owned
// included: its view keeps following etcd, and it forwards them to the
// next owner. Closed before gRPC stopped, it answered each "shutting
// down" after the forwarder's retries against a view that no longer
// moved.
func TestHandoverDrainingMemberForwardsToTheNextOwner(t *testing.T) {
	e := startEtcdForShards(t)
	a := startReplica(t, e, "/t/", "a", false)
	b := startReplica(t, e, "/t/", "b", false)
	waitSplit(t, []*fwdReplica{a, b})
	ctx := ctxT(t, 30*time.Second)
	names := namesOn(t, b, "jobs/", 3)

	b.coord.Shards().HandOver(ctx)
	eventually(t, 10*time.Second, "the draining member's view to name a the owner of its former shards", func() bool {
		for _, name := range names {
			if id, _, ok := b.own().Owner(shard.ShardOf(name, fwdShards)); !ok || id != "a" {
				return false
			}
		}
		return true
	})
	for _, name := range names {
		g, err := b.lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(10 * time.Second)})
		if err != nil {
			t.Fatalf("acquire %s through the draining member: %v", name, err)
		}
		if d, err := a.lc.Describe(ctx, &coordinatorv1.DescribeRequest{Name: name}); err != nil || d.GetHolder().GetToken() != g.GetToken() {
			t.Fatalf("describe %s on a = %v, %v; want the grant made through b", name, d, err)
		}
		r, err := b.lc.Release(ctx, &coordinatorv1.ReleaseRequest{Name: name, Token: g.GetToken(), Handle: g.GetHandle()})
		if err != nil || !r.GetReleased() {
			t.Fatalf("release %s through the draining member = %v, %v", name, r, err)
		}
	}
	drainMember(t, b)
}

// drainMember stops m as the daemon does on SIGTERM: Drain (health, the
// shards handed over, gRPC stopped gracefully), then Close.
func drainMember(t *testing.T, m *fwdReplica) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if cut := m.coord.Drain(ctx); cut {
		t.Errorf("member %s: draining cut calls in flight", m.id)
	}
	m.coord.Close()
}

// startMemberAt starts member id again on addr, the address it had (a
// port just released may be busy for a moment).
func startMemberAt(t *testing.T, e *embedetcd.Server, prefix, id, addr string) *fwdReplica {
	t.Helper()
	var lis net.Listener
	eventually(t, 10*time.Second, "the member's address "+addr+" is free again", func() bool {
		var err error
		lis, err = net.Listen("tcp", addr)
		return err == nil
	})
	c, err := coordinator.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()},
		coordinator.WithLease(lease.WithKeyPrefix(prefix)),
		coordinator.WithShardCore(shard.WithShards(fwdShards), shard.WithLeaseTTL(2*time.Second), shard.WithMember(id, addr)))
	if err != nil {
		lis.Close()
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	c.ServeInBackground(lis)
	return &fwdReplica{id: id, addr: addr, coord: c}
}

// handoverLoad is workers cycling acquire+release on fresh names, each
// call sent to the members in turn; an UNAVAILABLE answer is retried on
// the next member (with the same request id for an acquisition), as the
// SDK behind a round-robin balancer does.
type handoverLoad struct {
	conns  []*grpc.ClientConn
	stopc  chan struct{}
	wg     sync.WaitGroup
	cycles atomic.Int64

	mu  sync.Mutex
	res handoverResult
}

type handoverResult struct {
	cycles               int64
	failed               []string // cycles that ended in an error other than UNAVAILABLE
	releasedNothing      []string // releases of a held grant answered released=false
	replicaUnavailable   []string // UNAVAILABLE answers a replica gave (with our ErrorInfo)
	transportUnavailable int      // UNAVAILABLE answers of the transport (a stopped member)
}

func startHandoverLoad(t *testing.T, addrs []string, workers int) *handoverLoad {
	t.Helper()
	l := &handoverLoad{stopc: make(chan struct{})}
	for _, a := range addrs {
		cc, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		l.conns = append(l.conns, cc)
	}
	for w := range workers {
		l.wg.Go(func() { l.worker(w) })
	}
	t.Cleanup(func() { l.stop() })
	return l
}

func (l *handoverLoad) worker(w int) {
	next := w // the member of the next call
	call := func(ctx context.Context, what string, f func(coordinatorv1.LockServiceClient) error) (retried bool, err error) {
		for {
			lc := coordinatorv1.NewLockServiceClient(l.conns[next%len(l.conns)])
			next++
			err := f(lc)
			if code(err) != codes.Unavailable || ctx.Err() != nil {
				return retried, err
			}
			retried = true
			l.mu.Lock()
			if reason := reasonOf(err); reason != "" {
				l.res.replicaUnavailable = append(l.res.replicaUnavailable, fmt.Sprintf("%s: %v", what, err))
			} else {
				l.res.transportUnavailable++
			}
			l.mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}
	for i := 0; ; i++ {
		select {
		case <-l.stopc:
			return
		default:
		}
		name := fmt.Sprintf("handover/w%d/%d", w, i)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := l.cycle(ctx, name, fmt.Sprintf("handover-%03d-%09d", w, i), call)
		cancel()
		l.mu.Lock()
		switch {
		case errors.Is(err, errReleasedNothing):
			l.res.releasedNothing = append(l.res.releasedNothing, err.Error())
		case err != nil:
			l.res.failed = append(l.res.failed, err.Error())
		}
		l.mu.Unlock()
		l.cycles.Add(1)
	}
}

var errReleasedNothing = errors.New("released nothing")

// cycle acquires name and releases the grant.
func (l *handoverLoad) cycle(ctx context.Context, name, requestID string,
	call func(context.Context, string, func(coordinatorv1.LockServiceClient) error) (bool, error)) error {
	var g *coordinatorv1.AcquireResponse
	_, err := call(ctx, "acquire "+name, func(lc coordinatorv1.LockServiceClient) error {
		var err error
		g, err = lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(30 * time.Second), RequestId: requestID})
		return err
	})
	if err != nil {
		return fmt.Errorf("acquire %s: %w", name, err)
	}
	var r *coordinatorv1.ReleaseResponse
	retried, err := call(ctx, "release "+name, func(lc coordinatorv1.LockServiceClient) error {
		var err error
		r, err = lc.Release(ctx, &coordinatorv1.ReleaseRequest{Name: name, Token: g.GetToken(), Handle: g.GetHandle()})
		return err
	})
	switch {
	case err != nil:
		return fmt.Errorf("release %s: %w", name, err)
	case !r.GetReleased():
		return fmt.Errorf("release %s token %d (retried: %v): %w", name, g.GetToken(), retried, errReleasedNothing)
	}
	return nil
}

// await waits until n more cycles have completed.
func (l *handoverLoad) await(t *testing.T, n int64) {
	t.Helper()
	target := l.cycles.Load() + n
	eventually(t, 30*time.Second, fmt.Sprintf("%d more cycles of the load", n), func() bool { return l.cycles.Load() >= target })
}

// stop ends the load and returns what it saw. Idempotent.
func (l *handoverLoad) stop() handoverResult {
	select {
	case <-l.stopc:
	default:
		close(l.stopc)
	}
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.res.cycles = l.cycles.Load()
	return l.res
}

func first(s []string, n int) []string { return s[:min(len(s), n)] }

// byCause counts errors by their message, numbers and names left out.
func byCause(errs []string) []string {
	counts := map[string]int{}
	var order []string
	for _, e := range errs {
		_, msg, _ := strings.Cut(e, ": ")
		msg = strings.Map(func(r rune) rune {
			if r >= '0' && r <= '9' {
				return -1
			}
			return r
		}, msg)
		if counts[msg] == 0 {
			order = append(order, msg)
		}
		counts[msg]++
	}
	out := make([]string, len(order))
	for i, m := range order {
		out[i] = fmt.Sprintf("%d× %s", counts[m], m)
	}
	return out
}
