package main

import (
	"flag"
	"strconv"

	"github.com/coordinatord/coordinatord/client"
)

// mark is a resource's high-water mark in JSON output (the API's Mark).
type mark struct {
	Resource  string  `json:"resource"`
	Token     string  `json:"token"`
	Lock      string  `json:"lock"`
	UpdatedAt *string `json:"updatedAt"`
	Slot      *int32  `json:"slot"` // a semaphore slot's mark; null for the resource's own
}

func toMark(m client.Mark) mark {
	out := mark{Resource: m.Resource, Token: i64(m.Token), Lock: m.Lock, UpdatedAt: ts(m.UpdatedAt)}
	if m.PerSlot {
		out.Slot = &m.Slot
	}
	return out
}

// markTable shows marks, one row each; SLOT is "-" for a resource's own
// mark.
func (e *env) markTable(ms ...client.Mark) {
	rows := [][]string{{"RESOURCE", "SLOT", "TOKEN", "LOCK", "UPDATED_AT"}}
	for _, m := range ms {
		slot := "-"
		if m.PerSlot {
			slot = strconv.Itoa(int(m.Slot))
		}
		rows = append(rows, []string{m.Resource, slot, i64(m.Token), m.Lock, cell(m.UpdatedAt)})
	}
	e.table(rows...)
}

// markLine is the command line of marks get, delete and rebind: RESOURCE
// (LOCK for rebind) and --slot.
type markLine struct {
	resource, lock string
	slot           slotFlag
}

func (m *markLine) register(fs *flag.FlagSet) {
	fs.Var(&m.slot, "slot", "the mark of this slot of a semaphore that protects RESOURCE (its holders raise one mark per slot); default: the resource's own mark")
}

// options are the SDK's mark options of the line.
func (m *markLine) options() []client.MarkOption {
	if !m.slot.set {
		return nil
	}
	return []client.MarkOption{client.OfSlot(m.slot.k)}
}

// slotFlag is a semaphore slot flag that knows whether it was set.
type slotFlag struct {
	k   int32
	set bool
}

func (s *slotFlag) String() string {
	if s == nil || !s.set {
		return ""
	}
	return strconv.Itoa(int(s.k))
}

func (s *slotFlag) Set(v string) error {
	k, err := strconv.ParseInt(v, 10, 32)
	if err != nil {
		return err
	}
	s.k, s.set = int32(k), true
	return nil
}

// listMarks returns the marks of the resources whose names start with
// prefix, every page of them, each page bounded by --timeout.
func listMarks(x *call[string]) ([]client.Mark, error) {
	return allPages(x, x.c.MarkPages(*x.f, client.WithPageSize(1000)))
}

func printMarks[F any](x *call[F], ms []client.Mark) int {
	if x.output == "json" {
		out := struct {
			Marks []mark `json:"marks"`
		}{[]mark{}}
		for _, m := range ms {
			out.Marks = append(out.Marks, toMark(m))
		}
		x.printJSON(out)
		return exitOK
	}
	x.markTable(ms...)
	return exitOK
}

// printMark shows the one mark of marks get, delete and rebind.
func printMark[F any](x *call[F], m client.Mark) int {
	if x.output == "json" {
		x.printJSON(struct {
			Mark mark `json:"mark"`
		}{toMark(m)})
		return exitOK
	}
	x.markTable(m)
	return exitOK
}
