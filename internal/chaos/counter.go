package chaos

import (
	"fmt"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// CounterOp is one Hit of one counter hit (hits = 1) in a history: the
// limit it named, and what it answered. A window too long to end during a
// run makes the fixed window a plain bounded counter.
type CounterOp struct {
	Client  int
	Name    string
	Limit   int64
	Outcome Outcome // OK: allowed; Failed: refused; Ambiguous: an error
	Count   int64   // the count the answer reported
	Call    int64   // ns since the history's start
	Return  int64
}

func (o CounterOp) String() string {
	return fmt.Sprintf("hit %s limit %d: %v count %d", o.Name, o.Limit, o.Outcome, o.Count)
}

// CounterModel is the porcupine model of counters, partitioned by name: the
// state is the count. An allowed hit answers the count before it plus one,
// and only below the limit; a refused hit answers the count, and only at the
// limit (with hits = 1); an ambiguous hit was counted or not. So allowed
// hits per window never exceed the limit, and no hit is counted twice or
// lost once answered.
func CounterModel() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			byName := map[string][]porcupine.Operation{}
			var names []string
			for _, op := range h {
				n := op.Input.(CounterOp).Name
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
		},
		Init: func() []any { return []any{int64(0)} },
		Step: func(state, input, _ any) []any {
			c, op := state.(int64), input.(CounterOp)
			switch op.Outcome {
			case OK:
				if c < op.Limit && op.Count == c+1 {
					return []any{c + 1}
				}
			case Failed:
				if c >= op.Limit && op.Count == c {
					return []any{c}
				}
			default:
				next := []any{c}
				if c < op.Limit && !slices.Contains(next, any(c+1)) {
					next = append(next, c+1)
				}
				return next
			}
			return nil
		},
		DescribeOperation: func(input, _ any) string { return input.(CounterOp).String() },
		DescribeState:     func(state any) string { return fmt.Sprintf("count=%d", state.(int64)) },
	}
	return nm.ToModel()
}

// CheckCounters checks a history of counter hits against CounterModel
// within timeout.
func CheckCounters(ops []CounterOp, timeout time.Duration) Verdict {
	h := make([]porcupine.Operation, 0, len(ops))
	v := Verdict{Ops: len(ops)}
	for _, op := range ops {
		if op.Outcome == Ambiguous {
			v.Ambiguous++
		}
		if op.Outcome == OK {
			v.Grants++
		}
		h = append(h, porcupine.Operation{ClientId: op.Client, Input: op, Call: op.Call, Return: op.Return})
	}
	v.Result, v.Info = porcupine.CheckOperationsVerbose(CounterModel(), h, timeout)
	return v
}
