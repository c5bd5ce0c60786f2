package main

import "testing"

func TestField(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"jobs/etl", "jobs/etl"},
		{"coordctl@host pid 42", "coordctl@host pid 42"},
		{"ünïcødé 日本 it's", "ünïcødé 日本 it's"},
		{"", ""},
		{"a\nb", `"a\nb"`},
		{"a\tb", `"a\tb"`},
		{"a\x1b[31mb", `"a\x1b[31mb"`},
		{"a\u009bb", `"a\u009bb"`},
		{"a\u202eb", `"a\u202eb"`},
		{"a\u200bb", `"a\u200bb"`},
		{"a\u00a0b", `"a\u00a0b"`}, // a space that is not ASCII's
		{"a\xffb", `"a\xffb"`},
		{`"a"`, `"\"a\""`}, // a plain cell never starts with a quote
		{`a"b`, `a"b`},
	} {
		if got := field(tc.in); got != tc.want {
			t.Errorf("field(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
