package chaos_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/chaos"
)

// The counter model accepts exactly the histories in which no allowed hit
// takes a count above its limit and every answered count is consistent.
func TestCounterModel(t *testing.T) {
	hit := func(client int, out chaos.Outcome, count, call, ret int64) chaos.CounterOp {
		return chaos.CounterOp{Client: client, Name: "c", Limit: 2, Outcome: out, Count: count, Call: call, Return: ret}
	}
	for _, tc := range []struct {
		name string
		ops  []chaos.CounterOp
		want porcupine.CheckResult
	}{
		{"up to the limit, then refused", []chaos.CounterOp{hit(0, chaos.OK, 1, 0, 1), hit(1, chaos.OK, 2, 2, 3), hit(0, chaos.Failed, 2, 4, 5)}, porcupine.Ok},
		{"concurrent, either order", []chaos.CounterOp{hit(0, chaos.OK, 2, 0, 5), hit(1, chaos.OK, 1, 1, 4)}, porcupine.Ok},
		{"an ambiguous hit that counted", []chaos.CounterOp{hit(0, chaos.Ambiguous, 0, 0, 1), hit(1, chaos.OK, 2, 2, 3)}, porcupine.Ok},
		{"above the limit", []chaos.CounterOp{hit(0, chaos.OK, 1, 0, 1), hit(1, chaos.OK, 2, 2, 3), hit(2, chaos.OK, 3, 4, 5)}, porcupine.Illegal},
		{"refused below the limit", []chaos.CounterOp{hit(0, chaos.OK, 1, 0, 1), hit(1, chaos.Failed, 1, 2, 3)}, porcupine.Illegal},
		{"counted twice", []chaos.CounterOp{hit(0, chaos.OK, 1, 0, 1), hit(1, chaos.OK, 1, 2, 3)}, porcupine.Illegal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if v := chaos.CheckCounters(tc.ops, 5*time.Second); v.Result != tc.want {
				t.Fatalf("verdict %v, want %v", v.Result, tc.want)
			}
		})
	}
}

// Issue 16: hits on two replicas while etcd's leader is killed and comes
// back: the history of every counter is linearizable against the counter
// model (allowed hits per window never above the limit).
func TestCountersUnderLeaderKill(t *testing.T) {
	scenario(t, false)
	e := newEnv(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	load := startCounterLoad(t, e)
	if pause(ctx, time.Second) {
		l, err := e.Cluster.KillLeader()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("killed leader m%d", l)
		if pause(ctx, 1500*time.Millisecond) {
			if err := e.Cluster.RestartMember(l); err != nil {
				t.Fatal(err)
			}
		}
	}
	<-ctx.Done()
	load.stopAndCheck(t)
}

// counterLoad is 8 workers hitting counters through every replica of e,
// a new counter (limit 40, a window of an hour) every 400ms so that many
// fill up across the faults, each hit recorded for the counter model.
type counterLoad struct {
	start  time.Time
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	ops    []chaos.CounterOp
}

const counterLimit = 40

func startCounterLoad(t *testing.T, e *chaos.Env) *counterLoad {
	t.Helper()
	var counters []coordinatorv1.CounterServiceClient
	for _, r := range e.Replicas {
		conn, err := grpc.NewClient(r.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		counters = append(counters, coordinatorv1.NewCounterServiceClient(conn))
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &counterLoad{start: time.Now(), cancel: cancel}
	for w := range 8 {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for ctx.Err() == nil {
				l.hit(ctx, w, counters[w%len(counters)])
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	return l
}

func (l *counterLoad) hit(ctx context.Context, w int, cc coordinatorv1.CounterServiceClient) {
	name := fmt.Sprint("chaos-counter/", time.Since(l.start)/(400*time.Millisecond))
	op := chaos.CounterOp{Client: w, Name: name, Limit: counterLimit, Call: int64(time.Since(l.start))}
	hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	r, err := cc.Hit(hctx, &coordinatorv1.HitRequest{Name: name, Limit: counterLimit, Window: durationpb.New(time.Hour)})
	cancel()
	op.Return = int64(time.Since(l.start))
	switch {
	case err != nil:
		op.Outcome = chaos.Ambiguous
	case r.GetAllowed():
		op.Outcome, op.Count = chaos.OK, r.GetCount()
	default:
		op.Outcome, op.Count = chaos.Failed, r.GetCount()
	}
	l.mu.Lock()
	l.ops = append(l.ops, op)
	l.mu.Unlock()
}

// stopAndCheck stops the workers and checks their history: no counter
// allowed more than its limit, and the history is linearizable.
func (l *counterLoad) stopAndCheck(t *testing.T) chaos.Verdict {
	t.Helper()
	l.cancel()
	l.wg.Wait()
	allowed := map[string]int64{}
	for _, op := range l.ops {
		if op.Outcome == chaos.OK {
			allowed[op.Name]++
		}
	}
	for name, n := range allowed {
		if n > counterLimit {
			t.Errorf("%s: %d hits allowed, limit %d", name, n, counterLimit)
		}
	}
	v := chaos.CheckCounters(l.ops, 30*time.Second)
	t.Logf("counters: %d hits on %d counters, %d allowed, %d ambiguous", v.Ops, len(allowed), v.Grants, v.Ambiguous)
	if err := v.Err(); err != nil {
		t.Fatal(err)
	}
	return v
}
