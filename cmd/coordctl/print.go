package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/coordinatord/coordinatord/client"
	"github.com/coordinatord/coordinatord/internal/version"
)

// How each command shows its answer: a table, or with -o json one JSON
// object in protojson's encoding (output.go): the field names of the API's
// response messages, plus the name the command was given. The JSON field
// names are part of coordctl's interface.

// grant is an acquired (or renewed) grant in JSON output, an
// AcquireResponse (KeepAliveResponse) with its lock's name.
type grant struct {
	Name       string  `json:"name"`
	Token      string  `json:"token"`
	Handle     string  `json:"handle,omitempty"`
	LeaseID    string  `json:"leaseId,omitempty"`
	TTL        string  `json:"ttl"`
	ExpiresAt  *string `json:"expiresAt"`
	SafeUntil  *string `json:"safeUntil"`
	AcquiredAt *string `json:"acquiredAt,omitempty"`
	Slot       *int32  `json:"slot,omitempty"` // a semaphore's permit, slot 0 too
	Mode       string  `json:"mode,omitempty"` // a reader's: LOCK_MODE_SHARED
}

func printGrant(x *call[acquireLine], r client.Grant) int {
	handle := r.Handle
	if x.f.session.wanted() {
		handle = "" // the session's secret: the caller has it already
	}
	if x.output == "json" {
		g := grant{
			Name: x.f.name, Token: i64(r.Token), Handle: handle, LeaseID: i64(r.LeaseID),
			TTL: dur(r.TTL), ExpiresAt: ts(r.ExpiresAt), SafeUntil: ts(r.SafeUntil), AcquiredAt: ts(r.AcquiredAt),
		}
		if x.f.shape.semaphore() {
			g.Slot = &r.Slot
		}
		if r.Shared {
			g.Mode = "LOCK_MODE_SHARED"
		}
		x.printJSON(g)
		return exitOK
	}
	head := []string{"NAME", "TOKEN", "HANDLE", "TTL", "EXPIRES_AT", "SAFE_UNTIL"}
	row := []string{x.f.name, i64(r.Token), dash(handle), r.TTL.String(), cell(r.ExpiresAt), cell(r.SafeUntil)}
	switch {
	case x.f.shape.semaphore():
		head, row = append(head, "SLOT"), append(row, strconv.Itoa(int(r.Slot)))
	case r.Shared:
		head, row = append(head, "MODE"), append(row, "shared")
	}
	x.table(head, row)
	return exitOK
}

func printRenewal(x *call[grantLine], r client.Renewal) int {
	ref := x.f.ref
	if x.output == "json" {
		x.printJSON(grant{Name: ref.Name, Token: i64(ref.Token), TTL: dur(r.TTL), ExpiresAt: ts(r.ExpiresAt), SafeUntil: ts(r.SafeUntil)})
	} else {
		x.table([]string{"NAME", "TOKEN", "TTL", "EXPIRES_AT", "SAFE_UNTIL"},
			[]string{ref.Name, i64(ref.Token), r.TTL.String(), cell(r.ExpiresAt), cell(r.SafeUntil)})
	}
	return exitOK
}

// printReleased prints the outcome of release and force-release.
func (e *env) printReleased(name string, token int64, released bool) int {
	if e.output == "json" {
		e.printJSON(struct {
			Name     string `json:"name"`
			Token    string `json:"token"`
			Released bool   `json:"released"`
		}{name, i64(token), released})
	} else {
		e.table([]string{"NAME", "TOKEN", "RELEASED"}, []string{name, i64(token), strconv.FormatBool(released)})
	}
	if !released {
		return exitNotValid
	}
	return exitOK
}

func printVerdict(x *call[validateLine], v client.Verdict) int {
	if x.output == "json" {
		x.printJSON(struct {
			Name         string `json:"name"`
			Token        string `json:"token"`
			Resource     string `json:"resource,omitempty"`
			Valid        bool   `json:"valid"`
			Reason       string `json:"reason"`
			CurrentToken string `json:"currentToken"`
		}{x.f.name, i64(x.f.token), x.f.resource, v.Valid, v.Reason.String(), i64(v.CurrentToken)})
	} else {
		x.table([]string{"NAME", "TOKEN", "VALID", "REASON", "CURRENT_TOKEN"},
			[]string{x.f.name, x.f.tokenArg, strconv.FormatBool(v.Valid), enumName(v.Reason.String(), "REASON_"), i64(v.CurrentToken)})
	}
	if !v.Valid {
		return exitNotValid
	}
	return exitOK
}

func printDescription(x *call[string], d client.Description) int {
	name := *x.f
	if x.output == "json" {
		type waiter struct {
			Owner        string  `json:"owner"`
			WaitingSince *string `json:"waitingSince"`
			Mode         string  `json:"mode"`
		}
		out := struct {
			Name    string    `json:"name"`
			Held    bool      `json:"held"`
			Holder  *holder   `json:"holder"`
			Holders []*holder `json:"holders"`
			Waiters []waiter  `json:"waiters"`
		}{Name: name, Held: d.Holder != nil, Holder: toHolder(d.Holder), Holders: toHolders(d.Holders), Waiters: []waiter{}}
		for _, w := range d.Waiters {
			out.Waiters = append(out.Waiters, waiter{Owner: w.Owner, WaitingSince: ts(w.WaitingSince), Mode: modeName(w.Shared)})
		}
		x.printJSON(out)
		return exitOK
	}
	rows := [][]string{{"NAME", "STATE", "TOKEN", "OWNER", "SINCE", "EXPIRES_AT"}}
	for _, h := range d.Holders {
		rows = append(rows, []string{h.Name, heldState(h), i64(h.Token), dash(h.Owner), cell(h.AcquiredAt), cell(h.ExpiresAt)})
	}
	if len(d.Holders) == 0 {
		rows = append(rows, []string{name, "free", "-", "-", "-", "-"})
	}
	for i, w := range d.Waiters {
		rows = append(rows, []string{name, fmt.Sprintf("waiting #%d", i+1), "-", dash(w.Owner), cell(w.WaitingSince), "-"})
	}
	x.table(rows...)
	return exitOK
}

func printHolders(x *call[string], hs []client.Holder) int {
	if x.output == "json" {
		x.printJSON(struct {
			Holders []*holder `json:"holders"`
		}{toHolders(hs)})
		return exitOK
	}
	x.holderTable(hs)
	return exitOK
}

// holderTable shows holders as list does.
func (e *env) holderTable(hs []client.Holder) {
	rows := [][]string{{"NAME", "TOKEN", "OWNER", "ACQUIRED_AT"}}
	for _, h := range hs {
		rows = append(rows, []string{h.Name, i64(h.Token), dash(h.Owner), cell(h.AcquiredAt)})
	}
	e.table(rows...)
}

// kindName is a watch event's kind as the API names it (KIND_ACQUIRED).
func kindName(k client.EventKind) string {
	s := k.String()
	if _, err := strconv.Atoi(s); err == nil {
		return s // a kind this coordctl does not know: protojson writes its number
	}
	return "KIND_" + strings.ToUpper(strings.ReplaceAll(s, "-", "_"))
}

// printEvent prints one event of watch: a JSON line (a WatchResponse with
// the lock's name), or a table row under the header printWatch wrote.
func (e *env) printEvent(name string, ev client.WatchEvent) {
	h := toHolder(ev.Holder)
	if e.output == "json" {
		e.printJSON(struct {
			Name     string  `json:"name"`
			Revision string  `json:"revision"`
			Kind     string  `json:"kind"`
			Holder   *holder `json:"holder"`
		}{name, i64(ev.Revision), kindName(ev.Kind), h})
		return
	}
	token, owner := "-", "-"
	if h != nil {
		token, owner = h.Token, dash(h.Owner)
	}
	fmt.Fprintf(e.stdout, "%-10d  %-15s  %-10s  %s\n", ev.Revision, field(ev.Kind.String()), token, field(owner))
}

// build is one program's version in JSON output.
type build struct {
	Version   string `json:"version"`
	Revision  string `json:"revision"`
	GoVersion string `json:"goVersion"`
}

// printVersion shows coordctl's version ("client": the server's would sit
// beside it, if the API named it).
func printVersion(x *call[struct{}], v version.Info) int {
	if x.output == "json" {
		x.printJSON(struct {
			Client build `json:"client"`
		}{build{v.Version, v.Revision, v.GoVersion}})
	} else {
		x.table([]string{"PROGRAM", "VERSION", "REVISION", "GO"}, []string{"coordctl", v.Version, v.Revision, v.GoVersion})
	}
	return exitOK
}

// heldState is a holder's STATE cell: "held", or a reader's or a
// semaphore's slot's.
func heldState(h client.Holder) string {
	switch {
	case h.Shared:
		return "held (shared)"
	case h.Limit > 1:
		return fmt.Sprintf("held (slot %d of %d)", h.Slot, h.Limit)
	}
	return "held"
}
