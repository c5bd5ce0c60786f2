package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/coordinatord/coordinatord/client"
	"github.com/coordinatord/coordinatord/internal/version"
)

// How each command shows its answer: a table, or with -o json one JSON
// object. The JSON field names are part of coordctl's interface.

// grant is an acquired (or renewed) grant in JSON output.
type grant struct {
	Name       string     `json:"name"`
	Token      int64      `json:"token"`
	Handle     string     `json:"handle,omitempty"`
	LeaseID    int64      `json:"lease_id,omitempty"`
	TTL        string     `json:"ttl"`
	ExpiresAt  *time.Time `json:"expires_at"`
	SafeUntil  *time.Time `json:"safe_until"`
	AcquiredAt *time.Time `json:"acquired_at,omitempty"`
}

func printGrant(x *call[acquireLine], r client.Grant) int {
	g := grant{
		Name: x.f.name, Token: r.Token, Handle: r.Handle, LeaseID: r.LeaseID,
		TTL: r.TTL.String(), ExpiresAt: ts(r.ExpiresAt), SafeUntil: ts(r.SafeUntil), AcquiredAt: ts(r.AcquiredAt),
	}
	if x.output == "json" {
		x.printJSON(g)
	} else {
		x.table([]string{"NAME", "TOKEN", "HANDLE", "TTL", "EXPIRES_AT", "SAFE_UNTIL"},
			[]string{g.Name, strconv.FormatInt(g.Token, 10), g.Handle, g.TTL, cell(g.ExpiresAt), cell(g.SafeUntil)})
	}
	return exitOK
}

func printRenewal(x *call[grantLine], r client.Renewal) int {
	ref := x.f.ref
	g := grant{Name: ref.Name, Token: ref.Token, TTL: r.TTL.String(), ExpiresAt: ts(r.ExpiresAt), SafeUntil: ts(r.SafeUntil)}
	if x.output == "json" {
		x.printJSON(g)
	} else {
		x.table([]string{"NAME", "TOKEN", "TTL", "EXPIRES_AT", "SAFE_UNTIL"},
			[]string{g.Name, strconv.FormatInt(ref.Token, 10), g.TTL, cell(g.ExpiresAt), cell(g.SafeUntil)})
	}
	return exitOK
}

// printReleased prints the outcome of release and force-release.
func (e *env) printReleased(name string, token int64, released bool) int {
	if e.output == "json" {
		e.printJSON(struct {
			Name     string `json:"name"`
			Token    int64  `json:"token"`
			Released bool   `json:"released"`
		}{name, token, released})
	} else {
		e.table([]string{"NAME", "TOKEN", "RELEASED"}, []string{name, strconv.FormatInt(token, 10), strconv.FormatBool(released)})
	}
	if !released {
		return exitNotValid
	}
	return exitOK
}

func printVerdict(x *call[validateLine], v client.Verdict) int {
	reason := enumName(v.Reason.String(), "REASON_")
	if x.output == "json" {
		x.printJSON(struct {
			Name         string `json:"name"`
			Token        int64  `json:"token"`
			Resource     string `json:"resource,omitempty"`
			Valid        bool   `json:"valid"`
			Reason       string `json:"reason"`
			CurrentToken int64  `json:"current_token"`
		}{x.f.name, x.f.token, x.f.resource, v.Valid, reason, v.CurrentToken})
	} else {
		x.table([]string{"NAME", "TOKEN", "VALID", "REASON", "CURRENT_TOKEN"},
			[]string{x.f.name, x.f.tokenArg, strconv.FormatBool(v.Valid), reason, strconv.FormatInt(v.CurrentToken, 10)})
	}
	if !v.Valid {
		return exitNotValid
	}
	return exitOK
}

func printDescription(x *call[string], d client.Description) int {
	name := *x.f
	type waiter struct {
		Owner        string     `json:"owner"`
		WaitingSince *time.Time `json:"waiting_since"`
	}
	out := struct {
		Name    string   `json:"name"`
		Held    bool     `json:"held"`
		Holder  *holder  `json:"holder"`
		Waiters []waiter `json:"waiters"`
	}{Name: name, Holder: toHolder(d.Holder), Waiters: []waiter{}}
	out.Held = out.Holder != nil
	for _, w := range d.Waiters {
		out.Waiters = append(out.Waiters, waiter{Owner: w.Owner, WaitingSince: ts(w.WaitingSince)})
	}
	if x.output == "json" {
		x.printJSON(out)
		return exitOK
	}
	rows := [][]string{{"NAME", "STATE", "TOKEN", "OWNER", "SINCE", "EXPIRES_AT"}}
	if h := out.Holder; h != nil {
		rows = append(rows, []string{h.Name, "held", strconv.FormatInt(h.Token, 10), dash(h.Owner), cell(h.AcquiredAt), cell(h.ExpiresAt)})
	} else {
		rows = append(rows, []string{name, "free", "-", "-", "-", "-"})
	}
	for i, w := range out.Waiters {
		rows = append(rows, []string{name, fmt.Sprintf("waiting #%d", i+1), "-", dash(w.Owner), cell(w.WaitingSince), "-"})
	}
	x.table(rows...)
	return exitOK
}

func printHolders(x *call[string], hs []client.Holder) int {
	holders := make([]*holder, 0, len(hs))
	for i := range hs {
		holders = append(holders, toHolder(&hs[i]))
	}
	if x.output == "json" {
		x.printJSON(struct {
			Holders []*holder `json:"holders"`
		}{holders})
		return exitOK
	}
	rows := [][]string{{"NAME", "TOKEN", "OWNER", "ACQUIRED_AT"}}
	for _, h := range holders {
		rows = append(rows, []string{h.Name, strconv.FormatInt(h.Token, 10), dash(h.Owner), cell(h.AcquiredAt)})
	}
	x.table(rows...)
	return exitOK
}

// printEvent prints one event of watch: a JSON line, or a table row under
// the header printWatch wrote.
func (e *env) printEvent(name string, ev client.WatchEvent) {
	kind := ev.Kind.String()
	h := toHolder(ev.Holder)
	if e.output == "json" {
		e.printJSON(struct {
			Name     string  `json:"name"`
			Revision int64   `json:"revision"`
			Event    string  `json:"event"`
			Holder   *holder `json:"holder"`
		}{name, ev.Revision, kind, h})
		return
	}
	token, owner := "-", "-"
	if h != nil {
		token, owner = strconv.FormatInt(h.Token, 10), dash(h.Owner)
	}
	fmt.Fprintf(e.stdout, "%-10d  %-15s  %-10s  %s\n", ev.Revision, field(kind), token, field(owner))
}

// build is one program's version in JSON output.
type build struct {
	Version   string `json:"version"`
	Revision  string `json:"revision"`
	GoVersion string `json:"go_version"`
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
