package chaos_test

import (
	"context"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/chaos"
)

// h builds a sequential history on name "x": each op takes [10i, 10i+5].
func h(ops ...chaos.Op) []chaos.Op {
	for i := range ops {
		ops[i].Name = "x"
		ops[i].Call, ops[i].Return = int64(10*i), int64(10*i+5)
	}
	return ops
}

func acq(c int, tok int64) chaos.Op {
	return chaos.Op{Client: c, Kind: chaos.Acquire, Token: tok, Outcome: chaos.OK}
}
func op(c int, k chaos.Kind, tok int64, o chaos.Outcome) chaos.Op {
	return chaos.Op{Client: c, Kind: k, Token: tok, Outcome: o}
}

// TestCheckerCatchesFaultyHistories runs the checker on recorded histories
// of deliberately broken builds: each must be Illegal. The legal ones next
// to them show the model is not simply strict.
func TestCheckerCatchesFaultyHistories(t *testing.T) {
	for _, tc := range []struct {
		name string
		ops  []chaos.Op
		want porcupine.CheckResult
	}{
		{"legal hand-off with expiry", h(acq(1, 10), op(1, chaos.Validate, 10, chaos.OK), acq(2, 12), op(1, chaos.Validate, 10, chaos.Failed), op(1, chaos.Release, 10, chaos.Failed), op(2, chaos.Release, 12, chaos.OK)), porcupine.Ok},
		{"legal: ambiguous ops have any outcome", h(acq(1, 10), op(1, chaos.Release, 10, chaos.Ambiguous), op(2, chaos.Acquire, 0, chaos.Ambiguous), acq(2, 15), op(2, chaos.Validate, 15, chaos.OK)), porcupine.Ok},
		{"legal: an ambiguous release may have done nothing, and its retry releases", h(acq(1, 10), op(1, chaos.Release, 10, chaos.Ambiguous), op(1, chaos.Validate, 10, chaos.OK), op(1, chaos.Release, 10, chaos.OK)), porcupine.Ok},
		{"an ambiguous release brings no released token back", h(acq(1, 10), op(1, chaos.Release, 10, chaos.OK), op(1, chaos.Release, 10, chaos.Ambiguous), op(1, chaos.Validate, 10, chaos.OK)), porcupine.Illegal},
		// A validation that skips the holder check: the superseded token 10
		// is called valid after 12 was granted.
		{"valid for a superseded token", h(acq(1, 10), acq(2, 12), op(1, chaos.Validate, 10, chaos.OK)), porcupine.Illegal},
		// Tokens taken from the lease id: not increasing per name.
		{"tokens not increasing", h(acq(1, 7_000_000_001), op(1, chaos.Release, 7_000_000_001, chaos.OK), acq(2, 6_999_000_000)), porcupine.Illegal},
		{"same token granted twice", h(acq(1, 10), acq(2, 10)), porcupine.Illegal},
		{"valid after the holder saw it expire", h(acq(1, 10), op(1, chaos.KeepAlive, 10, chaos.Failed), op(2, chaos.Validate, 10, chaos.OK)), porcupine.Illegal},
		{"released with someone else's token", h(acq(1, 10), op(2, chaos.ReleaseOther, 10, chaos.OK)), porcupine.Illegal},
		{"renewed after release", h(acq(1, 10), op(1, chaos.Release, 10, chaos.OK), op(1, chaos.KeepAlive, 10, chaos.OK)), porcupine.Illegal},
		{"valid after release, even if that release's answer was lost", h(acq(1, 10), op(1, chaos.Release, 10, chaos.OK), op(1, chaos.Validate, 10, chaos.OK)), porcupine.Illegal},
		{"resource: valid for the holder advances the mark", h(acq(1, 10), op(1, chaos.ValidateResource, 10, chaos.OK), op(1, chaos.Release, 10, chaos.OK), acq(2, 12), op(2, chaos.ValidateResource, 12, chaos.OK), op(1, chaos.ValidateResource, 10, chaos.Failed)), porcupine.Ok},
		{"resource: valid for a superseded token", h(acq(1, 10), acq(2, 12), op(2, chaos.ValidateResource, 12, chaos.OK), op(1, chaos.ValidateResource, 10, chaos.OK)), porcupine.Illegal},
		{"valid while never granted", h(op(1, chaos.Validate, 10, chaos.OK)), porcupine.Illegal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := chaos.CheckLinearizable(tc.ops, 10*time.Second)
			if v.Result != tc.want {
				t.Fatalf("verdict %s, want %s", v.Result, tc.want)
			}
			if (v.Err() == nil) != (tc.want == porcupine.Ok) {
				t.Fatalf("Err() = %v for %s", v.Err(), v.Result)
			}
		})
	}
}

// sem is an acquisition of a semaphore of limit n; rd a reader's.
func sem(c int, tok int64, n int32) chaos.Op {
	o := acq(c, tok)
	o.Limit = n
	return o
}
func rd(c int, tok int64) chaos.Op {
	o := acq(c, tok)
	o.Shared = true
	return o
}

// TestCheckerSemaphoresAndReadWriteLocks: the model's N holders and shared
// holders, on histories a correct and a broken coordinator would record.
func TestCheckerSemaphoresAndReadWriteLocks(t *testing.T) {
	for _, tc := range []struct {
		name string
		ops  []chaos.Op
		want porcupine.CheckResult
	}{
		{"semaphore: three holders of 3, all valid", h(sem(1, 10, 3), sem(2, 11, 3), sem(3, 12, 3), op(1, chaos.Validate, 10, chaos.OK), op(2, chaos.Validate, 11, chaos.OK), op(3, chaos.KeepAlive, 12, chaos.OK)), porcupine.Ok},
		{"semaphore: a fourth holder of 3 while all three hold", h(sem(1, 10, 3), sem(2, 11, 3), sem(3, 12, 3), sem(4, 13, 3), op(1, chaos.Validate, 10, chaos.OK), op(2, chaos.Validate, 11, chaos.OK), op(3, chaos.Validate, 12, chaos.OK)), porcupine.Illegal},
		{"semaphore: a fourth after one expired", h(sem(1, 10, 3), sem(2, 11, 3), sem(3, 12, 3), sem(4, 13, 3), op(2, chaos.Validate, 11, chaos.OK), op(3, chaos.Validate, 12, chaos.OK), op(4, chaos.Validate, 13, chaos.OK)), porcupine.Ok},
		{"semaphore: grants out of token order", h(sem(1, 12, 3), sem(2, 11, 3)), porcupine.Illegal},
		{"readers overlap", h(rd(1, 10), rd(2, 11), op(1, chaos.Validate, 10, chaos.OK), op(2, chaos.Validate, 11, chaos.OK)), porcupine.Ok},
		{"a writer beside a reader", h(rd(1, 10), acq(2, 11), op(1, chaos.Validate, 10, chaos.OK), op(2, chaos.Validate, 11, chaos.OK)), porcupine.Illegal},
		{"a reader beside a writer", h(acq(1, 10), rd(2, 11), op(1, chaos.Validate, 10, chaos.OK)), porcupine.Illegal},
		{"a reader below the last writer", h(acq(1, 10), op(1, chaos.Release, 10, chaos.OK), rd(2, 9)), porcupine.Illegal},
		{"a reader's token raising a mark", h(rd(1, 10), op(1, chaos.ValidateResource, 10, chaos.OK)), porcupine.Illegal},
		{"a writer after the readers left raises the mark", h(rd(1, 10), rd(2, 11), op(1, chaos.Release, 10, chaos.OK), op(2, chaos.Release, 11, chaos.OK), acq(3, 12), op(3, chaos.ValidateResource, 12, chaos.OK)), porcupine.Ok},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if v := chaos.CheckLinearizable(tc.ops, 10*time.Second); v.Result != tc.want {
				t.Fatalf("verdict %s, want %s", v.Result, tc.want)
			}
		})
	}
}

// TestCheckerConcurrentOverlap: overlapping calls may be ordered either way.
func TestCheckerConcurrentOverlap(t *testing.T) {
	ops := []chaos.Op{
		{Client: 1, Name: "x", Kind: chaos.Acquire, Token: 10, Outcome: chaos.OK, Call: 0, Return: 5},
		// Validate of 10 overlaps the grant of 12: valid is legal.
		{Client: 1, Name: "x", Kind: chaos.Validate, Token: 10, Outcome: chaos.OK, Call: 10, Return: 30},
		{Client: 2, Name: "x", Kind: chaos.Acquire, Token: 12, Outcome: chaos.OK, Call: 12, Return: 20},
		// A different name is independent.
		{Client: 3, Name: "y", Kind: chaos.Acquire, Token: 11, Outcome: chaos.OK, Call: 0, Return: 40},
	}
	if v := chaos.CheckLinearizable(ops, 10*time.Second); v.Err() != nil {
		t.Fatal(v.Err())
	}
	ops[1].Call = 21 // now strictly after the grant of 12
	if v := chaos.CheckLinearizable(ops, 10*time.Second); v.Result != porcupine.Illegal {
		t.Fatalf("verdict %s, want Illegal", v.Result)
	}
}

func TestUnknownIsFailure(t *testing.T) {
	if (chaos.Verdict{Result: porcupine.Unknown}).Err() == nil {
		t.Fatal("an unknown verdict passed")
	}
}

func TestRegisterCheckerCatchesFaultyWrites(t *testing.T) {
	good := []chaos.Write{
		{Name: "x", Token: 10, Valid: true, Accepted: true},
		{Name: "x", Token: 12, Valid: true, Accepted: true, HighWater: 10},
		{Name: "x", Token: 10, Stale: true, HighWater: 12},
	}
	if rep := chaos.CheckRegister(good); len(rep.Violations) != 0 || rep.StaleRejected != 1 {
		t.Fatalf("legal writes: %+v", rep)
	}
	for name, ws := range map[string][]chaos.Write{
		"accepted below": {{Name: "x", Token: 12, Valid: true, Accepted: true}, {Name: "x", Token: 10, Valid: true, Accepted: true, HighWater: 12}},
		"valid below":    {{Name: "x", Token: 12, Valid: true, Accepted: true}, {Name: "x", Token: 10, Valid: true, Stale: true, HighWater: 12}},
	} {
		if rep := chaos.CheckRegister(ws); len(rep.Violations) != 1 {
			t.Errorf("%s: %d violations, want 1", name, len(rep.Violations))
		}
	}
}

// skipHolderCheck is a deliberately broken build: ValidateToken answers
// valid for a superseded token (it skips the holder check and the
// resource's mark).
func skipHolderCheck(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if v, ok := resp.(*coordinatorv1.ValidateTokenResponse); ok && (v.GetReason() == coordinatorv1.ValidateTokenResponse_REASON_SUPERSEDED || v.GetReason() == coordinatorv1.ValidateTokenResponse_REASON_FENCED) {
		v.Valid = true
	}
	return resp, err
}

// TestCheckersCatchBrokenBuild runs the workload against replicas with the
// broken validation: the recorded history must be judged not linearizable
// and the register must report the stale token it was told was valid.
func TestCheckersCatchBrokenBuild(t *testing.T) {
	scenario(t, true)
	e, err := chaos.NewEnv(t.TempDir(), 2, grpc.ChainUnaryInterceptor(skipHolderCheck))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	w := &chaos.Workload{Replicas: clients(e), Names: []string{"a"}, ClientsPerName: 3, PauseOneIn: 2}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w.Run(ctx)
	v := chaos.CheckLinearizable(w.Rec.Ops(), time.Minute)
	reg := chaos.CheckRegister(w.Reg.Writes())
	t.Logf("broken build: %d ops: %s; register violations: %v", v.Ops, v.Result, reg.Violations)
	if v.Result != porcupine.Illegal {
		t.Fatalf("verdict %s on the broken build, want Illegal", v.Result)
	}
	if len(reg.Violations) == 0 {
		t.Fatal("the register checker missed the broken build")
	}
}

// TestSafeUntilCheckerCatchesEarlyEnds: a grant given while an earlier one
// is inside its safe_until (extended by a renewal) is reported, unless the
// earlier holder released first or its safe_until had passed.
func TestSafeUntilCheckerCatchesEarlyEnds(t *testing.T) {
	granted := func(c int, tok, ret, safe int64) chaos.Op {
		return chaos.Op{Client: c, Name: "x", Kind: chaos.Acquire, Token: tok, Outcome: chaos.OK, Call: ret - 1, Return: ret, SafeUntil: safe}
	}
	renewed := func(c int, tok, ret, safe int64) chaos.Op {
		return chaos.Op{Client: c, Name: "x", Kind: chaos.KeepAlive, Token: tok, Outcome: chaos.OK, Call: ret - 1, Return: ret, SafeUntil: safe}
	}
	released := func(c int, tok, call int64, out chaos.Outcome) chaos.Op {
		return chaos.Op{Client: c, Name: "x", Kind: chaos.Release, Token: tok, Outcome: out, Call: call, Return: call + 1}
	}
	s := int64(time.Second)
	for _, tc := range []struct {
		name     string
		ops      []chaos.Op
		bad      int
		restores []chaos.Restore
	}{
		{"after safe_until", []chaos.Op{granted(1, 10, 0, 2*s), granted(2, 12, 3*s, 5*s)}, 0, nil},
		{"inside safe_until", []chaos.Op{granted(1, 10, 0, 2*s), granted(2, 12, s, 5*s)}, 1, nil},
		{"inside a renewal's safe_until", []chaos.Op{granted(1, 10, 0, 2*s), renewed(1, 10, s, 3*s), granted(2, 12, 5*s/2, 5*s)}, 1, nil},
		{"after a release", []chaos.Op{granted(1, 10, 0, 2*s), released(1, 10, s/2, chaos.OK), granted(2, 12, s, 5*s)}, 0, nil},
		{"released only after the later grant", []chaos.Op{granted(1, 10, 0, 2*s), granted(2, 12, s, 5*s), released(1, 10, 3*s/2, chaos.Failed)}, 1, nil},
		{"after an ambiguous release", []chaos.Op{granted(1, 10, 0, 2*s), released(1, 10, s/2, chaos.Ambiguous), granted(2, 12, s, 5*s)}, 0, nil},
		{"after someone else's release", []chaos.Op{granted(1, 10, 0, 2*s), released(3, 10, s/2, chaos.Failed), granted(2, 12, s, 5*s)}, 1, nil},
		{"a retry's answer of the same grant", []chaos.Op{granted(1, 10, 0, 2*s), granted(1, 10, s, 3*s)}, 0, nil},
		{"another name", []chaos.Op{granted(1, 10, 0, 2*s), {Client: 2, Name: "y", Kind: chaos.Acquire, Token: 12, Outcome: chaos.OK, Return: s, SafeUntil: 5 * s}}, 0, nil},
		{"a restore between them", []chaos.Op{granted(1, 10, 0, 2*s), granted(2, 12, s, 5*s)}, 0, []chaos.Restore{{Start: s / 4, End: s / 2}}},
		{"a restore before both", []chaos.Op{granted(1, 10, s/2, 2*s), granted(2, 12, s, 5*s)}, 1, []chaos.Restore{{Start: s / 8, End: s / 4}}},
		{"a restore after both", []chaos.Op{granted(1, 10, 0, 2*s), granted(2, 12, s, 5*s)}, 1, []chaos.Restore{{Start: 3 * s / 2, End: 2 * s}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if bad := chaos.CheckSafeUntil(tc.ops, tc.restores...); len(bad) != tc.bad {
				t.Fatalf("%d violations, want %d: %v", len(bad), tc.bad, bad)
			}
		})
	}
}

// TestRestoreCheckerCatchesOldTokens: after a restore began, an OK answer
// about a token granted before it, or a grant not above every earlier
// token, is reported; negative answers, and answers before the restore,
// are not.
func TestRestoreCheckerCatchesOldTokens(t *testing.T) {
	s := int64(time.Second)
	granted := func(name string, tok, call int64) chaos.Op {
		return chaos.Op{Name: name, Kind: chaos.Acquire, Token: tok, Outcome: chaos.OK, Call: call, Return: call + 1}
	}
	on := func(k chaos.Kind, tok, call int64, out chaos.Outcome) chaos.Op {
		return chaos.Op{Name: "x", Kind: k, Token: tok, Outcome: out, Call: call, Return: call + 1}
	}
	restore := []chaos.Restore{{Start: 2 * s, End: 3 * s}}
	next := int64(1)<<48 + 5
	for _, tc := range []struct {
		name string
		ops  []chaos.Op
		bad  int
	}{
		{"refused after", []chaos.Op{granted("x", 10, s), on(chaos.Validate, 10, 4*s, chaos.Failed), on(chaos.KeepAlive, 10, 4*s, chaos.Failed)}, 0},
		{"valid before", []chaos.Op{granted("x", 10, s), on(chaos.Validate, 10, 3*s/2, chaos.OK)}, 0},
		{"valid after", []chaos.Op{granted("x", 10, s), on(chaos.Validate, 10, 4*s, chaos.OK)}, 1},
		{"valid during", []chaos.Op{granted("x", 10, s), on(chaos.ValidateResource, 10, 5*s/2, chaos.OK)}, 1},
		{"renewed after", []chaos.Op{granted("x", 10, s), on(chaos.KeepAlive, 10, 4*s, chaos.OK)}, 1},
		{"released after", []chaos.Op{granted("x", 10, s), on(chaos.Release, 10, 4*s, chaos.OK)}, 1},
		{"a new epoch's token", []chaos.Op{granted("x", 10, s), granted("x", next, 4*s), on(chaos.Validate, next, 5*s, chaos.OK)}, 0},
		{"a token not above the old ones", []chaos.Op{granted("x", 10, s), granted("y", 20, s), granted("x", 15, 4*s)}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if bad := chaos.CheckRestores(tc.ops, restore); len(bad) != tc.bad {
				t.Fatalf("%d violations, want %d: %v", len(bad), tc.bad, bad)
			}
		})
	}
}

// TestAnswersCheckerCatchesInternal: INTERNAL and UNKNOWN answers are
// reported, whatever the call; other codes are not.
func TestAnswersCheckerCatchesInternal(t *testing.T) {
	ops := []chaos.Op{
		{Kind: chaos.Acquire, Outcome: chaos.Ambiguous, Code: codes.Internal},
		{Kind: chaos.Watch, Outcome: chaos.Ambiguous, Code: codes.Unknown},
		{Kind: chaos.Acquire, Outcome: chaos.Ambiguous, Code: codes.Unavailable},
		{Kind: chaos.KeepAlive, Outcome: chaos.Failed, Code: codes.NotFound},
		{Kind: chaos.Validate, Outcome: chaos.OK},
	}
	if bad := chaos.CheckAnswers(ops); len(bad) != 2 {
		t.Fatalf("%d violations, want 2: %v", len(bad), bad)
	}
	if c := chaos.Code(context.DeadlineExceeded); c != codes.DeadlineExceeded {
		t.Fatalf("a caller's own deadline is %v", c)
	}
}
