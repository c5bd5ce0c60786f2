package server_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/coordinator"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/server"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// Forwarding on the shard-owner core (forward.go): replicas of one cluster
// on one embedded etcd, 16 shards, each replica on its own loopback port.

const fwdShards = 16

// fwdSecret is the member secret of the clusters with authorization.
var fwdSecret = []byte("0123456789abcdef0123456789abcdef")

// fwdPolicy lets alice and bob use jobs/ (and list it).
const fwdPolicy = `{
  "admins": ["ops"],
  "identities": {
    "alice": {"lock_prefixes": ["jobs/"]},
    "bob":   {"lock_prefixes": ["jobs/"]}
  }
}`

// fwdReplica is one replica of a shard-core cluster.
type fwdReplica struct {
	id    string
	addr  string
	coord *coordinator.Coordinator
	lc    coordinatorv1.LockServiceClient
}

func (r *fwdReplica) own() *shard.Ownership { return r.coord.Shards().Ownership() }

// startEtcdForShards starts the embedded etcd a cluster shares.
func startEtcdForShards(t *testing.T) *embedetcd.Server {
	t.Helper()
	e, err := embedetcd.Start(context.Background(), t.TempDir(), embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// startReplica starts a member (or, relay, a relay) of the shard core under
// prefix on etcd, its advertised address its listener's, bound first.
func startReplica(t *testing.T, e *embedetcd.Server, prefix, id string, relay bool, srv ...server.Option) *fwdReplica {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts := []shard.OwnerOption{shard.WithShards(fwdShards), shard.WithLeaseTTL(2 * time.Second), shard.WithMember(id, lis.Addr().String())}
	if relay {
		opts = append(opts, shard.AsRelay())
	}
	c, err := coordinator.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()},
		coordinator.WithLease(lease.WithKeyPrefix(prefix)), coordinator.WithShardCore(opts...), coordinator.WithServer(srv...))
	if err != nil {
		lis.Close()
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	c.ServeInBackground(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &fwdReplica{id: id, addr: lis.Addr().String(), coord: c, lc: coordinatorv1.NewLockServiceClient(conn)}
}

// authFor is the server options of a replica with authorization (bearer
// tokens "tok-alice", "tok-bob") and, if secret is set, the member secret.
func authFor(t *testing.T, secret []byte) []server.Option {
	store, _ := authStore(t, fwdPolicy, "alice", "bob")
	opts := []server.Option{authOption(store)}
	if secret != nil {
		opts = append(opts, server.WithMemberSecret(secret))
	}
	return opts
}

// as is ctx with the bearer token of id.
func as(ctx context.Context, id string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer tok-"+id)
}

// waitSplit waits until every shard is owned by one of members, each owns
// some, and every replica (relays too) sees the same owners.
func waitSplit(t *testing.T, members []*fwdReplica, others ...*fwdReplica) {
	t.Helper()
	eventually(t, 30*time.Second, "the shards split between the members, every replica agreeing", func() bool {
		total := 0
		for _, m := range members {
			n := 0
			for s := range uint32(fwdShards) {
				if _, ok := m.own().Owned(s); ok {
					n++
				}
			}
			if n == 0 {
				return false
			}
			total += n
		}
		if total != fwdShards {
			return false
		}
		for s := range uint32(fwdShards) {
			want, _, ok := members[0].own().Owner(s)
			if !ok {
				return false
			}
			for _, r := range append(slices.Clone(members), others...) {
				if id, _, ok := r.own().Owner(s); !ok || id != want {
					return false
				}
			}
		}
		return true
	})
}

// namesOn are n names under prefix whose shard member m owns.
func namesOn(t *testing.T, m *fwdReplica, prefix string, n int) []string {
	t.Helper()
	var out []string
	for i := 0; len(out) < n; i++ {
		if i > 10000 {
			t.Fatalf("no names on member %s", m.id)
		}
		name := fmt.Sprintf("%s%d", prefix, i)
		if id, _, _ := m.own().Owner(shard.ShardOf(name, fwdShards)); id == m.id {
			out = append(out, name)
		}
	}
	return out
}

// A client connected only to member A uses names whose shards member B
// owns: every call is forwarded, its answer (errors included) unchanged;
// a client of B sees the same holder, and the token validates there.
func TestForwardAnyMemberAnswersForAnyName(t *testing.T) {
	e := startEtcdForShards(t)
	a := startReplica(t, e, "/t/", "a", false)
	b := startReplica(t, e, "/t/", "b", false)
	waitSplit(t, []*fwdReplica{a, b})
	ctx := ctxT(t, 30*time.Second)

	for _, name := range namesOn(t, b, "jobs/", 3) {
		g, err := a.lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(10 * time.Second), Owner: "w1"})
		if err != nil {
			t.Fatalf("acquire %s through A: %v", name, err)
		}
		if _, err := a.lc.KeepAlive(ctx, &coordinatorv1.KeepAliveRequest{Name: name, Token: g.GetToken(), Handle: g.GetHandle()}); err != nil {
			t.Fatalf("keepalive %s through A: %v", name, err)
		}
		for _, r := range []*fwdReplica{a, b} {
			v, err := r.lc.ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: name, Token: g.GetToken()})
			if err != nil || !v.GetValid() {
				t.Fatalf("validate %s on %s = %v, %v", name, r.id, v, err)
			}
			d, err := r.lc.Describe(ctx, &coordinatorv1.DescribeRequest{Name: name})
			if err != nil || d.GetHolder().GetToken() != g.GetToken() || d.GetHolder().GetOwner() != "w1" {
				t.Fatalf("describe %s on %s = %v, %v", name, r.id, d, err)
			}
		}
		// A refusal of the owner comes back as the owner built it.
		_, err = a.lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: name, Wait: dur(0)})
		if code(err) != codes.Aborted || reasonOf(err) != "LOCK_HELD" || infoOf(err).GetMetadata()["holderToken"] != fmt.Sprint(g.GetToken()) {
			t.Fatalf("try-lock of held %s through A = %v, want ABORTED LOCK_HELD naming token %d", name, err, g.GetToken())
		}
		_, err = a.lc.KeepAlive(ctx, &coordinatorv1.KeepAliveRequest{Name: name, Token: g.GetToken(), Handle: "x" + g.GetHandle()})
		if code(err) != codes.NotFound || reasonOf(err) != "NOT_HELD" {
			t.Fatalf("keepalive with a wrong handle through A = %v, want NOT_FOUND NOT_HELD", err)
		}
		rel, err := a.lc.Release(ctx, &coordinatorv1.ReleaseRequest{Name: name, Token: g.GetToken(), Handle: g.GetHandle()})
		if err != nil || !rel.GetReleased() {
			t.Fatalf("release %s through A = %v, %v", name, rel, err)
		}
		v, err := b.lc.ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: name, Token: g.GetToken()})
		if err != nil || v.GetValid() {
			t.Fatalf("validate %s on B after the release = %v, %v", name, v, err)
		}
	}
	// And the other way round.
	name := namesOn(t, a, "jobs/", 1)[0]
	g, err := b.lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(10 * time.Second)})
	if err != nil {
		t.Fatalf("acquire %s through B: %v", name, err)
	}
	if v, err := a.lc.ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: name, Token: g.GetToken()}); err != nil || !v.GetValid() {
		t.Fatalf("validate on A = %v, %v", v, err)
	}
}

// A relay owns nothing and forwards every call; List through the relay and
// through a member gathers the holders of both members, sorted by name
// and token, each once.
func TestRelayForwardsEveryCallAndListGathersEveryMember(t *testing.T) {
	e := startEtcdForShards(t)
	a := startReplica(t, e, "/t/", "a", false)
	b := startReplica(t, e, "/t/", "b", false)
	relay := startReplica(t, e, "/t/", "relay", true)
	waitSplit(t, []*fwdReplica{a, b}, relay)
	ctx := ctxT(t, 30*time.Second)
	for s := range uint32(fwdShards) {
		if _, ok := relay.own().Owned(s); ok {
			t.Fatalf("the relay owns shard %d", s)
		}
	}

	names := append(namesOn(t, a, "jobs/a", 3), namesOn(t, b, "jobs/b", 3)...)
	grants := map[string]*coordinatorv1.AcquireResponse{}
	for _, name := range names {
		g, err := relay.lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(10 * time.Second), Owner: "via-relay"})
		if err != nil {
			t.Fatalf("acquire %s through the relay: %v", name, err)
		}
		grants[name] = g
		if _, err := relay.lc.KeepAlive(ctx, &coordinatorv1.KeepAliveRequest{Name: name, Token: g.GetToken(), Handle: g.GetHandle()}); err != nil {
			t.Fatalf("keepalive %s through the relay: %v", name, err)
		}
		if v, err := relay.lc.ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: name, Token: g.GetToken()}); err != nil || !v.GetValid() {
			t.Fatalf("validate %s through the relay = %v, %v", name, v, err)
		}
		if d, err := relay.lc.Describe(ctx, &coordinatorv1.DescribeRequest{Name: name}); err != nil || d.GetHolder().GetToken() != g.GetToken() {
			t.Fatalf("describe %s through the relay = %v, %v", name, d, err)
		}
	}
	// A semaphore of 2 on one of B's names: two holders of one name, sorted by token.
	sem := namesOn(t, b, "jobs/sem", 1)[0]
	for range 2 {
		if _, err := relay.lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: sem, Limit: 2, Ttl: dur(10 * time.Second)}); err != nil {
			t.Fatalf("acquire a slot of %s: %v", sem, err)
		}
	}
	want := append(slices.Clone(names), sem, sem)
	slices.Sort(want)

	for _, r := range []*fwdReplica{relay, a, b} {
		l, err := r.lc.List(ctx, &coordinatorv1.ListRequest{Prefix: "jobs/"})
		if err != nil {
			t.Fatalf("list through %s: %v", r.id, err)
		}
		var got []string
		for i, h := range l.GetHolders() {
			got = append(got, h.GetName())
			if i > 0 {
				p := l.GetHolders()[i-1]
				if p.GetName() > h.GetName() || p.GetName() == h.GetName() && p.GetToken() >= h.GetToken() {
					t.Fatalf("list through %s is not sorted by name and token: %v then %v", r.id, p, h)
				}
			}
			if g := grants[h.GetName()]; g != nil && g.GetToken() != h.GetToken() {
				t.Fatalf("list through %s: %s has token %d, granted %d", r.id, h.GetName(), h.GetToken(), g.GetToken())
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("list through %s = %v, want %v", r.id, got, want)
		}
	}
	// The part one member serves, as a peer asks for it.
	local := metadata.AppendToOutgoingContext(ctx, "coordinatord-forwarded", "1", "coordinatord-list-local", "1")
	l, err := b.lc.List(local, &coordinatorv1.ListRequest{Prefix: "jobs/"})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range l.GetHolders() {
		if id, _, _ := b.own().Owner(shard.ShardOf(h.GetName(), fwdShards)); id != "b" {
			t.Fatalf("B's local list has %s, of member %s's shard", h.GetName(), id)
		}
	}
	if len(l.GetHolders()) != 5 {
		t.Fatalf("B's local list has %d holders, want its 3 names and 2 slots", len(l.GetHolders()))
	}

	for name, g := range grants {
		if r, err := relay.lc.Release(ctx, &coordinatorv1.ReleaseRequest{Name: name, Token: g.GetToken(), Handle: g.GetHandle()}); err != nil || !r.GetReleased() {
			t.Fatalf("release %s through the relay = %v, %v", name, r, err)
		}
	}
}

// The caller's identity crosses the hop with the member secret: alice's
// grant made through A on B's shard is alice's (bob can neither release
// nor renew it through either member), and a client that asserts a
// forwarded identity itself, with a wrong or no secret, is refused.
func TestForwardCarriesTheIdentityOnlyWithTheMemberSecret(t *testing.T) {
	e := startEtcdForShards(t)
	a := startReplica(t, e, "/t/", "a", false, authFor(t, fwdSecret)...)
	b := startReplica(t, e, "/t/", "b", false, authFor(t, fwdSecret)...)
	waitSplit(t, []*fwdReplica{a, b})
	ctx := ctxT(t, 30*time.Second)
	names := namesOn(t, b, "jobs/", 2)
	name, spoofed := names[0], names[1]

	g, err := a.lc.Acquire(as(ctx, "alice"), &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(10 * time.Second)})
	if err != nil {
		t.Fatalf("alice acquires %s through A: %v", name, err)
	}
	for _, r := range []*fwdReplica{a, b} {
		rel, err := r.lc.Release(as(ctx, "bob"), &coordinatorv1.ReleaseRequest{Name: name, Token: g.GetToken(), Handle: g.GetHandle()})
		if err != nil || rel.GetReleased() {
			t.Fatalf("bob releases alice's grant through %s = %v, %v; want released false", r.id, rel, err)
		}
		_, err = r.lc.KeepAlive(as(ctx, "bob"), &coordinatorv1.KeepAliveRequest{Name: name, Token: g.GetToken(), Handle: g.GetHandle()})
		if code(err) != codes.NotFound || reasonOf(err) != "NOT_HELD" {
			t.Fatalf("bob renews alice's grant through %s = %v, want NOT_FOUND NOT_HELD", r.id, err)
		}
	}
	for _, r := range []*fwdReplica{a, b} {
		if _, err := r.lc.KeepAlive(as(ctx, "alice"), &coordinatorv1.KeepAliveRequest{Name: name, Token: g.GetToken(), Handle: g.GetHandle()}); err != nil {
			t.Fatalf("alice renews her grant through %s: %v", r.id, err)
		}
	}

	// Asserting a forwarded identity straight to B, the owner.
	claim := func(kv ...string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, append([]string{"coordinatord-forwarded", "1", "coordinatord-identity", "alice"}, kv...)...)
	}
	for _, tc := range []struct {
		what string
		ctx  context.Context
	}{
		{"no secret", claim()},
		{"a wrong secret", claim("coordinatord-member-secret", "0123456789abcdef0123456789abcdeX")},
		{"a prefix of the secret", claim("coordinatord-member-secret", string(fwdSecret[:16]))},
		{"an empty secret", claim("coordinatord-member-secret", "")},
		{"bob's token and no secret", as(claim(), "bob")},
		{"the secret twice, one wrong", claim("coordinatord-member-secret", "nope", "coordinatord-member-secret", string(fwdSecret))},
	} {
		t.Run(tc.what, func(t *testing.T) {
			_, err := b.lc.Acquire(tc.ctx, &coordinatorv1.AcquireRequest{Name: spoofed, Ttl: dur(10 * time.Second)})
			if code(err) != codes.Unauthenticated || reasonOf(err) != "CREDENTIALS_INVALID" {
				t.Fatalf("acquire asserting alice with %s = %v, want UNAUTHENTICATED CREDENTIALS_INVALID", tc.what, err)
			}
			_, err = b.lc.Release(tc.ctx, &coordinatorv1.ReleaseRequest{Name: name, Token: g.GetToken(), Handle: g.GetHandle()})
			if code(err) != codes.Unauthenticated || reasonOf(err) != "CREDENTIALS_INVALID" {
				t.Fatalf("release asserting alice with %s = %v, want UNAUTHENTICATED CREDENTIALS_INVALID", tc.what, err)
			}
		})
	}
	d, err := b.lc.Describe(as(ctx, "alice"), &coordinatorv1.DescribeRequest{Name: spoofed})
	if err != nil || len(d.GetHolders()) != 0 || len(d.GetWaiters()) != 0 {
		t.Fatalf("describe %s after the refused claims = %v, %v; want nothing granted", spoofed, d, err)
	}
	if d, err := b.lc.Describe(as(ctx, "alice"), &coordinatorv1.DescribeRequest{Name: name}); err != nil || d.GetHolder().GetToken() != g.GetToken() {
		t.Fatalf("alice's grant after the refused claims = %v, %v", d, err)
	}

	// With the secret, the asserted identity is still authorized by the
	// owner: alice may not use secret/ names.
	member := claim("coordinatord-member-secret", string(fwdSecret))
	_, err = b.lc.Acquire(member, &coordinatorv1.AcquireRequest{Name: "secret/x", Ttl: dur(10 * time.Second)})
	if code(err) != codes.PermissionDenied {
		t.Fatalf("a member asserting alice for a name she may not use = %v, want PERMISSION_DENIED", err)
	}

	rel, err := b.lc.Release(as(ctx, "alice"), &coordinatorv1.ReleaseRequest{Name: name, Token: g.GetToken(), Handle: g.GetHandle()})
	if err != nil || !rel.GetReleased() {
		t.Fatalf("alice releases her grant through B = %v, %v", rel, err)
	}
}

// A replica without a member secret refuses every forwarded identity, the
// right secret of another cluster included, and does not forward the
// calls of authenticated clients (SHARD_NOT_SERVED), since it could not
// assert their identity.
func TestNoMemberSecretNoForwardedIdentity(t *testing.T) {
	e := startEtcdForShards(t)
	a := startReplica(t, e, "/t/", "a", false, authFor(t, nil)...)
	b := startReplica(t, e, "/t/", "b", false, authFor(t, nil)...)
	waitSplit(t, []*fwdReplica{a, b})
	ctx := ctxT(t, 30*time.Second)
	name := namesOn(t, b, "jobs/", 1)[0]

	claim := metadata.AppendToOutgoingContext(ctx, "coordinatord-forwarded", "1", "coordinatord-identity", "alice",
		"coordinatord-member-secret", string(fwdSecret))
	_, err := b.lc.Acquire(claim, &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(10 * time.Second)})
	if code(err) != codes.Unauthenticated || reasonOf(err) != "CREDENTIALS_INVALID" {
		t.Fatalf("asserting alice to a replica without a member secret = %v, want UNAUTHENTICATED CREDENTIALS_INVALID", err)
	}
	_, err = a.lc.Acquire(as(ctx, "alice"), &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(10 * time.Second)})
	if code(err) != codes.Unavailable || reasonOf(err) != "SHARD_NOT_SERVED" || infoOf(err).GetMetadata()["owner"] != "b" {
		t.Fatalf("alice on B's shard through A without a member secret = %v, want UNAVAILABLE SHARD_NOT_SERVED naming b", err)
	}
	// Straight to the owner, alice is served (once b has loaded the shard:
	// waitSplit sees owners, not loaded tables).
	eventually(t, 10*time.Second, "alice served by the shard's owner", func() bool {
		_, err := b.lc.Acquire(as(ctx, "alice"), &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(10 * time.Second)})
		if err != nil && reasonOf(err) != "SHARD_NOT_SERVED" {
			t.Fatal(err)
		}
		return err == nil
	})
}

// A forwarded call is never forwarded again: a member that does not own
// the name's shard answers it SHARD_NOT_SERVED at once, naming the owner.
func TestForwardedCallIsNotForwardedAgain(t *testing.T) {
	e := startEtcdForShards(t)
	a := startReplica(t, e, "/t/", "a", false)
	b := startReplica(t, e, "/t/", "b", false)
	waitSplit(t, []*fwdReplica{a, b})
	ctx := metadata.AppendToOutgoingContext(ctxT(t, 30*time.Second), "coordinatord-forwarded", "1")
	name := namesOn(t, a, "jobs/", 1)[0]
	for _, call := range []struct {
		what string
		do   func() error
	}{
		{"Acquire", func() error {
			_, err := b.lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(10 * time.Second)})
			return err
		}},
		{"ValidateToken", func() error {
			_, err := b.lc.ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: name, Token: 1})
			return err
		}},
		{"Describe", func() error { _, err := b.lc.Describe(ctx, &coordinatorv1.DescribeRequest{Name: name}); return err }},
		{"List", func() error { _, err := b.lc.List(ctx, &coordinatorv1.ListRequest{}); return err }},
	} {
		start := time.Now()
		err := call.do()
		if code(err) != codes.Unavailable || reasonOf(err) != "SHARD_NOT_SERVED" {
			t.Fatalf("forwarded %s on A's shard to B = %v, want UNAVAILABLE SHARD_NOT_SERVED", call.what, err)
		}
		if call.what != "List" && infoOf(err).GetMetadata()["owner"] != "a" {
			t.Fatalf("forwarded %s: %v, want the owner a named", call.what, err)
		}
		if d := time.Since(start); d > 500*time.Millisecond {
			t.Fatalf("forwarded %s took %v: retried or forwarded again", call.what, d)
		}
	}
	if d, err := a.lc.Describe(ctxT(t, 5*time.Second), &coordinatorv1.DescribeRequest{Name: name}); err != nil || len(d.GetHolders()) != 0 {
		t.Fatalf("describe on A = %v, %v; want nothing granted", d, err)
	}
}

// A member stopped gracefully while a client keeps calling through the
// other: the forwarder's retries absorb the hand-over, and once the
// survivor owns every shard every call succeeds.
func TestForwardAbsorbsAGracefulHandOver(t *testing.T) {
	e := startEtcdForShards(t)
	a := startReplica(t, e, "/t/", "a", false)
	b := startReplica(t, e, "/t/", "b", false)
	waitSplit(t, []*fwdReplica{a, b})
	names := namesOn(t, b, "jobs/", 4)

	round := func(ctx context.Context, i int) error {
		name := names[i%len(names)]
		g, err := a.lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(10 * time.Second), Wait: dur(2 * time.Second),
			RequestId: fmt.Sprintf("round-%06d-0123456789", i)})
		if err != nil {
			return fmt.Errorf("acquire %s: %w", name, err)
		}
		if v, err := a.lc.ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: name, Token: g.GetToken()}); err != nil || !v.GetValid() {
			return fmt.Errorf("validate %s = %v, %w", name, v, err)
		}
		if r, err := a.lc.Release(ctx, &coordinatorv1.ReleaseRequest{Name: name, Token: g.GetToken(), Handle: g.GetHandle()}); err != nil || !r.GetReleased() {
			return fmt.Errorf("release %s = %v, %w", name, r, err)
		}
		return nil
	}

	var (
		mu     sync.Mutex
		during []string
		stop   = make(chan struct{})
		done   = make(chan struct{})
		rounds int
	)
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := round(ctx, i)
			cancel()
			mu.Lock()
			rounds++
			if err != nil {
				during = append(during, err.Error())
			}
			mu.Unlock()
		}
	}()
	time.Sleep(200 * time.Millisecond)
	b.coord.Close()
	eventually(t, 15*time.Second, "A owns every shard", func() bool {
		for s := range uint32(fwdShards) {
			if _, ok := a.own().Owned(s); !ok {
				return false
			}
		}
		return true
	})
	time.Sleep(300 * time.Millisecond)
	close(stop)
	<-done
	mu.Lock()
	t.Logf("%d rounds during the hand-over, %d failed", rounds, len(during))
	for _, f := range during {
		t.Logf("failed during the hand-over: %s", f)
	}
	if len(during) > 0 {
		t.Errorf("%d of %d rounds failed during the hand-over; the forwarder's retries should absorb a graceful one: %s",
			len(during), rounds, strings.Join(during, "; "))
	}
	mu.Unlock()
	for i := range 40 {
		if err := round(ctxT(t, 5*time.Second), 1000000+i); err != nil {
			t.Fatalf("after the hand-over: %v", err)
		}
	}
}
