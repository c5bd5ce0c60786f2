package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// timeLayout is how tables show times (UTC, milliseconds).
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// ts converts a protobuf timestamp for JSON output (nil when unset).
func ts(t *timestamppb.Timestamp) *time.Time {
	if t == nil {
		return nil
	}
	v := t.AsTime().UTC()
	return &v
}

// cell shows a time in a table ("-" when unset).
func cell(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(timeLayout)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// enumName turns REASON_NOT_HELD into not_held (prefix "REASON_").
func enumName(s, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(s, prefix))
}

// printJSON writes v as one line of JSON.
func (e *env) printJSON(v any) {
	b, err := json.Marshal(v)
	if err != nil { // only plain structs are printed
		panic(err)
	}
	fmt.Fprintln(e.stdout, string(b))
}

// table writes rows (the first is the header) aligned in columns.
func (e *env) table(rows ...[]string) {
	w := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(w, strings.Join(r, "\t"))
	}
	w.Flush()
}

// holder is a lock holder in JSON output.
type holder struct {
	Name       string     `json:"name"`
	Token      int64      `json:"token"`
	Owner      string     `json:"owner"`
	AcquiredAt *time.Time `json:"acquired_at,omitempty"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
}

func toHolder(h *coordinatorv1.Holder) *holder {
	if h == nil {
		return nil
	}
	return &holder{Name: h.GetName(), Token: h.GetToken(), Owner: h.GetOwner(), AcquiredAt: ts(h.GetAcquiredAt()), ExpiresAt: ts(h.GetExpiresAt())}
}
