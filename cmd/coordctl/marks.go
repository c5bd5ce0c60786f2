package main

import (
	"github.com/coordinatord/coordinatord/client"
)

// mark is a resource's high-water mark in JSON output (the API's Mark).
type mark struct {
	Resource  string  `json:"resource"`
	Token     string  `json:"token"`
	Lock      string  `json:"lock"`
	UpdatedAt *string `json:"updatedAt"`
}

func toMark(m client.Mark) mark {
	return mark{Resource: m.Resource, Token: i64(m.Token), Lock: m.Lock, UpdatedAt: ts(m.UpdatedAt)}
}

// markTable shows marks, one row each.
func (e *env) markTable(ms ...client.Mark) {
	rows := [][]string{{"RESOURCE", "TOKEN", "LOCK", "UPDATED_AT"}}
	for _, m := range ms {
		rows = append(rows, []string{m.Resource, i64(m.Token), m.Lock, cell(m.UpdatedAt)})
	}
	e.table(rows...)
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

// resourceLock is the RESOURCE LOCK of marks rebind.
type resourceLock struct{ resource, lock string }
