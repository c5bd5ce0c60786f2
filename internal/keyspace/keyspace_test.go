package keyspace

import (
	"errors"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The layout is the one in the package doc, byte for byte: it is what
// etcd already holds, so a change here strands every key written before.
func TestLayout(t *testing.T) {
	k := New("/p")
	ih := IdentityHash("spiffe://x/id")
	for _, tc := range []struct{ got, want string }{
		{k.Prefix(), "/p/"},
		{New("").Prefix(), DefaultPrefix},
		{k.Locks(), "/p/locks/"},
		{k.Queue("a/b"), "/p/locks/a%2Fb/"},
		{k.Key("a/b", 0x1234abcd), "/p/locks/a%2Fb/000000001234abcd"},
		{k.Delay("a/b"), "/p/delay/a%2Fb"},
		{k.Ended("a/b"), "/p/ended/a%2Fb"},
		{k.Request("a/b", "d1"), "/p/requests/a%2Fb/d1"},
		{k.WaiterSlots("a/b"), "/p/slots/a%2Fb/"},
		{k.Owners(ih), "/p/owners/" + ih + "/"},
		{k.Session(0x1234abcd), "/p/sessions/000000001234abcd"},
		{k.SessionIndex(0x1234abcd), "/p/sessions/000000001234abcd/locks/"},
		{k.Marks(), "/p/fence/"},
		{k.Mark("r/1"), "/p/fence/r%2F1"},
		{k.Barrier(), "/p/fence/barrier"},
		{k.MarkCount(ih), "/p/markcounts/" + ih},
		{k.Counters(), "/p/counters/"},
		{k.Counter("a/b"), "/p/counters/a%2Fb"},
		{k.CounterRequest(ih, "d1"), "/p/counterreqs/" + ih + "/d1"},
		{k.Readyz(), "/p/readyz"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	if len(ih) != 64 || strings.Contains(ih, "/") {
		t.Errorf("IdentityHash = %q: want 64 hex digits", ih)
	}
}

// No key of one subtree falls under another subtree's prefix: the lease
// and fence packages can range over their own without seeing the others'.
func TestSubtreesAreDisjoint(t *testing.T) {
	k := New("/p/")
	names := []string{"a", "barrier", "locks", "x/y", "%"}
	subtrees := map[string]func(string) string{
		"locks":    func(n string) string { return k.Key(n, 1) },
		"delay":    k.Delay,
		"ended":    k.Ended,
		"requests": func(n string) string { return k.Request(n, "d") },
		"slots":    func(n string) string { return k.WaiterSlots(n) + "0" },
		"owners":   func(n string) string { return k.Owners(IdentityHash(n)) + "0" },
		"sessions": func(n string) string { return k.SessionIndex(1) + Escape(n) },
		"fence":    k.Mark,
		"markcounts": func(n string) string {
			return k.MarkCount(IdentityHash(n))
		},
		"counters":    k.Counter,
		"counterreqs": func(n string) string { return k.CounterRequest(IdentityHash(n), "d") },
	}
	for tree, keyOf := range subtrees {
		for _, n := range names {
			key := keyOf(n)
			if !strings.HasPrefix(key, k.Prefix()+tree+"/") {
				t.Fatalf("%s key %q is outside %s/", tree, key, tree)
			}
			for other := range subtrees {
				if other != tree && strings.HasPrefix(key, k.Prefix()+other+"/") {
					t.Fatalf("%s key %q falls under %s/", tree, key, other)
				}
			}
		}
	}
	if n, ok := k.NameOf(k.Key("x/y", 7)); !ok || Unescape(n) != "x/y" {
		t.Fatalf("NameOf(Key(x/y)) = %q, %v", n, ok)
	}
	if _, ok := k.NameOf(k.Delay("x")); ok {
		t.Fatal("NameOf accepts a lock-delay key")
	}
}

func TestEscapeIsInjectiveAndPrefixPreserving(t *testing.T) {
	names := []string{"", "a", "a/", "a/b", "a%2Fb", "a%2fb", "%", "%25", "%2", "/", "//", "ab", "a b", "é", "日本", "a.b"}
	seen := map[string]string{}
	for _, a := range names {
		ea := Escape(a)
		if strings.Contains(ea, "/") || Unescape(ea) != a {
			t.Fatalf("Escape(%q) = %q", a, ea)
		}
		if prev, dup := seen[ea]; dup {
			t.Fatalf("Escape(%q) == Escape(%q) == %q", a, prev, ea)
		}
		seen[ea] = a
		for _, b := range names {
			if strings.HasPrefix(b, a) != strings.HasPrefix(Escape(b), ea) {
				t.Fatalf("prefix relation of %q and %q not preserved", a, b)
			}
		}
	}
}

func TestValidation(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   error
		field string // "" if err must be nil
	}{
		{"name ok", ValidateName("name", "日本/ü", false), ""},
		{"name empty", ValidateName("name", "", false), "name"},
		{"prefix empty", ValidateName("prefix", "", true), ""},
		{"name too long", ValidateName("resource", strings.Repeat("x", MaxNameLen+1), false), "resource"},
		{"name not utf-8", ValidateName("name", "\xff", false), "name"},
		{"name C1", ValidateName("name", "a\u009bb", false), "name"},
		{"name bidi", ValidateName("name", "a\u202eb", false), "name"},
		{"owner empty", ValidateOwner(""), ""},
		{"owner too long", ValidateOwner(strings.Repeat("x", MaxOwnerLen+1)), "owner"},
		{"owner control", ValidateOwner("a\nb"), "owner"},
		{"token ok", ValidateToken(1), ""},
		{"token zero", ValidateToken(0), "token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fe *FieldError
			switch {
			case tc.field == "" && tc.err != nil:
				t.Fatalf("got %v, want nil", tc.err)
			case tc.field != "" && (!errors.As(tc.err, &fe) || fe.Field != tc.field):
				t.Fatalf("got %v, want a FieldError on %s", tc.err, tc.field)
			}
		})
	}
}

func TestPageArguments(t *testing.T) {
	for _, tc := range []struct{ in, want int }{{0, DefaultPageSize}, {1, 1}, {MaxPageSize, MaxPageSize}, {MaxPageSize + 1, MaxPageSize}} {
		if got, err := PageSize(tc.in); err != nil || got != tc.want {
			t.Errorf("PageSize(%d) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	var fe *FieldError
	if _, err := PageSize(-1); !errors.As(err, &fe) || fe.Field != "page_size" {
		t.Errorf("PageSize(-1) = %v, want a FieldError on page_size", err)
	}
	if after, err := DecodePageToken("", "a"); err != nil || after != "" {
		t.Errorf(`DecodePageToken("") = %q, %v; want the first page`, after, err)
	}
	tok := EncodePageToken(Escape("a/b"))
	if after, err := DecodePageToken(tok, Escape("a/")); err != nil || after != Escape("a/b") {
		t.Errorf("DecodePageToken(round trip) = %q, %v", after, err)
	}
	for _, bad := range []struct{ tok, prefix string }{{"!!", ""}, {tok, "b"}} {
		if _, err := DecodePageToken(bad.tok, bad.prefix); !errors.As(err, &fe) || fe.Field != "page_token" {
			t.Errorf("DecodePageToken(%q, %q) = %v, want a FieldError on page_token", bad.tok, bad.prefix, err)
		}
	}
}

var sinkString string

func BenchmarkKey(b *testing.B) {
	k := New(DefaultPrefix)
	b.ReportAllocs()
	for b.Loop() {
		sinkString = k.Key("reports/nightly", clientv3.LeaseID(0x1234abcd5678ef01))
	}
}
