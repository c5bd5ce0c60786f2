package lease

import (
	"errors"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestEscapeIsInjectiveAndPrefixPreserving(t *testing.T) {
	names := []string{"", "a", "a/", "a/b", "a%2Fb", "a%2fb", "%", "%25", "%2", "/", "//", "ab", "a b", "é", "日本", "a.b"}
	seen := map[string]string{}
	for _, a := range names {
		ea := escape(a)
		if strings.Contains(ea, "/") {
			t.Fatalf("escape(%q) = %q contains '/'", a, ea)
		}
		if unescape(ea) != a {
			t.Fatalf("unescape(escape(%q)) = %q", a, unescape(ea))
		}
		if prev, dup := seen[ea]; dup {
			t.Fatalf("escape(%q) == escape(%q) == %q", a, prev, ea)
		}
		seen[ea] = a
		for _, b := range names {
			if strings.HasPrefix(b, a) != strings.HasPrefix(escape(b), ea) {
				t.Fatalf("prefix relation of %q and %q not preserved: %q vs %q", a, b, ea, escape(b))
			}
		}
	}
}

func TestQueuePrefixesNeverOverlap(t *testing.T) {
	ks := NewKeyspace("/p")
	names := []string{"a", "a/b", "a/", "a%2Fb", "a/0000000000000001"}
	for _, a := range names {
		for _, b := range names {
			if a != b && strings.HasPrefix(ks.key(b, 1), ks.Queue(a)) {
				t.Fatalf("key of %q falls under the queue of %q", b, a)
			}
		}
	}
	if got := ks.Queue("x"); got != "/p/locks/x/" {
		t.Fatalf("Queue = %q", got)
	}
}

func TestHandleRoundTrip(t *testing.T) {
	h, sum := newHandle(clientv3.LeaseID(0x1234abcd))
	if len(h) != handleLen {
		t.Fatalf("handle %q has length %d", h, len(h))
	}
	id, got, err := parseHandle(h)
	if err != nil || id != 0x1234abcd || !sameHash(sum, got) {
		t.Fatalf("parseHandle(%q) = %x, %v", h, id, err)
	}
	h2, _ := newHandle(clientv3.LeaseID(0x1234abcd))
	if h2 == h {
		t.Fatal("two handles for one lease are equal: not random")
	}
	for _, bad := range []string{"", "x", h + "A", h[:len(h)-1], "zzzzzzzzzzzzzzzz" + h[16:], "0000000000000000" + h[16:], strings.Replace(h, ".", "-", 1), h[:17] + "!!!!!!!!!!!!!!!!!!!!!!",
		strings.ToUpper(h[:16]) + h[16:] + "", // upper-case hex: a second spelling
		h[:len(h)-1] + nonCanonicalLast(h)} {
		var fe *FieldError
		if _, _, err := parseHandle(bad); !errors.As(err, &fe) || fe.Field != "handle" {
			t.Fatalf("parseHandle(%q) = %v, want a handle FieldError", bad, err)
		}
	}
}

func TestValidateName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"a", true}, {"日本/ü", true}, {strings.Repeat("x", MaxNameLen), true},
		{"", false}, {strings.Repeat("x", MaxNameLen+1), false}, {"\xff", false}, {"a\x00", false}, {"a\tb", false}, {"\x7f", false},
	} {
		if err := ValidateName("name", tc.name, false); (err == nil) != tc.ok {
			t.Errorf("ValidateName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

func TestNotGrantedErrorIs(t *testing.T) {
	var err error = &NotGrantedError{Name: "n", HolderToken: 3}
	if !errors.Is(err, ErrNotGranted) {
		t.Fatal("errors.Is(NotGrantedError, ErrNotGranted) is false")
	}
	wrapped := errors.Join(errors.New("ctx"), err)
	var ng *NotGrantedError
	if !errors.As(wrapped, &ng) || ng.HolderToken != 3 {
		t.Fatal("errors.As through a wrap failed")
	}
}

// nonCanonicalLast returns a last character that decodes to the same bytes
// as h's under lenient base64 (the 22nd character carries 2 unused bits).
func nonCanonicalLast(h string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, h[len(h)-1])
	return string(alphabet[i^1])
}

// Handles drawn from the buffered random source never repeat, across
// buffer refills, and each is the full secret length.
func TestHandlesAreDistinctAcrossRefills(t *testing.T) {
	seen := map[string]bool{}
	for i := range 3 * 4096 / secretLen { // three buffers' worth
		h, sum := newHandle(clientv3.LeaseID(42))
		if seen[h] {
			t.Fatalf("handle %d repeats: %s", i, h)
		}
		seen[h] = true
		id, got, err := parseHandle(h)
		if err != nil || id != 42 || !sameHash(got, sum) {
			t.Fatalf("handle %s does not parse back: %v %v", h, id, err)
		}
	}
}

// Names and owners refuse the characters a terminal or a log viewer acts on
// or hides, not only C0: C1 controls (U+009B is CSI on many terminals) and
// bidi controls (U+202E shows "lock/fdp.exe" for "lock/\u202Eexe.pdf").
// Printable non-ASCII text stays allowed.
func TestNamesRefuseInvisibleControls(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    string
		ok   bool
	}{
		{"C0 newline", "a\nb", false},
		{"DEL", "a\x7fb", false},
		{"C1 CSI", "a\u009b31mb", false},
		{"C1 NEL", "a\u0085b", false},
		{"bidi override RLO", "lock/\u202eexe.pdf", false},
		{"bidi isolate LRI", "a\u2066b", false},
		{"left-to-right mark", "a\u200eb", false},
		{"arabic letter mark", "a\u061cb", false},
		{"accented latin", "résumé", true},
		{"CJK", "日本/ロック", true},
		{"emoji", "job/🔒", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fe *FieldError
			err := ValidateName("name", tc.s, false)
			if tc.ok != (err == nil) || (err != nil && (!errors.As(err, &fe) || fe.Field != "name")) {
				t.Errorf("ValidateName(%q) = %v, want ok=%v", tc.s, err, tc.ok)
			}
			err = validateOwner(tc.s)
			if tc.ok != (err == nil) || (err != nil && (!errors.As(err, &fe) || fe.Field != "owner")) {
				t.Errorf("validateOwner(%q) = %v, want ok=%v", tc.s, err, tc.ok)
			}
		})
	}
}
