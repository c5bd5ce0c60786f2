package chaos

import (
	"fmt"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// maxHolders bounds the holders the model tracks: the chaos workload's
// semaphores have a limit of at most maxHolders, and its read-write locks
// at most maxHolders readers per name (ClientsPerName).
const maxHolders = 8

// lockState is the model's state of one lock name: the current holders'
// tokens (a mutex's or a writer's alone, a semaphore's up to its limit, or
// readers: shared), the last token granted (last) and the last granted
// exclusively (lastX), and the high-water mark of the name's protected
// resource ("res/"+name). Comparable, as porcupine's states must be.
type lockState struct {
	holders [maxHolders]int64 // 0: a free place
	shared  bool              // the holders are readers
	last    int64
	lastX   int64
	mark    int64
}

func (s lockState) count() int {
	n := 0
	for _, h := range s.holders {
		if h != 0 {
			n++
		}
	}
	return n
}

func (s lockState) holds(token int64) bool {
	return token != 0 && slices.Contains(s.holders[:], token)
}

// without is s with the holder token gone.
func (s lockState) without(token int64) lockState {
	for i, h := range s.holders {
		if h == token {
			s.holders[i] = 0
		}
	}
	if s.count() == 0 {
		s.shared = false
	}
	return s
}

// with is s with a new holder token, or false if there is no place.
func (s lockState) with(token int64, shared bool) (lockState, bool) {
	for i, h := range s.holders {
		if h == 0 {
			s.holders[i], s.shared = token, shared
			return s, true
		}
	}
	return s, false
}

// admits reports whether s may grant op's acquisition now: a semaphore
// below its limit, a reader beside readers only, anyone else alone; and
// with a token above every earlier grant's (a reader's: above every
// earlier exclusive grant's; readers hold in no order among themselves).
func (s lockState) admits(op Op) bool {
	n := s.count()
	switch {
	case op.Limit > 1:
		return n < int(op.Limit) && !s.shared && op.Token > s.last
	case op.Shared:
		return (n == 0 || s.shared) && op.Token > s.lastX
	}
	return n == 0 && op.Token > s.last
}

// step applies op to s with a definite outcome, reporting whether that is
// legal. The rules: tokens increase (see admits); only a holder is valid,
// renews or releases; nobody releases with a handle that is not the
// grantee's; a resource's mark rises only by an exclusive holder's token.
// Expiry (a holder leaving) is handled by the caller.
func step(s lockState, op Op, out Outcome) (lockState, bool) {
	switch op.Kind {
	case Acquire:
		if out != OK {
			return s, true // not granted: nothing changed
		}
		if !s.admits(op) {
			return s, false
		}
		n, ok := s.with(op.Token, op.Shared)
		if !ok {
			return s, false
		}
		n.last = max(n.last, op.Token)
		if !op.Shared {
			n.lastX = max(n.lastX, op.Token)
		}
		return n, true
	case ValidateResource:
		// Valid only for an exclusive holder at or above the mark, which
		// it advances; refused otherwise (superseded, not held, fenced).
		ok := s.holds(op.Token) && !s.shared && op.Token >= s.mark
		if out == OK {
			if !ok {
				return s, false
			}
			s.mark = op.Token
			return s, true
		}
		return s, !ok
	case Validate, KeepAlive:
		if out == OK {
			return s, s.holds(op.Token)
		}
		return s, !s.holds(op.Token)
	case Release:
		if out == OK {
			if !s.holds(op.Token) {
				return s, false
			}
			return s.without(op.Token), true
		}
		return s, !s.holds(op.Token)
	case ReleaseOther:
		return s, out != OK
	}
	return s, false
}

// expiries are the states s can reach by leases ending: any subset of its
// holders gone (s itself first).
func expiries(s lockState) []lockState {
	out := []lockState{s}
	for _, h := range s.holders {
		if h == 0 {
			continue
		}
		for _, st := range out[:len(out):len(out)] {
			out = append(out, st.without(h))
		}
	}
	return out
}

// Model is the porcupine model of one lock service, partitioned by name:
// mutexes, counting semaphores (N holders) and read-write locks (one
// writer or readers).
//
// A lease can end at any instant (expiry: pauses, partitions and etcd
// leader changes make it possible), so before every operation the holder
// may have become 0; a negative answer about the holder's own token is
// legal only through that expiry, after which the token can never be valid
// again. An Ambiguous operation has the union of its outcomes and of no
// effect at all; an Ambiguous
// Acquire's token is unknown, and a grant nobody learned of is
// indistinguishable from one that expired at once, so it is a no-op. Every
// outcome of an Ambiguous operation is thus also reachable through expiry
// or no change, which is why its recorded return time (when the caller gave
// up) cannot change the verdict.
func Model() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: partitionByName,
		Init:      func() []any { return []any{lockState{}} },
		Step: func(state, input, _ any) []any {
			s := state.(lockState)
			op := input.(Op)
			starts := expiries(s)
			outs := []Outcome{op.Outcome}
			if op.Outcome == Ambiguous {
				outs = []Outcome{OK, Failed}
				if op.Kind == Acquire {
					outs = []Outcome{Failed}
				}
			}
			var next []any
			for _, st := range starts {
				// An Ambiguous call may also have had no effect at all (it
				// never reached the server, or reached one that refused
				// it without an answer): a Release retried after an
				// ambiguous one, and answered released=true, must find
				// the holder still there (a Failed outcome needs the
				// token not held, an OK one removes it).
				if op.Outcome == Ambiguous && !slices.Contains(next, any(st)) {
					next = append(next, st)
				}
				for _, out := range outs {
					if n, ok := step(st, op, out); ok && !slices.Contains(next, any(n)) {
						next = append(next, n)
					}
				}
			}
			return next
		},
		DescribeOperation: func(input, _ any) string { return input.(Op).String() },
		DescribeState: func(state any) string {
			s := state.(lockState)
			return fmt.Sprintf("holders=%v shared=%v last=%d lastX=%d mark=%d", s.holders, s.shared, s.last, s.lastX, s.mark)
		},
	}
	return nm.ToModel()
}

func partitionByName(h []porcupine.Operation) [][]porcupine.Operation {
	byName := map[string][]porcupine.Operation{}
	var names []string
	for _, op := range h {
		n := op.Input.(Op).Name
		if _, ok := byName[n]; !ok {
			names = append(names, n)
		}
		byName[n] = append(byName[n], op)
	}
	out := make([][]porcupine.Operation, 0, len(names))
	for _, n := range names {
		out = append(out, byName[n])
	}
	return out
}

// Verdict is the result of checking one history.
type Verdict struct {
	Result    porcupine.CheckResult
	Ops       int
	Ambiguous int
	Grants    int
	// Info is porcupine's linearization info, for a visualization of a
	// failure (porcupine.VisualizePath).
	Info porcupine.LinearizationInfo
}

// Err is nil only for a linearizable history; Unknown (timeout) is an
// error, never a pass.
func (v Verdict) Err() error {
	switch v.Result {
	case porcupine.Ok:
		return nil
	case porcupine.Unknown:
		return fmt.Errorf("chaos: linearizability check timed out (verdict unknown) on %d ops: a failure, not a pass", v.Ops)
	}
	return fmt.Errorf("chaos: history of %d ops is NOT linearizable", v.Ops)
}

// CheckLinearizable checks ops against Model within timeout.
func CheckLinearizable(ops []Op, timeout time.Duration) Verdict {
	h := make([]porcupine.Operation, 0, len(ops))
	var v Verdict
	for _, op := range ops {
		if op.Kind == Watch {
			continue // not a lock operation
		}
		v.Ops++
		if op.Outcome == Ambiguous {
			v.Ambiguous++
		}
		if op.Kind == Acquire && op.Outcome == OK {
			v.Grants++
		}
		h = append(h, porcupine.Operation{ClientId: op.Client, Input: op, Call: op.Call, Output: nil, Return: op.Return})
	}
	v.Result, v.Info = porcupine.CheckOperationsVerbose(Model(), h, timeout)
	return v
}
