package shard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/locktable"
)

// ownerEtcd is an embedded etcd and a client of it.
func ownerEtcd(t *testing.T) (*embedetcd.Server, *clientv3.Client) {
	t.Helper()
	e, err := embedetcd.Start(context.Background(), t.TempDir(), embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return e, cli
}

// startOwner starts a member and waits until it serves every shard.
func startOwner(t *testing.T, cli *clientv3.Client, opts ...OwnerOption) *Owner {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	o, err := NewOwner(ctx, cli, "/t/", append([]OwnerOption{WithShards(8), WithLeaseTTL(2 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		o.Close(cctx)
	})
	waitServing(t, o)
	return o
}

// waitServing waits until the owner answers for every shard.
func waitServing(t *testing.T, o *Owner) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for i := range o.shards {
		for {
			_, err := o.Validate(fmt.Sprintf("probe-of-%d", i), 1)
			if _, _, derr := o.Describe(shardName(o, uint32(i))); err == nil && derr == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("shard %d not served: %v", i, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// shardName is a name of the given shard.
func shardName(o *Owner, shard uint32) string {
	for i := 0; ; i++ {
		n := fmt.Sprintf("n%d", i)
		if o.ShardOf(n) == shard {
			return n
		}
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func acq(name string, ttl, wait time.Duration) locktable.Acquire {
	return locktable.Acquire{Name: name, Caller: "alice", TTL: ttl, Wait: wait}
}

func TestOwnerGrantsPersistsAndValidatesFromMemory(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)

	g, err := o.Acquire(ctx, acq("db", 5*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	// The token is the create revision of the grant's key in etcd.
	resp, err := cli.Get(ctx, o.dataPrefix(o.ShardOf("db")), clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != g.Token {
		t.Fatalf("etcd holds %v (err %v), want one key created at the token %d", resp.Kvs, err, g.Token)
	}
	if v, err := o.Validate("db", g.Token); err != nil || !v.Valid {
		t.Fatalf("Validate current = %+v, %v", v, err)
	}
	// A second try-lock is refused with the holder's token.
	_, err = o.Acquire(ctx, acq("db", 5*time.Second, 0))
	var ng *lease.NotGrantedError
	if !errors.As(err, &ng) || ng.HolderToken != g.Token {
		t.Fatalf("second try-lock: %v", err)
	}
	// A wrong handle releases nothing; the right one does, and etcd is empty.
	if ok, err := o.Release(ctx, "db", g.Token, g.Handle+"x", "alice"); err != nil || ok {
		t.Fatalf("release with a wrong handle = %v, %v", ok, err)
	}
	if ok, err := o.Release(ctx, "db", g.Token, g.Handle, "mallory"); err != nil || ok {
		t.Fatalf("release by another identity = %v, %v", ok, err)
	}
	if ok, err := o.Release(ctx, "db", g.Token, g.Handle, "alice"); err != nil || !ok {
		t.Fatalf("release = %v, %v", ok, err)
	}
	if v, _ := o.Validate("db", g.Token); v.Valid {
		t.Fatal("a released token validates")
	}
	resp, _ = cli.Get(ctx, "/t/shards/data/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if resp.Count != 0 {
		t.Fatalf("%d grant keys left after the release", resp.Count)
	}
}

// One commit per hand-off: a release hands the lock to the first waiter in
// the same unit, so a contended cycle costs about one etcd Txn.
func TestOwnerHandOffIsOneCommit(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	const cycles = 50
	var wg sync.WaitGroup
	var mu sync.Mutex
	var tokens []int64
	before := o.Stats().Txns
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range cycles / 4 {
				g, err := o.Acquire(ctx, locktable.Acquire{Name: "hot", Caller: fmt.Sprint(w), TTL: 5 * time.Second, Wait: 10 * time.Second})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				tokens = append(tokens, g.Token)
				mu.Unlock()
				if ok, err := o.Release(ctx, "hot", g.Token, g.Handle, fmt.Sprint(w)); err != nil || !ok {
					t.Errorf("release = %v, %v", ok, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("tokens not rising in grant order: %v", tokens)
		}
	}
	txns := o.Stats().Txns - before
	// 48 grants and 48 releases: with a hand-off in one commit, about one
	// Txn per cycle (plus the first grant and the last release).
	if per := float64(txns) / float64(len(tokens)); per > 1.2 {
		t.Fatalf("%d Txns for %d contended cycles (%.2f per cycle), want about 1", txns, len(tokens), per)
	}
}

// A grant whose holder stops renewing ends with its TTL: its key is
// deleted and the next waiter gets it.
func TestOwnerExpiryFreesTheLock(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	g, err := o.Acquire(ctx, acq("exp", 300*time.Millisecond, 0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.KeepAlive(ctx, "exp", g.Token, g.Handle, "alice"); err != nil {
		t.Fatalf("keepalive: %v", err)
	}
	g2, err := o.Acquire(ctx, acq("exp", time.Second, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if g2.Token <= g.Token {
		t.Fatalf("next token %d after %d", g2.Token, g.Token)
	}
	if _, err := o.KeepAlive(ctx, "exp", g.Token, g.Handle, "alice"); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("keepalive of the expired grant: %v", err)
	}
}

// A new owner loads the grants the old one persisted and honours them:
// the holder renews and releases with its handle on the new owner.
func TestOwnerTakeoverKeepsGrants(t *testing.T) {
	_, cli := ownerEtcd(t)
	o1 := startOwner(t, cli, WithMember("m1", "a1"))
	ctx := ctxT(t)
	g, err := o1.Acquire(ctx, locktable.Acquire{Name: "kept", Caller: "alice", TTL: 10 * time.Second, RequestID: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	o1.Close(cctx) // graceful: hands every shard over
	cancel()
	o2 := startOwner(t, cli, WithMember("m2", "a2"))
	if v, err := o2.Validate("kept", g.Token); err != nil || !v.Valid {
		t.Fatalf("the new owner validates %+v, %v", v, err)
	}
	// A retry of the request id finds the same grant and handle.
	g2, err := o2.Acquire(ctx, locktable.Acquire{Name: "kept", Caller: "alice", TTL: 10 * time.Second, RequestID: "r1"})
	if err != nil || g2.Token != g.Token || g2.Handle != g.Handle || !g2.Resumed {
		t.Fatalf("retry on the new owner = %+v, %v; want token %d and the same handle", g2, err, g.Token)
	}
	// Another identity with the same request id is just another contender.
	if _, err := o2.Acquire(ctx, locktable.Acquire{Name: "kept", Caller: "bob", TTL: 10 * time.Second, RequestID: "r1"}); !errors.Is(err, lease.ErrNotGranted) {
		t.Fatalf("bob's request id r1 = %v, want not granted", err)
	}
	if _, err := o2.KeepAlive(ctx, "kept", g.Token, g.Handle, "alice"); err != nil {
		t.Fatalf("keepalive on the new owner: %v", err)
	}
	if ok, err := o2.Release(ctx, "kept", g.Token, g.Handle, "alice"); err != nil || !ok {
		t.Fatalf("release on the new owner = %v, %v", ok, err)
	}
}

// A caller that gives up while waiting leaves nothing behind.
func TestOwnerCancelledWaiterLeavesNothing(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	g, err := o.Acquire(ctx, acq("c", 5*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = o.Acquire(wctx, acq("c", 5*time.Second, time.Minute))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiter: %v", err)
	}
	if _, ws, _ := o.Describe("c"); len(ws) != 0 {
		t.Fatalf("waiters left: %v", ws)
	}
	if ok, _ := o.Release(ctx, "c", g.Token, g.Handle, "alice"); !ok {
		t.Fatal("release failed")
	}
}

// A batch never holds two operations on one key, and what etcd keeps
// survives a compaction at the batch's revision and a restart (etcd
// #22376): release and re-acquire one name over and over, compact at the
// last revision, restart etcd, and the held lock is still there.
func TestOwnerReacquireSurvivesCompactionAndRestart(t *testing.T) {
	dir := t.TempDir()
	e, err := embedetcd.Start(context.Background(), dir, embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	o := startOwner(t, cli)
	ctx := ctxT(t)
	var last *locktable.Grant
	for range 30 {
		if last != nil {
			// The release races the next acquire: usually both are in one unit.
			go o.Release(ctx, "again", last.Token, last.Handle, "alice") //nolint:errcheck // its effect is checked by the next grant
		}
		g, err := o.Acquire(ctx, acq("again", 30*time.Second, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		last = g
	}
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	o.Close(cctx)
	cancel()
	resp, err := cli.Get(ctx, "/t/shards/data/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	cli.Close()
	e.Close()
	e2, err := embedetcd.Start(context.Background(), dir, embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	cli2, err := clientv3.New(clientv3.Config{Endpoints: e2.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli2.Close()
	resp, err = cli2.Get(ctx, "/t/shards/data/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, kv := range resp.Kvs {
		found = found || kv.CreateRevision == last.Token
	}
	if !found {
		t.Fatalf("after compaction and restart etcd lost the held grant %d: %d keys", last.Token, len(resp.Kvs))
	}
}

// A member whose lease etcd lost (cut off past its TTL; here revoked)
// joins again with a new lease and serves its shards again: before, it
// owned nothing until restarted, and with no other member nobody did.
func TestOwnerJoinsAgainAfterItsLeaseIsLost(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	g, err := o.Acquire(ctx, acq("kept", 30*time.Second, 0))
	if err != nil {
		t.Fatal(err)
	}
	first := o.Lease().ID()
	if _, err := cli.Revoke(ctx, first); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st := o.Status()
		if st.Rejoins == 1 && st.Serving == st.Shards && o.Lease().ID() != first {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("15s after the lease was revoked: %+v, lease %x (was %x)", st, o.Lease().ID(), first)
		}
	}
	// The grant was persisted before the lease went: the new life honours it.
	if v, err := o.Validate("kept", g.Token); err != nil || !v.Valid {
		t.Fatalf("validate after joining again = %+v, %v", v, err)
	}
	if ok, err := o.Release(ctx, "kept", g.Token, g.Handle, "alice"); err != nil || !ok {
		t.Fatalf("release after joining again = %v, %v", ok, err)
	}
}
