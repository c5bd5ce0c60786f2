package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/coordinator"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/server"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// Hold and ForceRelease on both lock cores: the queue core (the default)
// and the shard-owner core (-core shard) answer them with one contract.

// cores are the lock cores a test runs on.
var cores = []string{"queue", "shard"}

// onCores runs f as a subtest on each core, each with its own coordinator
// (and gRPC server options).
func onCores(t *testing.T, f func(t *testing.T, e *env), srv ...server.Option) {
	for _, core := range cores {
		t.Run(core, func(t *testing.T) { f(t, newCoreEnv(t, core, srv...)) })
	}
}

// newCoreEnv is newEnvWith on the given core: on "shard", the shard-owner
// core with 16 shards and a 2s member lease, serving every shard before it
// returns.
func newCoreEnv(t *testing.T, core string, srv ...server.Option) *env {
	t.Helper()
	e := &env{t: t, dataDir: t.TempDir()}
	var err error
	e.etcd, err = embedetcd.Start(context.Background(), e.dataDir, embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	opts := []coordinator.Option{coordinator.WithLease(lease.WithKeyPrefix("/test/")), coordinator.WithServer(srv...)}
	if core == "shard" {
		opts = append(opts, coordinator.WithShardCore(shard.WithShards(16), shard.WithLeaseTTL(2*time.Second)))
	}
	c, err := coordinator.New(clientv3.Config{Endpoints: e.etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()}, opts...)
	if err != nil {
		e.etcd.Close()
		t.Fatal(err)
	}
	e.coord, e.cli, e.mgr, e.gs = c, c.Etcd(), c.Leases(), c.GRPC()
	t.Cleanup(e.stop)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = lis.Addr().String()
	c.ServeInBackground(lis)
	e.conn = e.dial()
	e.lc = coordinatorv1.NewLockServiceClient(e.conn)
	if o := c.Shards(); o != nil {
		waitShardsServed(t, o)
	}
	return e
}

// waitShardsServed waits until the owner answers for every shard (the
// embedded single member wins them all).
func waitShardsServed(t *testing.T, o *shard.Owner) {
	t.Helper()
	probes := map[uint32]string{}
	for i := 0; len(probes) < 16; i++ {
		n := fmt.Sprintf("probe/%d", i)
		if _, ok := probes[o.ShardOf(n)]; !ok {
			probes[o.ShardOf(n)] = n
		}
	}
	deadline := time.Now().Add(15 * time.Second)
	for _, n := range probes {
		for {
			_, err := o.Validate(n, 1)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the shard of %q is not served 15s after New: %v", n, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// holdRelease asks the stream to release its lock.
var holdRelease = &coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Release{Release: &coordinatorv1.HoldRelease{}}}

// Hold grants the lock, and heartbeats keep it for several TTLs; silence
// loses it within its TTL, and the stream says so (Lost, EXPIRED).
func TestHoldOnCoresHeartbeatsKeepTheLockAndSilenceLosesIt(t *testing.T) {
	onCores(t, func(t *testing.T, e *env) {
		const ttl = 2 * time.Second // heartbeats every ttl/5: robust on a slow -race run
		st, g := e.hold(ctxT(t, 30*time.Second), holdAcquire("h", ttl, false))
		if g.Token <= 0 || g.Handle == "" || g.Resumed || !g.SafeUntil.AsTime().Before(g.ExpiresAt.AsTime()) {
			t.Fatalf("granted %v", g)
		}
		if d := e.describe("h"); d.GetHolder().GetToken() != g.Token {
			t.Fatalf("describe shows %v, want the stream's grant %d", d.GetHolder(), g.Token)
		}
		for range 12 { // 4.8s: more than twice the TTL
			time.Sleep(ttl / 5)
			if err := st.Send(heartbeat); err != nil {
				t.Fatal(err)
			}
			r, err := st.Recv()
			if err != nil || r.GetRenewed() == nil {
				t.Fatalf("heartbeat answered %v, %v; want renewed", r, err)
			}
			if !r.GetRenewed().SafeUntil.AsTime().Before(r.GetRenewed().ExpiresAt.AsTime()) {
				t.Fatal("renewed safe_until not before expires_at")
			}
		}
		if v := e.validate("h", g.Token); !v.Valid {
			t.Fatalf("lock lost despite heartbeats: %v", v)
		}
		silent := time.Now()
		r, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if l := r.GetLost(); l == nil || l.Reason != coordinatorv1.HoldLost_REASON_EXPIRED || l.Token != g.Token {
			t.Fatalf("got %v, want lost/expired", r)
		}
		if !raceEnabled && time.Since(silent) > ttl+1500*time.Millisecond {
			t.Errorf("lost reported %v after the last heartbeat; TTL is %v", time.Since(silent), ttl)
		}
		if _, err := st.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("after lost: %v, want the stream's end", err)
		}
		if n := e.acquire("h", time.Second); n.Token <= g.Token {
			t.Fatalf("new token %d not above %d", n.Token, g.Token)
		}
	})
}

// The ends of a Hold stream: a release asked on it, a clean close and a
// disconnect with release_on_disconnect free the lock at once; a
// disconnect without it keeps the lease (and a new stream resumes it with
// the handle); an operator's force release ends the stream with Lost,
// FORCE_RELEASED.
func TestHoldOnCoresReleaseResumeAndDisconnect(t *testing.T) {
	onCores(t, func(t *testing.T, e *env) {
		t.Run("release", func(t *testing.T) {
			st, g := e.hold(ctxT(t, 10*time.Second), holdAcquire("r", 30*time.Second, false))
			if err := st.Send(holdRelease); err != nil {
				t.Fatal(err)
			}
			r, err := st.Recv()
			if err != nil || !r.GetReleased().GetReleased() {
				t.Fatalf("release answered %v, %v", r, err)
			}
			if _, err := st.Recv(); !errors.Is(err, io.EOF) {
				t.Fatalf("after released: %v, want the stream's end", err)
			}
			if v := e.validate("r", g.Token); v.Valid {
				t.Fatal("still valid after release")
			}
		})
		t.Run("close_releases", func(t *testing.T) {
			st, g := e.hold(ctxT(t, 10*time.Second), holdAcquire("c", 30*time.Second, true))
			if err := st.CloseSend(); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Recv(); !errors.Is(err, io.EOF) {
				t.Fatalf("after close: %v, want a clean end", err)
			}
			n, err := e.tryAcquire("c") // at once: wait 0
			if err != nil {
				t.Fatalf("try-lock after the holding stream closed: %v", err)
			}
			if n.Token <= g.Token {
				t.Fatalf("new token %d not above %d", n.Token, g.Token)
			}
		})
		t.Run("release_on_disconnect", func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			_, g := e.hold(ctx, holdAcquire("d", 30*time.Second, true))
			cancel()
			eventually(t, 5*time.Second, "lock freed on disconnect", func() bool { return !e.validate("d", g.Token).Valid })
			if _, err := e.tryAcquire("d"); err != nil {
				t.Fatalf("try-lock after the disconnect: %v", err)
			}
		})
		t.Run("disconnect_keeps_lease_until_ttl", func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			_, g := e.hold(ctx, holdAcquire("k", 30*time.Second, false))
			cancel()
			time.Sleep(300 * time.Millisecond)
			if !e.validate("k", g.Token).Valid {
				t.Fatal("lock freed on disconnect without release_on_disconnect")
			}
			st, g2 := e.hold(ctxT(t, 10*time.Second), &coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Resume{Resume: &coordinatorv1.HoldResume{Name: "k", Token: g.Token, Handle: g.Handle}}})
			if g2.Token != g.Token || g2.Handle != g.Handle || !g2.Resumed || !g2.AcquiredAt.AsTime().Equal(g.AcquiredAt.AsTime()) {
				t.Fatalf("resume granted %v, want %v resumed", g2, g)
			}
			if err := st.Send(heartbeat); err != nil {
				t.Fatal(err)
			}
			if r, err := st.Recv(); err != nil || r.GetRenewed() == nil {
				t.Fatalf("heartbeat after resume: %v, %v", r, err)
			}
			bad, _ := e.lc.Hold(ctxT(t, 5*time.Second))
			_ = bad.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Resume{Resume: &coordinatorv1.HoldResume{Name: "k", Token: g.Token + 1, Handle: g.Handle}}})
			if _, err := bad.Recv(); code(err) != codes.NotFound {
				t.Fatalf("resume with a stale token: %v, want NOT_FOUND", err)
			}
			// The resumed stream's release frees the lock.
			if err := st.Send(holdRelease); err != nil {
				t.Fatal(err)
			}
			if r, err := st.Recv(); err != nil || !r.GetReleased().GetReleased() {
				t.Fatalf("release after resume: %v, %v", r, err)
			}
		})
		t.Run("force_release_is_reported", func(t *testing.T) {
			st, g := e.hold(ctxT(t, 10*time.Second), holdAcquire("f", 30*time.Second, false))
			r, err := e.lc.ForceRelease(ctxT(t, 5*time.Second), &coordinatorv1.ForceReleaseRequest{Name: "f", Token: g.Token})
			if err != nil || !r.Released {
				t.Fatalf("ForceRelease = %v, %v", r, err)
			}
			ev, err := st.Recv()
			if err != nil || ev.GetLost().GetReason() != coordinatorv1.HoldLost_REASON_FORCE_RELEASED || ev.GetLost().GetToken() != g.Token {
				t.Fatalf("got %v, %v; want lost/force-released", ev, err)
			}
			if _, err := st.Recv(); !errors.Is(err, io.EOF) {
				t.Fatalf("after lost: %v, want the stream's end", err)
			}
			// A stale token (the grant is gone): released=false, no error.
			r, err = e.lc.ForceRelease(ctxT(t, 5*time.Second), &coordinatorv1.ForceReleaseRequest{Name: "f", Token: g.Token})
			if err != nil || r.Released {
				t.Fatalf("second ForceRelease = %v, %v; want released=false", r, err)
			}
		})
		t.Run("release_elsewhere_is_reported", func(t *testing.T) {
			st, g := e.hold(ctxT(t, 10*time.Second), holdAcquire("e", 30*time.Second, false))
			if !e.release("e", g.Token, g.Handle) {
				t.Fatal("release with the handle on another connection failed")
			}
			ev, err := st.Recv()
			if err != nil || ev.GetLost().GetReason() != coordinatorv1.HoldLost_REASON_RELEASED_ELSEWHERE {
				t.Fatalf("got %v, %v; want lost/released-elsewhere", ev, err)
			}
		})
		t.Run("first_message_must_acquire_or_resume", func(t *testing.T) {
			st, err := e.lc.Hold(ctxT(t, 5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Send(heartbeat); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Recv(); code(err) != codes.InvalidArgument || fieldOf(err) != "kind" {
				t.Fatalf("a heartbeat first: %v (field %q), want INVALID_ARGUMENT on kind", err, fieldOf(err))
			}
		})
		t.Run("held_elsewhere_try_lock", func(t *testing.T) {
			held := e.acquire("busy", 30*time.Second)
			st, err := e.lc.Hold(ctxT(t, 5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Acquire{Acquire: &coordinatorv1.HoldAcquire{
				Request: &coordinatorv1.AcquireRequest{Name: "busy", Ttl: dur(5 * time.Second), Wait: dur(0)}}}}); err != nil {
				t.Fatal(err)
			}
			_, err = st.Recv()
			if code(err) != codes.Aborted || holderToken(t, err) != held.Token {
				t.Fatalf("a try-lock Hold of a held lock: %v, want ABORTED with holder token %d", err, held.Token)
			}
		})
	})
}

// ForceRelease answers released=false for a token that holds nothing
// (stale, or never issued), and refuses a malformed one; a lock
// force-released is free for the next holder.
func TestForceReleaseOnCores(t *testing.T) {
	onCores(t, func(t *testing.T, e *env) {
		g := e.acquire("fr", 30*time.Second)
		force := func(name string, token int64) (*coordinatorv1.ForceReleaseResponse, error) {
			return e.lc.ForceRelease(ctxT(t, 5*time.Second), &coordinatorv1.ForceReleaseRequest{Name: name, Token: token})
		}
		if r, err := force("fr", g.Token+1000); err != nil || r.Released {
			t.Fatalf("ForceRelease of a token never issued = %v, %v; want released=false", r, err)
		}
		if r, err := force("other", g.Token); err != nil || r.Released {
			t.Fatalf("ForceRelease of another lock's token = %v, %v; want released=false", r, err)
		}
		if _, err := force("fr", 0); code(err) != codes.InvalidArgument {
			t.Fatalf("ForceRelease of token 0: %v, want INVALID_ARGUMENT", err)
		}
		if _, err := force("", g.Token); code(err) != codes.InvalidArgument {
			t.Fatalf("ForceRelease of no name: %v, want INVALID_ARGUMENT", err)
		}
		if !e.validate("fr", g.Token).Valid {
			t.Fatal("a refused ForceRelease ended the grant")
		}
		if r, err := force("fr", g.Token); err != nil || !r.Released {
			t.Fatalf("ForceRelease = %v, %v", r, err)
		}
		if v := e.validate("fr", g.Token); v.Valid {
			t.Fatalf("valid after ForceRelease: %v", v)
		}
		// The holder's handle renews and releases nothing any more.
		if _, err := e.lc.KeepAlive(ctxT(t, 5*time.Second), &coordinatorv1.KeepAliveRequest{Name: "fr", Token: g.Token, Handle: g.Handle}); code(err) != codes.NotFound {
			t.Fatalf("KeepAlive after ForceRelease: %v, want NOT_FOUND", err)
		}
		if e.release("fr", g.Token, g.Handle) {
			t.Fatal("released after ForceRelease")
		}
		if r, err := force("fr", g.Token); err != nil || r.Released {
			t.Fatalf("ForceRelease again = %v, %v; want released=false", r, err)
		}
		if n, err := e.tryAcquire("fr"); err != nil || n.Token <= g.Token {
			t.Fatalf("try-lock after ForceRelease = %v, %v", n, err)
		}
	})
}

// With authorization on, ForceRelease is an admin's (the interceptor's
// check applies on both cores), and a Hold's calls, its release on
// disconnect included, are its caller's.
func TestHoldAndForceReleaseAuthorizationOnCores(t *testing.T) {
	for _, core := range cores {
		t.Run(core, func(t *testing.T) {
			store, _ := authStore(t, testPolicy, "ops", "b.example")
			e := newCoreEnv(t, core, authOption(store))
			as := func(id string) coordinatorv1.LockServiceClient {
				return e.dialWith(plaintext(), grpc.WithPerRPCCredentials(bearer("tok-"+id)))
			}
			b, ops := as("b.example"), as("ops")
			ctx := func() context.Context { return ctxT(t, 10*time.Second) }
			valid := func(name string, token int64) bool {
				t.Helper()
				v, err := ops.ValidateToken(ctx(), &coordinatorv1.ValidateTokenRequest{Name: name, Token: token})
				if err != nil {
					t.Fatalf("validate %q %d: %v", name, token, err)
				}
				return v.Valid
			}
			hold := func(lc coordinatorv1.LockServiceClient, ctx context.Context, first *coordinatorv1.HoldRequest) (coordinatorv1.LockService_HoldClient, *coordinatorv1.HoldResponse, error) {
				st, err := lc.Hold(ctx)
				if err != nil {
					return nil, nil, err
				}
				if err := st.Send(first); err != nil {
					return nil, nil, err
				}
				r, err := st.Recv()
				return st, r, err
			}
			if _, _, err := hold(b, ctx(), holdAcquire("a/held", time.Minute, false)); code(err) != codes.PermissionDenied {
				t.Fatalf("Hold outside the prefixes: %v, want PERMISSION_DENIED", err)
			}
			st, r, err := hold(b, ctx(), holdAcquire("b/held", time.Minute, false))
			if err != nil || r.GetGranted() == nil {
				t.Fatalf("Hold inside the prefixes: %v, %v", r, err)
			}
			g := r.GetGranted()
			if _, err := b.ForceRelease(ctx(), &coordinatorv1.ForceReleaseRequest{Name: "b/held", Token: g.Token}); code(err) != codes.PermissionDenied {
				t.Fatalf("ForceRelease by a non-admin, own prefix: %v, want PERMISSION_DENIED", err)
			}
			if !valid("b/held", g.Token) {
				t.Fatal("a refused ForceRelease ended the grant")
			}
			fr, err := ops.ForceRelease(ctx(), &coordinatorv1.ForceReleaseRequest{Name: "b/held", Token: g.Token})
			if err != nil || !fr.Released {
				t.Fatalf("ForceRelease by an admin: %v, %v", fr, err)
			}
			if ev, err := st.Recv(); err != nil || ev.GetLost().GetReason() != coordinatorv1.HoldLost_REASON_FORCE_RELEASED {
				t.Fatalf("the held stream got %v, %v; want lost/force-released", ev, err)
			}

			// release_on_disconnect releases as the stream's caller.
			hctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, r, err = hold(b, hctx, holdAcquire("b/gone", time.Minute, true))
			if err != nil || r.GetGranted() == nil {
				t.Fatalf("Hold b/gone: %v, %v", r, err)
			}
			cancel()
			eventually(t, 5*time.Second, "the disconnected caller's lock freed", func() bool {
				return !valid("b/gone", r.GetGranted().Token)
			})
		})
	}
}

// On the shard core a Hold outlives a hand-over of its shard (the owner's
// table dropped and loaded again from etcd): heartbeats renew on the new
// table, and the stream follows the grant there (a force release is
// reported).
func TestHoldOnShardCoreFollowsItsGrantAcrossAHandOver(t *testing.T) {
	e := newCoreEnv(t, "shard")
	o := e.coord.Shards()
	st, g := e.hold(ctxT(t, 30*time.Second), holdAcquire("moved", 2*time.Second, false))
	n := o.ShardOf("moved")
	before, ok := o.Ownership().Owned(n)
	if !ok {
		t.Fatalf("shard %d not owned", n)
	}
	if err := o.Ownership().Release(ctxT(t, 5*time.Second), n); err != nil { // campaigned for again at once
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the shard served again in a new term", func() bool {
		after, ok := o.Ownership().Owned(n)
		_, err := o.Validate("moved", 1)
		return ok && after != before && err == nil
	})
	for range 8 { // 3.2s: beyond the TTL, so only renewals on the new table keep it
		time.Sleep(400 * time.Millisecond)
		if err := st.Send(heartbeat); err != nil {
			t.Fatal(err)
		}
		if r, err := st.Recv(); err != nil || r.GetRenewed() == nil {
			t.Fatalf("heartbeat after the hand-over answered %v, %v; want renewed", r, err)
		}
	}
	if !e.validate("moved", g.Token).Valid {
		t.Fatal("the grant did not survive the hand-over")
	}
	if r, err := e.lc.ForceRelease(ctxT(t, 5*time.Second), &coordinatorv1.ForceReleaseRequest{Name: "moved", Token: g.Token}); err != nil || !r.Released {
		t.Fatalf("ForceRelease = %v, %v", r, err)
	}
	if ev, err := st.Recv(); err != nil || ev.GetLost().GetReason() != coordinatorv1.HoldLost_REASON_FORCE_RELEASED {
		t.Fatalf("got %v, %v; want lost/force-released from the new table", ev, err)
	}
}

// Across members of the shard core, ForceRelease is forwarded to the
// shard's owner like the other unary calls, where the admin check applies
// again; a Hold on the owner reports it.
func TestForceReleaseForwardedToTheOwnerEndsItsHold(t *testing.T) {
	e := startEtcdForShards(t)
	opts := func() []server.Option {
		store, _ := authStore(t, fwdPolicy, "alice", "bob", "ops")
		return []server.Option{authOption(store), server.WithMemberSecret(fwdSecret)}
	}
	a := startReplica(t, e, "/t/", "a", false, opts()...)
	b := startReplica(t, e, "/t/", "b", false, opts()...)
	waitSplit(t, []*fwdReplica{a, b})
	ctx := ctxT(t, 30*time.Second)
	name := namesOn(t, b, "jobs/", 1)[0]
	eventually(t, 15*time.Second, "the owner serves the name's shard", func() bool {
		_, err := b.coord.Shards().Validate(name, 1)
		return err == nil
	})

	st, err := b.lc.Hold(as(ctx, "alice"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(holdAcquire(name, 30*time.Second, false)); err != nil {
		t.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil || r.GetGranted() == nil {
		t.Fatalf("Hold on the owner: %v, %v", r, err)
	}
	g := r.GetGranted()
	if _, err := a.lc.ForceRelease(as(ctx, "alice"), &coordinatorv1.ForceReleaseRequest{Name: name, Token: g.Token}); code(err) != codes.PermissionDenied {
		t.Fatalf("ForceRelease by a non-admin through A: %v, want PERMISSION_DENIED", err)
	}
	fr, err := a.lc.ForceRelease(as(ctx, "ops"), &coordinatorv1.ForceReleaseRequest{Name: name, Token: g.Token})
	if err != nil || !fr.GetReleased() {
		t.Fatalf("ForceRelease by an admin through A = %v, %v", fr, err)
	}
	if ev, err := st.Recv(); err != nil || ev.GetLost().GetReason() != coordinatorv1.HoldLost_REASON_FORCE_RELEASED {
		t.Fatalf("the Hold on the owner got %v, %v; want lost/force-released", ev, err)
	}
	fr, err = a.lc.ForceRelease(as(ctx, "ops"), &coordinatorv1.ForceReleaseRequest{Name: name, Token: g.Token})
	if err != nil || fr.GetReleased() {
		t.Fatalf("ForceRelease of the stale token through A = %v, %v; want released=false", fr, err)
	}
}
