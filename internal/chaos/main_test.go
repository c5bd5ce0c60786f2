package chaos_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/chaos"
)

func TestMain(m *testing.M) {
	if os.Getenv(shardChildEnv) != "" {
		shardChildMain() // the test binary as a shard-core member process
		return
	}
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/logutil.(*MergeLogger).outputLoop"),
		// The peer HTTP connections of killed etcd members wind down
		// asynchronously (rafthttp); this package itself uses no net/http.
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
	)
}

// newEnv starts a 3-member cluster and n replicas, stopped at cleanup.
func newEnv(t *testing.T, replicas int) *chaos.Env {
	t.Helper()
	e, err := chaos.NewEnv(t.TempDir(), replicas)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

func clients(e *chaos.Env) []coordinatorv1.LockServiceClient {
	out := make([]coordinatorv1.LockServiceClient, len(e.Replicas))
	for i, r := range e.Replicas {
		out[i] = r.Client()
	}
	return out
}

// run is one scenario: the workload runs for d while fault runs alongside
// (fault gets a context that ends with the run); then both checkers judge
// the history. It fails the test on any violation or unknown verdict, and
// when wantStale is set, when no stale write was refused (a void run).
type run struct {
	names      []string
	perName    int
	d          time.Duration // how long the workload runs (shortened under -race)
	pauseOneIn int
	wantStale  bool
	seed       uint64
	// after: the workload runs at least this long after the fault function
	// returns (a slow fault, such as a full cluster restart on a loaded
	// machine, must still leave time to observe the recovery).
	after time.Duration
	// kinds makes names semaphores or read-write locks (Workload.Kinds).
	kinds map[string]chaos.NameKind
	// restores, if set, is where the fault records its restores of etcd
	// from a backup, for the checkers (CheckRestores, CheckSafeUntil).
	restores *[]chaos.Restore
	// shardCore: the replicas run the shard-owner core: no watchers (no
	// Watch served yet), Hold streams sent to the owner of their name's
	// shard, and the end checks of survivedShards instead of survived.
	shardCore bool
}

type result struct {
	verdict chaos.Verdict
	reg     chaos.RegisterReport
	ops     []chaos.Op
}

func (r run) exec(t *testing.T, e *chaos.Env, fault func(ctx context.Context, w *chaos.Workload)) result {
	t.Helper()
	if r.names == nil {
		r.names = []string{"a", "b"}
	}
	if r.perName == 0 {
		r.perName = 3
	}
	w := &chaos.Workload{Replicas: clients(e), Names: r.names, ClientsPerName: r.perName, PauseOneIn: r.pauseOneIn, Seed: r.seed,
		Compacted: e.Compactor.Compacted, Kinds: r.kinds}
	if r.shardCore && r.seed%2 == 0 { // half the runs open Hold streams on the owner, half wherever (relayed)
		w.HoldOn = holdOnOwner(e)
	}
	if r.after == 0 {
		r.after = 4 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	defer cancel()
	end := time.Now().Add(r.d)
	fctx, fcancel := context.WithDeadline(ctx, end)
	defer fcancel()
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	if fault != nil {
		fault(fctx, w)
		if late := time.Now().Add(r.after); late.After(end) {
			end = late
		}
	}
	time.Sleep(time.Until(end))
	cancel()
	<-done
	var restores []chaos.Restore
	if r.restores != nil {
		restores = *r.restores
	}
	res := check(t, w, r.wantStale, restores...)
	if r.shardCore {
		survivedShards(t, e)
	} else {
		survived(t, e)
	}
	return res
}

// survived checks that the watch paths came through the faults and the
// compaction: every running replica's holder view follows etcd again, and
// a grant made and released through each replica is reported by every
// running replica's lock-end watch.
func survived(t *testing.T, e *chaos.Env) {
	t.Helper()
	ctx := context.Background()
	var running []*chaos.Replica
	for _, r := range e.Replicas {
		if r.Running() {
			running = append(running, r)
		}
	}
	eventually(t, 30*time.Second, "every holder view follows etcd", func() bool {
		for _, r := range running {
			if !r.Following() {
				return false
			}
		}
		return true
	})
	for _, r := range running {
		var g *coordinatorv1.AcquireResponse
		eventually(t, 30*time.Second, fmt.Sprintf("a grant through replica %d", r.ID), func() bool {
			var err error
			g, err = r.Client().Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "probe", Ttl: durationpb.New(5 * time.Second), Wait: durationpb.New(5 * time.Second)})
			return err == nil
		})
		if rr, err := r.Client().Release(ctx, &coordinatorv1.ReleaseRequest{Name: "probe", Token: g.GetToken(), Handle: g.GetHandle()}); err != nil || !rr.GetReleased() {
			t.Fatalf("probe release through replica %d: %v %v", r.ID, rr, err)
		}
		for _, o := range running {
			eventually(t, 15*time.Second, fmt.Sprintf("replica %d's lock-end watch reports the probe's end (token %d)", o.ID, g.GetToken()), func() bool {
				return o.SawEnd("probe", g.GetToken())
			})
		}
	}
	t.Logf("compaction: %d compactions, up to revision %d; replica warnings: %v", e.Compactor.Runs(), e.Compactor.Compacted(), warnings(running))
}

func warnings(rs []*chaos.Replica) map[string]int {
	all := map[string]int{}
	for _, r := range rs {
		for k, v := range r.Events.Counts() {
			all[k] += v
		}
	}
	return all
}

func check(t *testing.T, w *chaos.Workload, wantStale bool, restores ...chaos.Restore) result {
	t.Helper()
	ops := w.Rec.Ops()
	v := chaos.CheckLinearizable(ops, 2*time.Minute)
	reg := chaos.CheckRegister(w.Reg.Writes())
	wr := w.Watches()
	if wr.Streams > 0 || w.Holds() > 0 {
		t.Logf("hold: %d rounds on Hold streams; watch: %d streams (%d resumed from a revision, %d OUT_OF_RANGE, %d of them from a compacted revision), %d events, %d violations",
			w.Holds(), wr.Streams, wr.Resumes, wr.OutOfRange, wr.CompactedProbes, wr.Events, len(wr.Violations))
	}
	t.Logf("checked %d ops (%d ambiguous, %d grants): %s; register: %d writes, %d accepted, %d rejected, stale %d/%d rejected, %d violations",
		v.Ops, v.Ambiguous, v.Grants, v.Result, reg.Writes, reg.Accepted, reg.Rejected, reg.StaleRejected, reg.StaleAttempts, len(reg.Violations))
	if err := v.Err(); err != nil {
		for _, op := range ops {
			t.Log(op)
		}
		t.Fatal(err)
	}
	if len(reg.Violations) > 0 {
		t.Fatalf("register violations: %v", reg.Violations)
	}
	// The promises every scenario keeps, whatever the fault: a grant is
	// never taken away inside its safe_until, and no call answers INTERNAL
	// or UNKNOWN; and across a restore of etcd from a backup, no token of
	// before it is good after it.
	for _, c := range []struct {
		what string
		bad  []string
	}{
		{"grants taken away inside their safe_until", chaos.CheckSafeUntil(ops, restores...)},
		{"tokens across a restore", chaos.CheckRestores(ops, restores)},
		{"calls answered INTERNAL or UNKNOWN", chaos.CheckAnswers(ops)},
		{"Watch streams", wr.Violations},
	} {
		for _, b := range c.bad {
			t.Errorf("%s: %s", c.what, b)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	if v.Grants == 0 {
		t.Fatal("void run: no grant at all")
	}
	if wr.Streams > 0 && wr.CompactedProbes == 0 {
		t.Fatal("void run: no Watch from a compacted start_revision was answered OUT_OF_RANGE")
	}
	if wantStale && reg.StaleRejected == 0 {
		t.Fatalf("void run: the fault was meant to cause a stale write, but none was refused (%d paused holders)", w.Paused())
	}
	return result{verdict: v, reg: reg, ops: ops}
}
