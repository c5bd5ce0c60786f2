package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// The shard core keeps its queues in memory on the owner of the name's
// shard: the promises the queue core's tests check through its etcd keys
// (lifecycle_test.go), checked here through the API.

// newShardPair is a shard-core coordinator and a second member on the same
// etcd, the shards split between them.
func newShardPair(t *testing.T) (*env, *replica) {
	t.Helper()
	e := &env{t: t, dataDir: t.TempDir(), onShards: true}
	e.start()
	t.Cleanup(e.stop)
	return e, e.replica()
}

// nameOwnedBy is a lock name whose shard e's coordinator owns (so that the
// other member forwards its calls there).
func nameOwnedBy(t *testing.T, e *env, prefix string) string {
	t.Helper()
	own := e.coord.Shards()
	for i := range 10000 {
		name := fmt.Sprintf("%s%d", prefix, i)
		if _, ok := own.Ownership().Owned(own.ShardOf(name)); ok {
			return name
		}
	}
	t.Fatal("no name of the 10000 tried hashes to a shard of this member")
	return ""
}

// A waiter whose caller is gone (here: the replica that forwarded it
// crashed) leaves the owner's queue at once; the next contender is served.
func TestShardWaiterOfAGoneCallerLeavesTheQueue(t *testing.T) {
	e, r := newShardPair(t)
	name := nameOwnedBy(t, e, "gone/")
	holder := e.acquire(name, 30*time.Second)
	errc := make(chan error, 1)
	go func() {
		_, err := r.lc.Acquire(context.Background(), &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(30 * time.Second)})
		errc <- err
	}()
	eventually(t, 10*time.Second, "the forwarded waiter queued on the owner", func() bool { return e.queueKeys(name) == 2 })
	r.crash()
	if err := <-errc; err == nil {
		t.Fatal("the crashed replica's waiter was granted")
	}
	eventually(t, 5*time.Second, "the gone waiter left the queue", func() bool { return e.queueKeys(name) == 1 })
	e.release(name, holder.Token, holder.Handle)
	if _, err := e.tryAcquire(name); err != nil {
		t.Fatalf("the lock is not free after its holder released it: %v", err)
	}
}

// A retry with the request id of a waiter whose replica crashed joins the
// queue again on another replica and is granted once; only one grant is
// ever made for the id (FIFO order across the crash is not kept: S5).
func TestShardRetryAfterTheForwardingReplicaCrashedRejoins(t *testing.T) {
	e, r := newShardPair(t)
	name := nameOwnedBy(t, e, "crash/")
	holder := e.acquire(name, 30*time.Second)
	const id = "0c6f3a8e-7d21-4c59-9e0b-5a4d3c2b1a09"
	req := &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(30 * time.Second), RequestId: id}
	errB := make(chan error, 1)
	go func() {
		_, err := r.lc.Acquire(context.Background(), req)
		errB <- err
	}()
	eventually(t, 10*time.Second, "B's waiter queued", func() bool { return e.queueKeys(name) == 2 })
	r.crash()
	if err := <-errB; err == nil {
		t.Fatal("the crashed replica's waiter was granted")
	}
	done := make(chan *coordinatorv1.AcquireResponse, 2)
	for range 2 { // two concurrent retries share one place
		go func() {
			g, err := e.lc.Acquire(ctxT(t, 20*time.Second), req)
			if err != nil {
				t.Errorf("retry on replica A: %v", err)
			}
			done <- g
		}()
	}
	eventually(t, 10*time.Second, "the retries queued once", func() bool { return e.queueKeys(name) == 2 })
	e.release(name, holder.Token, holder.Handle)
	g1, g2 := <-done, <-done
	if g1 == nil || g2 == nil || g1.Token != g2.Token || g1.Handle != g2.Handle {
		t.Fatalf("the retries got %v and %v, want one grant", g1, g2)
	}
	if n := e.queueKeys(name); n != 1 {
		t.Fatalf("%d holders and waiters after the grant, want the one grant", n)
	}
	if _, err := e.tryAcquire(name); code(err) != codes.Aborted {
		t.Fatalf("try-lock while the retried grant holds: %v, want ABORTED", err)
	}
}
