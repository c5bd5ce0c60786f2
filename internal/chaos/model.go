package chaos

import (
	"fmt"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// lockState is the model's state of one lock name: the current holder's
// token (0 = free), the last token granted, and the high-water mark of the
// name's protected resource ("res/"+name).
type lockState struct {
	holder int64
	last   int64
	mark   int64
}

// step applies op to s with a definite outcome, reporting whether that is
// legal. The rules: tokens strictly increase; only the holder is valid,
// renews or releases; nobody releases with a handle that is not the
// grantee's. Expiry (holder -> 0) is handled by the caller.
func step(s lockState, op Op, out Outcome) (lockState, bool) {
	switch op.Kind {
	case Acquire:
		if out != OK {
			return s, true // not granted: nothing changed
		}
		if op.Token <= s.last {
			return s, false
		}
		return lockState{holder: op.Token, last: op.Token, mark: s.mark}, true
	case ValidateResource:
		// Valid only for the holder at or above the mark, which it
		// advances; refused otherwise (superseded, not held, fenced).
		ok := s.holder == op.Token && op.Token >= s.mark
		if out == OK {
			if !ok {
				return s, false
			}
			s.mark = op.Token
			return s, true
		}
		return s, !ok
	case Validate:
		if out == OK {
			return s, s.holder == op.Token
		}
		return s, s.holder != op.Token
	case KeepAlive:
		if out == OK {
			return s, s.holder == op.Token
		}
		return s, s.holder != op.Token
	case Release:
		if out == OK {
			if s.holder != op.Token {
				return s, false
			}
			return lockState{last: s.last, mark: s.mark}, true
		}
		return s, s.holder != op.Token
	case ReleaseOther:
		return s, out != OK
	}
	return s, false
}

// Model is the porcupine model of one lock service, partitioned by name.
//
// A lease can end at any instant (expiry: pauses, partitions and etcd
// leader changes make it possible), so before every operation the holder
// may have become 0; a negative answer about the holder's own token is
// legal only through that expiry, after which the token can never be valid
// again. An Ambiguous operation has the union of its outcomes; an Ambiguous
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
			starts := []lockState{s}
			if s.holder != 0 {
				starts = append(starts, lockState{last: s.last, mark: s.mark})
			}
			outs := []Outcome{op.Outcome}
			if op.Outcome == Ambiguous {
				outs = []Outcome{OK, Failed}
				if op.Kind == Acquire {
					outs = []Outcome{Failed}
				}
			}
			var next []any
			for _, st := range starts {
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
			return fmt.Sprintf("holder=%d last=%d mark=%d", s.holder, s.last, s.mark)
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
