package chaos_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/chaos"
)

func TestMain(m *testing.M) {
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
	w := &chaos.Workload{Replicas: clients(e), Names: r.names, ClientsPerName: r.perName, PauseOneIn: r.pauseOneIn, Seed: r.seed}
	ctx, cancel := context.WithTimeout(context.Background(), r.d)
	t.Cleanup(cancel)
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	if fault != nil {
		fault(ctx, w)
	}
	<-ctx.Done()
	<-done
	return check(t, w, r.wantStale)
}

func check(t *testing.T, w *chaos.Workload, wantStale bool) result {
	t.Helper()
	ops := w.Rec.Ops()
	v := chaos.CheckLinearizable(ops, 2*time.Minute)
	reg := chaos.CheckRegister(w.Reg.Writes())
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
	if v.Grants == 0 {
		t.Fatal("void run: no grant at all")
	}
	if wantStale && reg.StaleRejected == 0 {
		t.Fatalf("void run: the fault was meant to cause a stale write, but none was refused (%d paused holders)", w.Paused())
	}
	return result{verdict: v, reg: reg, ops: ops}
}
