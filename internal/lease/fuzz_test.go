package lease

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// FuzzNameKeys: any name ValidateName accepts maps to keys inside the
// prefix, in a segment of its own (no '/'), that decode back to the name;
// two different names never share a queue (neither queue prefix contains
// the other), so no name can observe, block or release another.
func FuzzNameKeys(f *testing.F) {
	for _, s := range [][2]string{{"a", "a/"}, {"a/b", "a%2Fb"}, {"%", "%25"}, {"日本", "日本/x"}, {"x", "x"}, {"a\x00", "a"}, {"/", "//"}} {
		f.Add("/p/", s[0], s[1])
	}
	f.Add("", "lock", "lock2")
	f.Add("noslash", "a%2", "a%25")
	f.Fuzz(func(t *testing.T, prefix, a, b string) {
		ks := NewKeyspace(prefix)
		if !strings.HasPrefix(ks.Prefix(), prefix) || !strings.HasSuffix(ks.Prefix(), "/") {
			t.Fatalf("prefix %q -> %q", prefix, ks.Prefix())
		}
		errA, errB := ValidateName("name", a, false), ValidateName("name", b, false)
		for _, e := range []error{errA, errB} {
			var fe *FieldError
			if e != nil && (!errors.As(e, &fe) || fe.Field != "name") {
				t.Fatalf("not a FieldError on name: %v", e)
			}
		}
		if errA != nil {
			return
		}
		seg := escape(a)
		if strings.Contains(seg, "/") || unescape(seg) != a {
			t.Fatalf("escape(%q) = %q", a, seg)
		}
		key := ks.key(a, clientv3.LeaseID(0x1234))
		if !strings.HasPrefix(key, ks.Prefix()) || !strings.HasPrefix(key, ks.Queue(a)) {
			t.Fatalf("key %q outside prefix %q / queue %q", key, ks.Prefix(), ks.Queue(a))
		}
		if n, ok := ks.nameOf(key); !ok || n != seg {
			t.Fatalf("nameOf(%q) = %q, %v; want %q", key, n, ok, seg)
		}
		for _, k := range []string{ks.request("spiffe://x/id", a, "0123456789abcdef"), ks.delay(a)} {
			if !strings.HasPrefix(k, ks.Prefix()) {
				t.Fatalf("key %q outside prefix %q", k, ks.Prefix())
			}
		}
		if errB != nil || a == b {
			return
		}
		qa, qb := ks.Queue(a), ks.Queue(b)
		if strings.HasPrefix(qa, qb) || strings.HasPrefix(qb, qa) {
			t.Fatalf("names %q and %q share queue keys: %q, %q", a, b, qa, qb)
		}
		if ks.delay(a) == ks.delay(b) {
			t.Fatalf("names %q and %q share a lock-delay key", a, b)
		}
	})
}

// FuzzParseHandle: any string parses or is refused with a FieldError on
// "handle"; an accepted handle has exactly one spelling (formatting what was
// parsed gives it back).
func FuzzParseHandle(f *testing.F) {
	h, _ := newHandle(clientv3.LeaseID(0x694d7c2d1e4a0b11))
	f.Add(h)
	f.Add(strings.ToUpper(h))
	f.Add(h[:len(h)-1] + "=")
	f.Add("0000000000000000.AAAAAAAAAAAAAAAAAAAAAA")
	f.Add("ffffffffffffffff.AAAAAAAAAAAAAAAAAAAAAA")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		id, sum, err := parseHandle(s)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != "handle" {
				t.Fatalf("not a FieldError on handle: %v", err)
			}
			return
		}
		if id <= 0 || len(sum) != 32 {
			t.Fatalf("parsed %q to id %d, %d-byte hash", s, id, len(sum))
		}
		secret, err := base64.RawURLEncoding.DecodeString(s[17:])
		if err != nil {
			t.Fatal(err)
		}
		if again, sum2 := formatHandle(id, secret); again != s || !sameHash(sum, sum2) {
			t.Fatalf("handle %q has a second spelling %q", s, again)
		}
	})
}

// FuzzRequestFields: the request id, owner and token checks never panic and
// refuse only with a FieldError naming their field.
func FuzzRequestFields(f *testing.F) {
	f.Add("0123456789abcdef", "owner", int64(1))
	f.Add("short", "\xff", int64(0))
	f.Add("0123456789abcdef 0", strings.Repeat("o", MaxOwnerLen+1), int64(-5))
	f.Add("0123456789abcdef\x1b", "me\nforged row", int64(2))
	f.Fuzz(func(t *testing.T, rid, owner string, token int64) {
		for field, err := range map[string]error{"request_id": validateRequestID(rid), "owner": validateOwner(owner), "token": ValidateToken(token)} {
			var fe *FieldError
			if err != nil && (!errors.As(err, &fe) || fe.Field != field) {
				t.Fatalf("%s: %v", field, err)
			}
		}
		if validateRequestID(rid) == nil && rid != "" && (len(rid) < MinRequestIDLen || strings.ContainsAny(rid, " \n")) {
			t.Fatalf("request id %q accepted", rid)
		}
		if validateOwner(owner) == nil && strings.ContainsFunc(owner, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			t.Fatalf("owner %q with a control character accepted", owner)
		}
		if ValidateToken(token) == nil && token <= 0 {
			t.Fatalf("token %d accepted", token)
		}
	})
}
