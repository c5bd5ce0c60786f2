package shard

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/locktable"
)

// The census counts, in the shards the member serves, the locks with a
// visible holder (a semaphore's two holders are one lock) and the calls
// queued for them (a waiter until it leaves); a released lock leaves it,
// and a lost shard is not counted until it serves again. The daemon's
// coordinatord_locks_held and coordinatord_lock_waiters read it: on the
// shard core they read the queue core's etcd keys and were always 0.
func TestCensusCountsTheServedShards(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	census := func() Census {
		t.Helper()
		c, err := o.Census()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	want := func(what string, held, waiting int64, shards int) {
		t.Helper()
		if c := census(); c != (Census{Held: held, Waiting: waiting, Shards: shards}) {
			t.Fatalf("%s: census %+v, want held %d, waiting %d, shards %d", what, c, held, waiting, shards)
		}
	}
	want("empty", 0, 0, 8)

	x, err := o.Acquire(ctx, acq("x", 10*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.Acquire(ctx, acq("y", 10*time.Second, 0)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := o.Acquire(ctx, locktable.Acquire{Name: "sem", Caller: "alice", TTL: 10 * time.Second, Limit: 2}); err != nil {
			t.Fatal(err)
		}
	}
	want("x, y and a semaphore of two held", 3, 0, 8)

	wctx, stopWaiting := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		_, err := o.Acquire(wctx, acq("x", 10*time.Second, 10*time.Second))
		waited <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); census().Waiting != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the waiter on x is not counted: %+v", census())
		}
	}
	want("a waiter on x", 3, 1, 8)
	stopWaiting()
	if err := <-waited; err == nil {
		t.Fatal("the cancelled waiter was granted")
	}
	want("the waiter gone", 3, 0, 8)

	if ok, err := o.Release(ctx, "x", x.Token, x.Handle, "alice"); err != nil || !ok {
		t.Fatalf("release x = %v, %v", ok, err)
	}
	want("x released", 2, 0, 8)

	// A shard lost: its locks are another member's to count.
	n := o.ShardOf("y")
	s := o.shards[n]
	s.mu.Lock()
	term := s.term
	s.mu.Unlock()
	held := int64(1) // sem
	if o.ShardOf("sem") == n {
		held = 0
	}
	o.lost(n)
	want("y's shard lost", held, 0, 7)
	o.acquired(n, term) // won again: loads y (and sem, if it is there) from etcd
	waitServing(t, o)
	want("y's shard served again", 2, 0, 8)
}

// Past its lease deadline (cut off from etcd) the member answers nothing,
// and its census fails too: its shards are about to be counted by others,
// and the daemon leaves the gauges out of the scrape, as the queue core's
// census does when etcd does not answer.
func TestCensusFailsPastTheLeaseDeadline(t *testing.T) {
	e, _ := ownerEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	o, err := NewOwner(ctx, cli, "/t/", WithShards(8), WithLeaseTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { // its etcd client is closed: nothing to hand over
		cctx, ccancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer ccancel()
		o.Close(cctx)
	}()
	waitServing(t, o)
	if _, err := o.Census(); err != nil {
		t.Fatalf("census of a member within its deadline: %v", err)
	}
	cli.Close() // renewals stop: the deadline passes within the lease TTL
	deadline := o.Lease().Deadline()
	time.Sleep(time.Until(deadline.Add(50 * time.Millisecond)))
	if c, err := o.Census(); !errors.Is(err, ErrNotServing) {
		t.Fatalf("census past the lease deadline = %+v, %v; want ErrNotServing", c, err)
	}
}
