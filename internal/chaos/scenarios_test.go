package chaos_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/chaos"
)

// pause sleeps d unless ctx ends first; it reports whether ctx is still on.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// scale shortens a scenario under the race detector (slower by ~5x).
func scale(d time.Duration) time.Duration {
	if raceEnabled {
		return d * 3 / 4
	}
	return d
}

// scenario skips a fault scenario in -short runs and, unless light, under
// the race detector: make test runs every scenario in its race-free pass,
// and only the light ones (which still exercise the whole harness) again
// with -race, to keep CI within its budget.
func scenario(t *testing.T, light bool) {
	t.Helper()
	if testing.Short() {
		t.Skip("fault scenario: not in -short runs")
	}
	if raceEnabled && !light {
		t.Skip("heavy fault scenario: runs in the race-free pass of make test")
	}
}

func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not true after %v: %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestEtcdLeaderKillAndRestart(t *testing.T) {
	scenario(t, true)
	e := newEnv(t, 2)
	run{d: scale(14 * time.Second), pauseOneIn: 3, wantStale: true}.exec(t, e, func(ctx context.Context, _ *chaos.Workload) {
		for range 2 {
			if !pause(ctx, 2*time.Second) {
				return
			}
			l, err := e.Cluster.KillLeader()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("killed leader m%d", l)
			if !pause(ctx, 2*time.Second) {
				return
			}
			if err := e.Cluster.RestartMember(l); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestEtcdFollowerKill(t *testing.T) {
	scenario(t, false)
	e := newEnv(t, 2)
	run{d: scale(10 * time.Second), pauseOneIn: 3, wantStale: true}.exec(t, e, func(ctx context.Context, _ *chaos.Workload) {
		if !pause(ctx, 2*time.Second) {
			return
		}
		l, err := e.Cluster.WaitLeader(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		f := (l + 1) % e.Cluster.Size()
		e.Cluster.KillMember(f)
		t.Logf("killed follower m%d", f)
		if !pause(ctx, 4*time.Second) {
			return
		}
		if err := e.Cluster.RestartMember(f); err != nil {
			t.Fatal(err)
		}
	})
}

// TestQuorumLoss: while two of three members are down, no Acquire succeeds
// and no token is called valid; after recovery the service works again.
func TestQuorumLoss(t *testing.T) {
	scenario(t, false)
	e := newEnv(t, 2)
	var lost, back int64
	res := run{d: scale(18 * time.Second), names: []string{"a", "b", "c"}, pauseOneIn: 4, wantStale: true}.exec(t, e, func(ctx context.Context, w *chaos.Workload) {
		if !pause(ctx, 3*time.Second) {
			return
		}
		start := w.Rec.Now()
		killed := e.Cluster.LoseQuorum()
		lost = w.Rec.Now()
		t.Logf("killed %v in %v: no quorum", killed, time.Duration(lost-start))
		if !pause(ctx, 6*time.Second) {
			return
		}
		back = w.Rec.Now()
		if err := e.Cluster.Recover(); err != nil {
			t.Fatal(err)
		}
	})
	if lost == 0 || back == 0 {
		t.Fatal("the fault did not run")
	}
	inside, grantsAfter := 0, 0
	for _, op := range res.ops {
		if op.Call > lost && op.Return < back {
			inside++
			if op.Outcome == chaos.OK && (op.Kind == chaos.Acquire || op.Kind == chaos.Validate) {
				t.Errorf("while quorumless: %v", op)
			}
		}
		if op.Call > back && op.Kind == chaos.Acquire && op.Outcome == chaos.OK {
			grantsAfter++
		}
	}
	t.Logf("%d ops inside the quorumless window, %d grants after recovery", inside, grantsAfter)
	if inside == 0 {
		t.Fatal("void run: no operation ran while quorumless")
	}
	if grantsAfter == 0 {
		t.Fatal("no grant after recovery")
	}
}

// TestFullClusterRestart: every member stops and starts on its data; tokens
// granted after are greater than every token granted before.
func TestFullClusterRestart(t *testing.T) {
	scenario(t, false)
	e := newEnv(t, 2)
	var before, after int64
	res := run{d: scale(14 * time.Second), pauseOneIn: 4, wantStale: true}.exec(t, e, func(ctx context.Context, w *chaos.Workload) {
		if !pause(ctx, 4*time.Second) {
			return
		}
		before = w.Rec.Now()
		if err := e.Cluster.RestartAll(); err != nil {
			t.Fatal(err)
		}
		after = w.Rec.Now()
		t.Logf("cluster restarted in %v", time.Duration(after-before))
	})
	var maxBefore, minAfter int64
	for _, op := range res.ops {
		if op.Kind != chaos.Acquire || op.Outcome != chaos.OK {
			continue
		}
		if op.Return < before {
			maxBefore = max(maxBefore, op.Token)
		}
		if op.Call > after && (minAfter == 0 || op.Token < minAfter) {
			minAfter = op.Token
		}
	}
	if maxBefore == 0 || minAfter == 0 {
		t.Fatalf("void run: grants before %d, after %d", maxBefore, minAfter)
	}
	if minAfter <= maxBefore {
		t.Fatalf("token %d granted after the restart is not above %d granted before", minAfter, maxBefore)
	}
}

// TestReplicaPartitionedFromEtcd: a holder's replica loses etcd for longer
// than the TTL; the lock passes to a client of the other replica; the old
// holder's writes are refused, during and after the partition.
func TestReplicaPartitionedFromEtcd(t *testing.T) {
	scenario(t, true)
	e := newEnv(t, 2)
	run{d: scale(14 * time.Second), names: []string{"a"}, pauseOneIn: 4, wantStale: true}.exec(t, e, func(ctx context.Context, w *chaos.Workload) {
		work := context.WithoutCancel(ctx)
		holder, other := w.Client(1000, "p"), w.Client(1001, "p")
		holder.Use(0)
		other.Use(1)
		other.Wait = 15 * time.Second
		g, ok := holder.Acquire(work)
		if !ok || !holder.Write(work, g.GetToken(), false) {
			t.Fatal("holder could not acquire and write before the fault")
		}
		e.Replicas[0].PartitionFromEtcd()
		if holder.KeepAlive(work, g) == chaos.OK {
			t.Fatal("renewed through a replica cut off from etcd")
		}
		holder.Use(0) // the failed call moved it on; stay on the partitioned replica
		g2, out := other.AcquireID(work, chaos.RequestID(), 1)
		if out != chaos.OK || g2.GetToken() <= g.GetToken() {
			t.Fatalf("other replica: %v token %d after %d", out, g2.GetToken(), g.GetToken())
		}
		if !other.Write(work, g2.GetToken(), false) {
			t.Fatal("the new holder's write was refused")
		}
		if holder.Write(work, g.GetToken(), true) {
			t.Fatal("stale write accepted during the partition")
		}
		e.Replicas[0].Heal()
		eventually(t, 30*time.Second, "partitioned replica serves again", func() bool {
			_, err := e.Replicas[0].Client().ValidateToken(work, &coordinatorv1.ValidateTokenRequest{Name: "p", Token: g.GetToken()})
			return err == nil
		})
		holder.Use(0)
		if holder.Write(work, g.GetToken(), true) {
			t.Fatal("stale write accepted after the partition healed")
		}
		other.Release(work, chaos.Release, g2.GetToken(), g2.GetHandle())
	})
}

// TestReplicaCrashMidAcquire: a waiter's replica crashes during its Acquire;
// the retry with the same request id on the other replica ends with one
// grant, never two.
func TestReplicaCrashMidAcquire(t *testing.T) {
	scenario(t, false)
	e := newEnv(t, 2)
	run{d: scale(10 * time.Second), names: []string{"a"}, pauseOneIn: 4, wantStale: true}.exec(t, e, func(ctx context.Context, w *chaos.Workload) {
		work := context.WithoutCancel(ctx)
		blocker, waiter := w.Client(1000, "m"), w.Client(1001, "m")
		blocker.Use(1)
		gb, ok := blocker.Acquire(work)
		if !ok {
			t.Fatal("blocker not granted")
		}
		waiter.Use(0)
		waiter.Wait = 20 * time.Second
		rid := chaos.RequestID()
		first := make(chan chaos.Outcome, 1)
		go func() {
			_, out := waiter.AcquireID(work, rid, 1)
			first <- out
		}()
		eventually(t, 20*time.Second, "the waiter is queued", func() bool {
			n, err := e.CountKeys(work, "locks/m/")
			return err == nil && n == 2
		})
		e.Replicas[0].Crash()
		if out := <-first; out == chaos.OK {
			t.Fatal("granted through a crashed replica")
		}
		blocker.Release(work, chaos.Release, gb.GetToken(), gb.GetHandle())
		waiter.Use(1)
		g, out := waiter.AcquireID(work, rid, 3)
		if out != chaos.OK {
			t.Fatalf("retry with the same request id: %v", out)
		}
		eventually(t, 20*time.Second, "one queue key: the retry's grant", func() bool {
			n, err := e.CountKeys(work, "locks/m/")
			return err == nil && n == 1
		})
		if ok, _ := waiter.Validate(work, "m", g.GetToken()); !ok {
			t.Fatal("the retry's token is not valid")
		}
		waiter.Release(work, chaos.Release, g.GetToken(), g.GetHandle())
		if err := e.Replicas[0].Restart(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestClientDisconnectDuringHold: the connection of a Hold stream drops
// without a release; the lock passes on (by expiry, or at once with
// release_on_disconnect) and the vanished holder's token is refused.
func TestClientDisconnectDuringHold(t *testing.T) {
	scenario(t, true)
	for _, rod := range []bool{false, true} {
		t.Run(map[bool]string{false: "expiry", true: "release_on_disconnect"}[rod], func(t *testing.T) {
			e := newEnv(t, 2)
			w := &chaos.Workload{Replicas: clients(e), Rec: chaos.NewRecorder(), Reg: chaos.NewRegister()}
			ctx := context.Background()
			holder, other := w.Client(1000, "h"), w.Client(1001, "h")
			other.Use(1)
			other.Wait = 15 * time.Second
			conn, err := grpc.NewClient(e.Replicas[0].Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			call := w.Rec.Now()
			st, err := coordinatorv1.NewLockServiceClient(conn).Hold(sctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Acquire{Acquire: &coordinatorv1.HoldAcquire{
				Request:             &coordinatorv1.AcquireRequest{Name: "h", Ttl: durationpb.New(2 * time.Second)},
				ReleaseOnDisconnect: rod,
			}}}); err != nil {
				t.Fatal(err)
			}
			m, err := st.Recv()
			if err != nil || m.GetGranted() == nil {
				t.Fatalf("hold: %v %v", m, err)
			}
			tok := m.GetGranted().GetToken()
			w.Rec.Add(chaos.Op{Client: 1000, Name: "h", Kind: chaos.Acquire, Token: tok, Outcome: chaos.OK, Call: call, Return: w.Rec.Now()})
			if !holder.Write(ctx, tok, false) {
				t.Fatal("holder's write refused")
			}
			conn.Close() // the client vanishes: no release, no more heartbeats
			g2, out := other.AcquireID(ctx, chaos.RequestID(), 1)
			if out != chaos.OK || g2.GetToken() <= tok {
				t.Fatalf("after the disconnect: %v token %d after %d", out, g2.GetToken(), tok)
			}
			if !other.Write(ctx, g2.GetToken(), false) {
				t.Fatal("new holder's write refused")
			}
			if holder.Write(ctx, tok, true) {
				t.Fatal("the disconnected holder's stale write was accepted")
			}
			other.Release(ctx, chaos.Release, g2.GetToken(), g2.GetHandle())
			check(t, w, true)
		})
	}
}
