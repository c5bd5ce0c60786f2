package server_test

import (
	"context"
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
	"google.golang.org/grpc/metadata"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/chaos"
	"github.com/coordinatord/coordinatord/internal/coordinator"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// The per-identity lock limit on the shard-owner core, across members: the
// identity's count lives on one shard (its home) whatever shards its locks
// are on, so a burst spread over both members and many names is cut at
// exactly n, slots come back when locks end (release, expiry, a cancelled
// waiter), and a crash of a member keeps the count once its shards are
// taken over.

// limitMember is a member of a two-member shard core with authorization
// (alice and bob, jobs/), the member secret and a per-identity limit, on
// etcd through a fault proxy so that it can crash.
type limitMember struct {
	id         string
	proxy      *chaos.Proxy
	coord      *coordinator.Coordinator
	alice, bob coordinatorv1.LockServiceClient
}

func startLimitMember(t *testing.T, etcd *embedetcd.Server, id string, n int64) *limitMember {
	t.Helper()
	proxy, err := chaos.NewProxy(strings.TrimPrefix(etcd.Endpoints()[0], "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := coordinator.New(clientv3.Config{Endpoints: []string{"http://" + proxy.Addr()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()},
		coordinator.WithLease(lease.WithKeyPrefix("/limit/"), lease.WithMaxLocksPerIdentity(n)),
		coordinator.WithShardCore(shard.WithShards(fwdShards), shard.WithLeaseTTL(2*time.Second), shard.WithMember(id, lis.Addr().String())),
		coordinator.WithServer(authFor(t, fwdSecret)...))
	if err != nil {
		lis.Close()
		t.Fatal(err)
	}
	c.ServeInBackground(lis)
	m := &limitMember{id: id, proxy: proxy, coord: c}
	t.Cleanup(m.crash)
	dial := func(who string) coordinatorv1.LockServiceClient {
		conn, err := grpc.NewClient(lis.Addr().String(), plaintext(), grpc.WithPerRPCCredentials(bearer("tok-"+who)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return coordinatorv1.NewLockServiceClient(conn)
	}
	m.alice, m.bob = dial("alice"), dial("bob")
	return m
}

// crash cuts the member off etcd, then stops it (idempotent).
func (m *limitMember) crash() {
	m.proxy.Set(chaos.Blackhole, 0)
	m.coord.Crash()
}

// owns says whether m serves the shard of name.
func (m *limitMember) owns(name string) bool {
	_, ok := m.coord.Shards().Ownership().Owned(shard.ShardOf(name, fwdShards))
	return ok
}

// waitersOn counts name's waiters on the member that serves it.
func waitersOn(t *testing.T, name string, members ...*limitMember) int {
	t.Helper()
	for _, m := range members {
		if _, ws, err := m.coord.Shards().Describe(name); err == nil {
			return len(ws)
		}
	}
	return -1
}

// heldBy counts the holders with owner label owner across the members.
func heldBy(owner string, members ...*limitMember) int {
	n := 0
	for _, m := range members {
		hs, _ := m.coord.Shards().List("jobs/")
		for _, h := range hs {
			if h.Owner == owner {
				n++
			}
		}
	}
	return n
}

// grantOf is a lock alice holds.
type grantOf struct {
	name string
	resp *coordinatorv1.AcquireResponse
}

func TestIdentityLimitOnShardsIsExactAcrossMembers(t *testing.T) {
	const n, burst = 8, 64
	etcd, err := embedetcd.Start(context.Background(), t.TempDir(), embedetcd.WithFastElection(), embedetcd.WithInsecureTCPClients())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Close)
	a, b := startLimitMember(t, etcd, "a", n), startLimitMember(t, etcd, "b", n)
	awaitShards(t, a.coord, b.coord)
	members := []*limitMember{a, b}

	// bob holds one lock on each member's shards; alice's waiters queue there.
	var busy []string
	for _, m := range members {
		for i := 0; ; i++ {
			if name := fmt.Sprintf("jobs/busy-%s-%d", m.id, i); m.owns(name) {
				busy = append(busy, name)
				break
			}
		}
	}
	for _, name := range busy {
		if _, err := a.bob.Acquire(ctxT(t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}

	// The burst: 64 Acquires of alice, half through each member, on names
	// of both members' shards; one in four waits for a lock bob holds.
	waitCtx, cancelWaits := context.WithCancel(context.Background())
	defer cancelWaits()
	var (
		mu       sync.Mutex
		granted  []grantOf
		refused  []error
		waitErrs = make(chan error, burst)
		waiters  []*burstWaiter
		maxHeld  atomic.Int64
	)
	stop := make(chan struct{})
	polled := make(chan struct{})
	go func() { // alice's holders and waiters, as the owners see them, all along
		defer close(polled)
		for {
			held := int64(heldBy("burst", a, b) + waitersOn(t, busy[0], a, b) + waitersOn(t, busy[1], a, b))
			if held > maxHeld.Load() {
				maxHeld.Store(held)
			}
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	var wg sync.WaitGroup
	for i := range burst {
		via := members[i%2].alice
		if i%4 == 3 {
			ctx, cancel := context.WithCancel(waitCtx)
			w := &burstWaiter{cancel: cancel}
			waiters = append(waiters, w)
			name := busy[(i/4)%2]
			go func() {
				_, err := via.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: name, Owner: "burst", Ttl: dur(time.Minute)})
				w.done.Store(true)
				waitErrs <- err
			}()
			continue
		}
		wg.Go(func() {
			name := fmt.Sprintf("jobs/burst-%d", i)
			r, err := via.Acquire(ctxT(t, 20*time.Second), &coordinatorv1.AcquireRequest{Name: name, Owner: "burst", Ttl: dur(time.Minute), Wait: dur(0)})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				refused = append(refused, err)
			} else {
				granted = append(granted, grantOf{name, r})
			}
		})
	}
	wg.Wait()
	waiting := func() int { return waitersOn(t, busy[0], a, b) + waitersOn(t, busy[1], a, b) }
	refusedWaits := 0
	eventually(t, 20*time.Second, "every call of the burst granted, waiting or refused", func() bool {
		for {
			select {
			case err := <-waitErrs:
				refused = append(refused, err)
				refusedWaits++
				continue
			default:
			}
			break
		}
		return len(granted)+len(refused)+waiting() == burst
	})
	close(stop)
	<-polled
	if got := len(granted) + waiting(); got != n {
		t.Fatalf("%d granted and %d waiting after a burst of %d, want %d in all (limit %d)", len(granted), waiting(), burst, n, n)
	}
	if got := maxHeld.Load(); got > n {
		t.Fatalf("alice held or waited for %d locks at once, limit %d", got, n)
	}
	for _, err := range refused {
		limitReason(t, err, "TOO_MANY_LOCKS", "max-locks-per-identity", n)
	}
	// etcd holds exactly n slots of alice's count, each put before its
	// Acquire queued; the count is no lock: nothing of it is among the
	// grants (List, Describe and Watch show those) nor in any member's List.
	cli := a.coord.Etcd()
	slots := fmt.Sprintf("/limit/shards/identity/%05d/%s/", a.coord.Shards().IdentityHome("alice"), keyspace.IdentityHash("alice"))
	if r, err := cli.Get(ctxT(t, 10*time.Second), slots, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || r.Count != n {
		t.Fatalf("%v slots of alice's in etcd (%v), want %d", r.Count, err, n)
	}
	r, err := cli.Get(ctxT(t, 10*time.Second), "/limit/shards/data/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range r.Kvs {
		if strings.ContainsAny(string(kv.Key), "\x00") || strings.Contains(string(kv.Key), "identity") {
			t.Fatalf("a grant key %q of the identity's count", kv.Key)
		}
	}
	for _, m := range members {
		hs, _ := m.coord.Shards().List("")
		for _, h := range hs {
			if !strings.HasPrefix(h.Name, "jobs/") {
				t.Fatalf("member %s lists %q", m.id, h.Name)
			}
		}
	}
	onA, onB := 0, 0
	for _, g := range granted {
		if a.owns(g.name) {
			onA++
		} else {
			onB++
		}
	}
	t.Logf("granted %d (%d on a's shards, %d on b's), waiting %d, refused %d (%d of them waiters)", len(granted), onA, onB, waiting(), len(refused), refusedWaits)

	// tryLock is a try-lock of a new name by alice through m.
	next := 0
	tryLock := func(m *limitMember, ttl time.Duration) (grantOf, error) {
		next++
		name := fmt.Sprintf("jobs/after-%d", next)
		r, err := m.alice.Acquire(ctxT(t, 20*time.Second), &coordinatorv1.AcquireRequest{Name: name, Owner: "burst", Ttl: dur(ttl), Wait: dur(0)})
		return grantOf{name, r}, err
	}
	full := func(m *limitMember, why string) {
		t.Helper()
		_, err := tryLock(m, time.Minute)
		if code(err) != codes.ResourceExhausted {
			t.Fatalf("%s: a try-lock %v, want TOO_MANY_LOCKS", why, err)
		}
		limitReason(t, err, "TOO_MANY_LOCKS", "max-locks-per-identity", n)
	}
	// freed waits until a try-lock through m is granted (a slot came back),
	// then checks the count is full again.
	freed := func(m *limitMember, ttl time.Duration, why string) grantOf {
		t.Helper()
		var g grantOf
		eventually(t, 15*time.Second, why, func() bool {
			var err error
			g, err = tryLock(m, ttl)
			if err != nil && code(err) != codes.ResourceExhausted {
				t.Fatalf("%s: %v", why, err)
			}
			return err == nil
		})
		full(members[next%2], why+", then full again")
		return g
	}
	full(a, "after the burst")
	full(b, "after the burst")
	// A client cannot act on a count as a member does: the metadata of a
	// member's call, without the member secret, is refused.
	forged := metadata.AppendToOutgoingContext(ctxT(t, 10*time.Second), "coordinatord-forwarded", "1", "coordinatord-identity-slots", "release")
	if _, err := a.alice.Acquire(forged, &coordinatorv1.AcquireRequest{Name: "jobs/x", RequestId: "0123456789abcdef0123456789abcdef"}); code(err) != codes.InvalidArgument || fieldOf(err) != "coordinatord-identity-slots" {
		t.Fatalf("a client's call on its count as a member: %v, want INVALID_ARGUMENT on the metadata", err)
	}
	full(b, "after a forged release")

	// A release frees its slot before it is answered, across members.
	if len(granted) == 0 {
		t.Fatal("nothing was granted")
	}
	rel := granted[0]
	granted = granted[1:]
	via := a
	if a.owns(rel.name) {
		via = b // the release is forwarded to the owner
	}
	if r, err := via.alice.Release(ctxT(t, 10*time.Second), &coordinatorv1.ReleaseRequest{Name: rel.name, Token: rel.resp.GetToken(), Handle: rel.resp.GetHandle()}); err != nil || !r.GetReleased() {
		t.Fatalf("release: %v %v", r, err)
	}
	g, err := tryLock(members[(next+1)%2], time.Minute)
	if err != nil {
		t.Fatalf("a try-lock right after a release: %v", err)
	}
	granted = append(granted, g)
	full(a, "after the released slot was taken again")

	// A cancelled waiter's slot comes back; so does an expired grant's.
	for _, w := range waiters {
		if !w.done.Load() { // still queued (the refused ones returned)
			w.cancel()
			freed(b, time.Second, "the slot of a cancelled waiter comes back") // never renewed: it expires after 1s
			granted = append(granted, freed(a, time.Minute, "the slot of an expired grant comes back"))
			break
		}
	}

	// Every waiter gone, alice holds n locks (granted, a minute each).
	cancelWaits()
	eventually(t, 10*time.Second, "no waiter left", func() bool { return waiting() == 0 })
	for len(granted) < n {
		eventually(t, 10*time.Second, "the slots of the cancelled waiters come back", func() bool {
			g, err := tryLock(members[len(granted)%2], time.Minute)
			if err == nil {
				granted = append(granted, g)
			}
			return err == nil
		})
	}
	full(a, "with n locks held")
	if got := heldBy("burst", a, b); got != n {
		t.Fatalf("alice holds %d locks, want %d", got, n)
	}

	// A crash of the member that keeps alice's count (its home): once the
	// other takes over its shards, it keeps the count and the slots of the
	// grants it reloaded, past the slots' TTL (10s) without renewal by the
	// crashed member: alice stays at n.
	home := a.coord.Shards().IdentityHome("alice")
	gone, survivor := a, b
	if _, ok := b.coord.Shards().Ownership().Owned(home); ok {
		gone, survivor = b, a
	}
	var moved []grantOf // on the shards of the member that crashes
	for _, g := range granted {
		if gone.owns(g.name) {
			moved = append(moved, g)
		}
	}
	t.Logf("crashing member %s (alice's home, %d of her locks on its shards)", gone.id, len(moved))
	gone.crash()
	awaitShards(t, survivor.coord)
	for _, g := range granted {
		v, err := survivor.alice.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: g.name, Token: g.resp.GetToken()})
		if err != nil || !v.GetValid() {
			t.Fatalf("%s after the takeover: %v %v, want valid", g.name, v, err)
		}
	}
	for end := time.Now().Add(12 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		full(survivor, "after the takeover")
	}
	// A release of a lock the survivor took over frees its slot there.
	back := granted[0]
	if len(moved) > 0 {
		back = moved[0]
	}
	if r, err := survivor.alice.Release(ctxT(t, 10*time.Second), &coordinatorv1.ReleaseRequest{Name: back.name, Token: back.resp.GetToken(), Handle: back.resp.GetHandle()}); err != nil || !r.GetReleased() {
		t.Fatalf("release after the takeover: %v %v", r, err)
	}
	if _, err := tryLock(survivor, time.Minute); err != nil {
		t.Fatalf("a try-lock after a release, after the takeover: %v", err)
	}
	full(survivor, "after the takeover and a release")
}

// burstWaiter is an Acquire of the burst that waits for a lock bob holds.
type burstWaiter struct {
	cancel context.CancelFunc
	done   atomic.Bool // it returned (refused, or cancelled)
}
