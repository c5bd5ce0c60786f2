package server_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

func TestNamesAreIndependent(t *testing.T) {
	e := newEnv(t)
	pairs := [][2]string{
		{"a", "a/b"},
		{"a", "a/"},
		{"a/b", "a%2Fb"},
		{"a/b", "a%2fb"},
		{"%", "%25"},
		{"a%", "a%2"},
		{"a", "ab"},
		{"/", "//"},
		{"x/y/z", "x/y"},
		{"locks", "locks/a"},
		{"a b", "a"},
		{"a\u00a0b", "a b"},
		{"é", "e\u0301"}, // precomposed vs combining: different bytes, different locks
		{"日本", "日"},
		{"🔒", "🔒🔒"},
		{"a.b", "a"},
		{"0000000000000001", "0"},
		{"a/0000000000000001", "a"}, // looks like a's queue key suffix
	}
	for i, p := range pairs {
		t.Run(fmt.Sprintf("%d:%q-vs-%q", i, p[0], p[1]), func(t *testing.T) {
			a := e.acquire(p[0], 30*time.Second)
			b, err := e.tryAcquire(p[1])
			if err != nil {
				t.Fatalf("holding %q blocks %q: %v", p[0], p[1], err)
			}
			// Each name sees only its own holder, and no waiters.
			for _, c := range []struct {
				name string
				tok  int64
			}{{p[0], a.Token}, {p[1], b.Token}} {
				d := e.describe(c.name)
				if d.Holder.GetToken() != c.tok || d.Holder.GetName() != c.name || len(d.Waiters) != 0 {
					t.Fatalf("Describe(%q) = %v, want holder %d and no waiters", c.name, d, c.tok)
				}
				if v := e.validate(c.name, c.tok); !v.Valid {
					t.Fatalf("%q's own token invalid: %v", c.name, v)
				}
			}
			// A's token and handle mean nothing under B's name.
			if v := e.validate(p[1], a.Token); v.Valid {
				t.Fatalf("%q's token validates under %q", p[0], p[1])
			}
			if e.release(p[1], a.Token, a.Handle) {
				t.Fatalf("%q's grant released through %q", p[0], p[1])
			}
			_, err = e.lc.KeepAlive(ctxT(t, 5*time.Second), &coordinatorv1.KeepAliveRequest{Name: p[1], Token: a.Token, Handle: a.Handle})
			if code(err) != codes.NotFound {
				t.Fatalf("KeepAlive of %q's grant through %q: %v", p[0], p[1], err)
			}
			if !e.release(p[1], b.Token, b.Handle) || !e.release(p[0], a.Token, a.Handle) {
				t.Fatal("own release answered false")
			}
		})
	}
}

func TestDescribeAndList(t *testing.T) {
	e := newEnv(t)
	names := []string{"app/a", "app/b", "app/b/c", "app%d", "apple", "other", "é"}
	tokens := map[string]int64{}
	for _, n := range names {
		r, err := e.lc.Acquire(ctxT(t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: n, Ttl: dur(30 * time.Second), Owner: "owner-of-" + n})
		if err != nil {
			t.Fatal(err)
		}
		tokens[n] = r.Token
	}
	// A waiter on app/b must not show up in List as a second holder.
	go func() {
		_, _ = e.lc.Acquire(ctxT(t, 3*time.Second), &coordinatorv1.AcquireRequest{Name: "app/b", Owner: "waiter", Wait: dur(2 * time.Second)})
	}()
	eventually(t, 5*time.Second, "waiter queued", func() bool { return len(e.describe("app/b").Waiters) == 1 })

	d := e.describe("app/b")
	h := d.Holder
	if h.GetToken() != tokens["app/b"] || h.GetOwner() != "owner-of-app/b" || h.GetAcquiredAt() == nil {
		t.Fatalf("Describe holder = %v", h)
	}
	if left := time.Until(h.GetExpiresAt().AsTime()); left <= 25*time.Second || left > 31*time.Second {
		t.Fatalf("Describe expires_at is %v away, want about 30s", left)
	}
	if len(d.Waiters) != 1 || d.Waiters[0].GetOwner() != "waiter" || d.Waiters[0].GetWaitingSince() == nil {
		t.Fatalf("Describe waiters = %v", d.Waiters)
	}
	if free := e.describe("free"); free.Holder != nil || len(free.Waiters) != 0 {
		t.Fatalf("Describe of a free lock = %v", free)
	}

	list := func(prefix string, size int32) []string {
		var got []string
		tok := ""
		for pages := 0; ; pages++ {
			r, err := e.lc.List(ctxT(t, 5*time.Second), &coordinatorv1.ListRequest{Prefix: prefix, PageSize: size, PageToken: tok})
			if err != nil {
				t.Fatalf("List(%q): %v", prefix, err)
			}
			if size > 0 && len(r.Holders) > int(size) {
				t.Fatalf("page of %d > page size %d", len(r.Holders), size)
			}
			for _, h := range r.Holders {
				if h.Token != tokens[h.Name] || h.Owner != "owner-of-"+h.Name || h.ExpiresAt != nil {
					t.Fatalf("List holder %v, want token %d and no expires_at", h, tokens[h.Name])
				}
				got = append(got, h.Name)
			}
			if tok = r.NextPageToken; tok == "" {
				return got
			}
			if pages > 20 {
				t.Fatal("List does not terminate")
			}
		}
	}
	// List's order is etcd's key order: names escaped ('%' and '/'
	// percent-encoded) and followed by '/'.
	keyOrder := func(ns []string) []string {
		esc := strings.NewReplacer("%", "%25", "/", "%2F")
		out := slices.Clone(ns)
		slices.SortFunc(out, func(a, b string) int { return strings.Compare(esc.Replace(a)+"/", esc.Replace(b)+"/") })
		return out
	}
	sorted := keyOrder(names)
	for _, size := range []int32{0, 1, 2, 3, 1000} {
		if got := list("", size); !slices.Equal(got, sorted) {
			t.Fatalf("List(all, page %d) = %q, want %q", size, got, sorted)
		}
	}
	for prefix, want := range map[string][]string{
		"app":   keyOrder([]string{"app%d", "app/a", "app/b", "app/b/c", "apple"}),
		"app/":  keyOrder([]string{"app/a", "app/b", "app/b/c"}),
		"app/b": keyOrder([]string{"app/b", "app/b/c"}),
		"app%":  {"app%d"},
		"é":     {"é"},
		"zzz":   nil,
	} {
		for _, size := range []int32{1, 100} {
			if got := list(prefix, size); !slices.Equal(got, want) {
				t.Fatalf("List(%q, page %d) = %q, want %q", prefix, size, got, want)
			}
		}
	}
}

func TestShutdownEndsWaitersAndRemovesTheirKeys(t *testing.T) {
	e := newEnv(t)
	e.acquire("sd", 30*time.Second)
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := e.lc.Acquire(ctxT(t, 30*time.Second), &coordinatorv1.AcquireRequest{Name: "sd"})
			errs <- err
		}()
	}
	eventually(t, 10*time.Second, "3 waiters queued", func() bool { return e.queueKeys("sd") == 4 })
	e.stopTakingWork()
	for range 3 {
		if err := <-errs; code(err) != codes.Unavailable {
			t.Fatalf("waiter at shutdown: %v, want UNAVAILABLE", err)
		}
	}
	if e.sharded() { // the shards were handed over (no other member took them): the grant stays in etcd
		if n := e.countKeys("/test/shards/data/"); n != 1 {
			t.Fatalf("%d grant keys after shutdown, want only the holder's", n)
		}
	} else if n := e.queueKeys("sd"); n != 1 {
		t.Fatalf("%d queue keys after shutdown, want only the holder's", n)
	}
	_, err := e.lc.Acquire(ctxT(t, 5*time.Second), &coordinatorv1.AcquireRequest{Name: "new"})
	if code(err) != codes.Unavailable {
		t.Fatalf("Acquire after shutdown began: %v, want UNAVAILABLE", err)
	}
}
