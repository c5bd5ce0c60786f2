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

// JSON output is protojson's (what grpcurl prints): lowerCamelCase field
// names, int64 as a decimal string, a duration as seconds with an "s"
// ("30s", "1.500s"), a timestamp as RFC 3339 in UTC with 0, 3, 6 or 9
// fractional digits, an enum as its proto name (REASON_NOT_HELD). Unlike
// grpcurl's default, zero values are printed too (protojson's
// EmitUnpopulated), so a script sees "released":false; an unset time is
// null. TestJSONIsProtoJSON holds the output to protojson itself.

// ts is a time for JSON output; nil when unset (zero).
func ts(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	s := t.Format("2006-01-02T15:04:05")
	if ns := t.Nanosecond(); ns != 0 {
		s += fraction(ns)
	}
	s += "Z"
	return &s
}

// i64 is an int64 for JSON output, as protojson writes it: a string.
func i64(n int64) string { return strconv.FormatInt(n, 10) }

// dur is a duration for JSON output, as protojson writes it.
func dur(d time.Duration) string {
	sign := ""
	if d < 0 {
		sign, d = "-", -d
	}
	s := sign + strconv.FormatInt(int64(d/time.Second), 10)
	if ns := int(d % time.Second); ns != 0 {
		s += fraction(ns)
	}
	return s + "s"
}

// fraction is ns as protojson writes fractional seconds: a dot and 3, 6
// or 9 digits.
func fraction(ns int) string {
	f := fmt.Sprintf(".%09d", ns)
	for strings.HasSuffix(f, "000") {
		f = f[:len(f)-3]
	}
	return f
}

// cell shows a time in a table ("-" when unset).
func cell(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(timeLayout)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// enumName turns REASON_NOT_HELD into not_held (prefix "REASON_"), as
// tables show an enum.
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
	Name       string  `json:"name"`
	Token      string  `json:"token"`
	Owner      string  `json:"owner"`
	AcquiredAt *string `json:"acquiredAt"`
	ExpiresAt  *string `json:"expiresAt"`
	Mode       string  `json:"mode"`
	Slot       int32   `json:"slot"`
	Limit      int32   `json:"limit"`
}

func toHolder(h *client.Holder) *holder {
	if h == nil {
		return nil
	}
	return &holder{Name: h.Name, Token: i64(h.Token), Owner: h.Owner, AcquiredAt: ts(h.AcquiredAt), ExpiresAt: ts(h.ExpiresAt),
		Mode: modeName(h.Shared), Slot: h.Slot, Limit: h.Limit}
}

// modeName is the protojson name of a holder's or waiter's mode.
func modeName(shared bool) string {
	if shared {
		return "LOCK_MODE_SHARED"
	}
	return "LOCK_MODE_EXCLUSIVE"
}

func toHolders(hs []client.Holder) []*holder {
	out := make([]*holder, 0, len(hs))
	for i := range hs {
		out = append(out, toHolder(&hs[i]))
	}
	return out
}
