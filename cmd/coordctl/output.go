package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/coordinatord/coordinatord/client"
)

// timeLayout is how tables show times (UTC, milliseconds).
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// ts is a time for JSON output, in UTC; nil when unset (zero).
func ts(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	v := t.UTC()
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

// table writes rows (the first is the header) aligned in columns, every
// cell shown by field: a name, owner or handle from the server cannot add a
// row or a column, move the cursor or hide text.
func (e *env) table(rows ...[]string) {
	w := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		cells := make([]string, len(r))
		for i, c := range r {
			cells[i] = field(c)
		}
		fmt.Fprintln(w, strings.Join(cells, "\t"))
	}
	w.Flush()
}

// field is s as a terminal may show it: s itself when every rune is
// printable (unicode.IsPrint: letters, marks, numbers, punctuation, symbols
// and the ASCII space), else s Go-quoted (strconv.Quote), so that a newline,
// a tab, an ANSI escape, a C1 control, a bidi override or a zero-width rune
// shows as \n, \t, \x1b, \u009b, \u202e, \u200b instead of acting. A
// printable s that starts with a double quote is quoted too: a quoted cell
// always starts with one and a plain cell never does, so no string can pass
// for the escaped form of another.
func field(s string) string {
	if strings.HasPrefix(s, `"`) || !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// holder is a lock holder in JSON output.
type holder struct {
	Name       string     `json:"name"`
	Token      int64      `json:"token"`
	Owner      string     `json:"owner"`
	AcquiredAt *time.Time `json:"acquired_at,omitempty"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
}

func toHolder(h *client.Holder) *holder {
	if h == nil {
		return nil
	}
	return &holder{Name: h.Name, Token: h.Token, Owner: h.Owner, AcquiredAt: ts(h.AcquiredAt), ExpiresAt: ts(h.ExpiresAt)}
}
