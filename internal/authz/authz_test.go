package authz_test

import (
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coordinatord/coordinatord/internal/authz"
)

const policy = `{
  "admins": ["ops"],
  "identities": {
    "team-a": {"lock_prefixes": ["a/", "shared/"], "resource_prefixes": ["db-a"]},
    "everything": {"lock_prefixes": [""]}
  }
}`

func TestPolicy(t *testing.T) {
	p, err := authz.ParsePolicy([]byte(policy))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id, what, value string
		want            bool
	}{
		{"team-a", "lock", "a/x", true},
		{"team-a", "lock", "shared/x", true},
		{"team-a", "lock", "a", false},
		{"team-a", "lock", "b/x", false},
		{"team-a", "lock", "", false},
		{"team-a", "list", "a/", true},
		{"team-a", "list", "a/sub", true},
		{"team-a", "list", "a", false},
		{"team-a", "list", "", false},
		{"team-a", "resource", "db-a", true},
		{"team-a", "resource", "db-b", false},
		{"ops", "lock", "anything", true},
		{"ops", "list", "", true},
		{"ops", "resource", "any", true},
		{"everything", "lock", "z", true},
		{"everything", "list", "", true},
		{"everything", "resource", "db-a", false},
		{"stranger", "lock", "a/x", false},
		{"stranger", "list", "", false},
		{"", "lock", "a/x", false},
	} {
		var got bool
		switch tc.what {
		case "lock":
			got = p.MayLock(tc.id, tc.value)
		case "list":
			got = p.MayList(tc.id, tc.value)
		case "resource":
			got = p.MayResource(tc.id, tc.value)
		}
		if got != tc.want {
			t.Errorf("%s may %s %q = %v, want %v", tc.id, tc.what, tc.value, got, tc.want)
		}
	}
	if !p.IsAdmin("ops") || p.IsAdmin("team-a") {
		t.Error("IsAdmin wrong")
	}
}

func TestParseErrors(t *testing.T) {
	for _, bad := range []string{
		`{"admin": ["typo"]}`,
		`{"identities": {"x": {"prefixes": ["a/"]}}}`,
		`{"admins": [""]}`,
		`{"identities": {"": {}}}`,
		`{} {}`,
		`not json`,
	} {
		if _, err := authz.ParsePolicy([]byte(bad)); err == nil {
			t.Errorf("ParsePolicy(%s): no error", bad)
		}
	}
	for _, bad := range []string{"one-field", "id nothex", "id " + hex.EncodeToString([]byte("short")), "a " + hash("t") + "\nb " + hash("t")} {
		if _, err := authz.ParseTokens([]byte(bad)); err == nil {
			t.Errorf("ParseTokens(%q): no error", bad)
		}
	}
}

// A token-file error names the line, never its content: a raw token pasted
// by mistake must not reach the logs.
func TestTokenFileErrorsNameTheLineNotItsContent(t *testing.T) {
	const secret = "raw-secret-token-0123456789"
	for _, tc := range []struct {
		file string
		line string
	}{
		{"# comment\n\nalice " + secret + "\n", "line 3"},
		{"alice " + hash("x") + "\nbob " + secret + " extra\n", "line 2"},
		{secret + "\n", "line 1"},
		{"alice " + hash("x") + "\n" + secret + " " + hash("x") + "\n", "line 2"},
	} {
		_, err := authz.ParseTokens([]byte(tc.file))
		if err == nil {
			t.Fatalf("ParseTokens(%q): no error", tc.file)
		}
		if !strings.Contains(err.Error(), tc.line) || strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "alice") || strings.Contains(err.Error(), "bob") {
			t.Errorf("ParseTokens error %q: want %q and no content of the file", err, tc.line)
		}
	}
}

func hash(tok string) string { s := sha256.Sum256([]byte(tok)); return hex.EncodeToString(s[:]) }

func TestTokens(t *testing.T) {
	tk, err := authz.ParseTokens([]byte("# sidecar tokens\n\napp-1 " + hash("s3cret") + "\napp-2 " + hash("other") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := tk.Lookup("s3cret"); !ok || id != "app-1" {
		t.Errorf("Lookup(s3cret) = %q, %v", id, ok)
	}
	for _, guess := range []string{"", "s3cre", "s3cret ", hash("s3cret")} {
		if id, ok := tk.Lookup(guess); ok {
			t.Errorf("Lookup(%q) = %q: a wrong token was accepted", guess, id)
		}
	}
}

func TestIdentityFromCertOrder(t *testing.T) {
	u, _ := url.Parse("spiffe://example.org/team-a")
	for _, tc := range []struct {
		c    x509.Certificate
		want string
	}{
		{x509.Certificate{URIs: []*url.URL{u}, DNSNames: []string{"a.example"}, Subject: pkix.Name{CommonName: "cn"}}, "spiffe://example.org/team-a"},
		{x509.Certificate{DNSNames: []string{"a.example", "b.example"}, Subject: pkix.Name{CommonName: "cn"}}, "a.example"},
		{x509.Certificate{Subject: pkix.Name{CommonName: "cn"}}, ""},
		{x509.Certificate{Subject: pkix.Name{CommonName: "spiffe://example.org/admin"}}, ""},
		{x509.Certificate{}, ""},
	} {
		if got := authz.IdentityFromCert(&tc.c, false); got != tc.want {
			t.Errorf("IdentityFromCert = %q, want %q", got, tc.want)
		}
	}
	// The CN only with the explicit choice, and only after both SANs.
	for _, tc := range []struct {
		c    x509.Certificate
		want string
	}{
		{x509.Certificate{Subject: pkix.Name{CommonName: "cn"}}, "cn"},
		{x509.Certificate{DNSNames: []string{"a.example"}, Subject: pkix.Name{CommonName: "cn"}}, "a.example"},
	} {
		if got := authz.IdentityFromCert(&tc.c, true); got != tc.want {
			t.Errorf("IdentityFromCert(fromCN) = %q, want %q", got, tc.want)
		}
	}
}

func TestStoreReload(t *testing.T) {
	dir := t.TempDir()
	pf, tf := filepath.Join(dir, "policy.json"), filepath.Join(dir, "tokens")
	write := func(f, s string) {
		t.Helper()
		if err := os.WriteFile(f, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(pf, `{"identities": {"a": {"lock_prefixes": ["a/"]}}}`)
	write(tf, "a "+hash("tok-a"))
	s, err := authz.NewStore(pf, tf)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Policy().MayLock("a", "a/1") || s.Policy().MayLock("a", "b/1") {
		t.Fatal("initial policy wrong")
	}
	if changed, err := s.ReloadIfChanged(); changed || err != nil {
		t.Fatalf("ReloadIfChanged without a change = %v, %v", changed, err)
	}

	time.Sleep(10 * time.Millisecond) // a new mtime
	write(pf, `{"identities": {"a": {"lock_prefixes": ["a/", "b/"]}}}`)
	write(tf, "b "+hash("tok-b"))
	if changed, err := s.ReloadIfChanged(); !changed || err != nil {
		t.Fatalf("ReloadIfChanged after a change = %v, %v", changed, err)
	}
	if !s.Policy().MayLock("a", "b/1") {
		t.Fatal("reloaded policy not in effect")
	}
	if _, ok := s.Tokens().Lookup("tok-a"); ok {
		t.Fatal("a removed token still works")
	}
	if id, ok := s.Tokens().Lookup("tok-b"); !ok || id != "b" {
		t.Fatal("an added token does not work")
	}

	time.Sleep(10 * time.Millisecond)
	write(pf, `{"identities": {"a": {"lock_prefix": ["oops"]}}}`)
	if _, err := s.ReloadIfChanged(); err == nil {
		t.Fatal("a broken policy reloaded without error")
	}
	if !s.Policy().MayLock("a", "b/1") {
		t.Fatal("a broken reload replaced the working policy")
	}

	if _, err := authz.NewStore("", ""); err == nil {
		t.Error("NewStore without a policy: no error")
	}
	if _, err := authz.NewStore(filepath.Join(dir, "missing"), ""); err == nil {
		t.Error("NewStore with a missing policy: no error")
	}
}
