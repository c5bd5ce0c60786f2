package examples_test

import (
	"testing"
)

// Issue 16: the Python and Node examples call CounterService.Hit: LIMIT
// hits allowed, then refused with a retry delay; a retry with the same
// request_id is replayed, not counted; then Get and Reset.
func TestRateLimitExamples(t *testing.T) {
	addr := startDaemon(t)
	for _, ln := range languages {
		t.Run(ln.name, func(t *testing.T) {
			l := ln.find(t)
			c := startClient(t, append(l.run("rate_limit"), "--addr", addr, "--name", "examples/"+l.name+"/rate")...)
			for n, want := range []string{"true", "true", "true", "false", "false"} {
				h := c.next("hit")
				count := int64(min(n+1, 3))
				if h.fields["allowed"] != want || h.int(t, "count") != count {
					t.Fatalf("hit %d: %v; want allowed=%s count=%d", n, h, want, count)
				}
				if want == "false" && h.fields["retry_after"] == "0.000s" {
					t.Fatalf("refused hit %v without a retry delay", h)
				}
				if n == 0 {
					if r := c.next("retried"); r.fields["replayed"] != "true" || r.int(t, "count") != 1 {
						t.Fatalf("%v; want the first answer replayed (count 1)", r)
					}
				}
			}
			if g := c.next("counter"); g.int(t, "count") != 3 || g.int(t, "limit") != 3 {
				t.Fatalf("%v; want count 3 of 3", g)
			}
			if r := c.next("reset"); r.fields["existed"] != "true" {
				t.Fatalf("%v; want existed=true", r)
			}
			c.exit()
		})
	}
}
