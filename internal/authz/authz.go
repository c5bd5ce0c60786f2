// Package authz decides who may use which lock names and protected
// resources: caller identities (from a verified client certificate or a
// bearer token), a policy file mapping identities to name prefixes, and
// their reloading. It knows nothing of gRPC.
package authz

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
)

// Policy maps identities to what they may use. The file format is JSON:
//
//	{
//	  "admins": ["spiffe://example.org/ops"],
//	  "identities": {
//	    "spiffe://example.org/team-a": {
//	      "lock_prefixes": ["team-a/"],
//	      "resource_prefixes": ["team-a/"]
//	    }
//	  }
//	}
//
// An identity may use a lock name (Acquire, Release, KeepAlive,
// ValidateToken, Describe and any call naming a lock) when the name starts
// with one of its lock_prefixes, a resource (ValidateToken.resource) when it
// starts with one of its resource_prefixes, List a prefix that itself
// starts with one of its lock_prefixes, and list the marks (ListMarks) of a
// prefix that itself starts with one of its resource_prefixes. The empty prefix "" matches every
// name. Admins may do everything, including admin-only calls. An identity
// not in the file may do nothing.
type Policy struct {
	Admins     []string         `json:"admins"`
	Identities map[string]Grant `json:"identities"`
}

// Grant is what one identity may use.
type Grant struct {
	LockPrefixes     []string `json:"lock_prefixes"`
	ResourcePrefixes []string `json:"resource_prefixes"`
}

// ParsePolicy reads a policy; unknown fields are errors (a typo must not
// silently grant or deny).
func ParsePolicy(b []byte) (*Policy, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var p Policy
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("authz: policy: %w", err)
	}
	if dec.More() {
		return nil, errors.New("authz: policy: trailing data after the JSON object")
	}
	for _, a := range p.Admins {
		if a == "" {
			return nil, errors.New("authz: policy: an empty admin identity")
		}
	}
	for id := range p.Identities {
		if id == "" {
			return nil, errors.New("authz: policy: an empty identity")
		}
	}
	return &p, nil
}

// IsAdmin tells whether id is an admin.
func (p *Policy) IsAdmin(id string) bool {
	for _, a := range p.Admins {
		if a == id {
			return true
		}
	}
	return false
}

// Known tells whether id is an admin or has an entry in the policy.
func (p *Policy) Known(id string) bool {
	_, ok := p.Identities[id]
	return ok || p.IsAdmin(id)
}

func hasPrefix(prefixes []string, s string) bool {
	for _, pre := range prefixes {
		if strings.HasPrefix(s, pre) {
			return true
		}
	}
	return false
}

// MayLock tells whether id may use the lock name.
func (p *Policy) MayLock(id, name string) bool {
	return p.IsAdmin(id) || hasPrefix(p.Identities[id].LockPrefixes, name)
}

// MayList tells whether id may list the locks whose names start with
// prefix: only if every such name is one it may use.
func (p *Policy) MayList(id, prefix string) bool { return p.MayLock(id, prefix) }

// MayResource tells whether id may validate against the resource.
func (p *Policy) MayResource(id, resource string) bool {
	return p.IsAdmin(id) || hasPrefix(p.Identities[id].ResourcePrefixes, resource)
}

// MayListResources tells whether id may list the marks of the resources
// whose names start with prefix: only if every such name is one it may use.
func (p *Policy) MayListResources(id, prefix string) bool { return p.MayResource(id, prefix) }

// Tokens maps the SHA-256 of bearer tokens to identities. The file has one
// "identity sha256-hex-of-token" pair per line; blank lines and lines
// starting with '#' are skipped. Only hashes are stored, so the file does
// not reveal the tokens.
type Tokens map[[sha256.Size]byte]string

// ParseTokens reads a token file. Its errors name the line number, never
// the line: a line may hold a raw token pasted by mistake, and errors end up
// in logs.
func ParseTokens(b []byte) (Tokens, error) {
	t := Tokens{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("authz: tokens line %d: want \"identity sha256-hex\"", n)
		}
		raw, err := hex.DecodeString(f[1])
		if err != nil || len(raw) != sha256.Size {
			return nil, fmt.Errorf("authz: tokens line %d: the second field is not a hex SHA-256 (64 hex digits): store the token's hash, never the token", n)
		}
		var h [sha256.Size]byte
		copy(h[:], raw)
		if _, dup := t[h]; dup {
			return nil, fmt.Errorf("authz: tokens line %d: the same token hash twice", n)
		}
		t[h] = f[0]
	}
	return t, sc.Err()
}

// Lookup returns the identity of a bearer token.
func (t Tokens) Lookup(token string) (string, bool) {
	id, ok := t[sha256.Sum256([]byte(token))]
	return id, ok
}

// IdentityFromCert is the identity of a verified client certificate: its
// first URI SAN (e.g. a SPIFFE ID), else its first DNS SAN; "" if it has
// neither. The subject common name counts only with fromCN, after both: a CN
// is free text in the same namespace as the SANs, so without that explicit
// choice a CA-signed certificate with CN "spiffe://example.org/admin" and no
// SANs would become that admin.
func IdentityFromCert(c *x509.Certificate, fromCN bool) string {
	switch {
	case len(c.URIs) > 0:
		return c.URIs[0].String()
	case len(c.DNSNames) > 0:
		return c.DNSNames[0]
	case fromCN:
		return c.Subject.CommonName
	}
	return ""
}

type ctxKey struct{}

// NewContext returns ctx carrying the caller's identity.
func NewContext(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// FromContext returns the caller's identity, if authenticated.
func FromContext(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(ctxKey{}).(string)
	return id, ok
}

// Store holds the current policy and tokens, read from files, and reloads
// them. A reload that fails keeps the previous, working version.
type Store struct {
	policyFile, tokenFile string

	mu       sync.Mutex // serialises reloads
	stamp    string
	policy   atomic.Pointer[Policy]
	tokens   atomic.Pointer[Tokens]
	onChange []func()
}

// OnChange registers fn to run after every reload that loaded new files
// (not at the first load), once the new policy and tokens are in force:
// the server re-checks its open streams there. fn runs on the reloading
// goroutine, with reloads held off: it must not call Reload.
func (s *Store) OnChange(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onChange = append(s.onChange, fn)
}

// NewStore loads policyFile (required) and tokenFile (optional).
func NewStore(policyFile, tokenFile string) (*Store, error) {
	if policyFile == "" {
		return nil, errors.New("authz: a policy file is required")
	}
	s := &Store{policyFile: policyFile, tokenFile: tokenFile}
	if _, err := s.reload(true); err != nil {
		return nil, err
	}
	return s, nil
}

// Policy is the current policy.
func (s *Store) Policy() *Policy { return s.policy.Load() }

// Tokens are the current bearer tokens (empty without a token file).
func (s *Store) Tokens() Tokens {
	if t := s.tokens.Load(); t != nil {
		return *t
	}
	return nil
}

// Reload re-reads both files. It reports whether anything changed.
func (s *Store) Reload() (bool, error) { return s.reload(true) }

// ReloadIfChanged re-reads the files only if their modification time or
// size changed since the last load.
func (s *Store) ReloadIfChanged() (bool, error) { return s.reload(false) }

func (s *Store) reload(force bool) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	stamp, err := stampOf(s.policyFile, s.tokenFile)
	if err != nil {
		return false, err
	}
	if !force && stamp == s.stamp {
		return false, nil
	}
	b, err := os.ReadFile(s.policyFile)
	if err != nil {
		return false, fmt.Errorf("authz: %w", err)
	}
	p, err := ParsePolicy(b)
	if err != nil {
		return false, fmt.Errorf("%w (in %s)", err, s.policyFile)
	}
	var t Tokens
	if s.tokenFile != "" {
		b, err := os.ReadFile(s.tokenFile)
		if err != nil {
			return false, fmt.Errorf("authz: %w", err)
		}
		if t, err = ParseTokens(b); err != nil {
			return false, fmt.Errorf("%w (in %s)", err, s.tokenFile)
		}
	}
	s.policy.Store(p)
	s.tokens.Store(&t)
	s.stamp = stamp
	for _, fn := range s.onChange {
		fn()
	}
	return true, nil
}

func stampOf(files ...string) (string, error) {
	var stamp string
	for _, f := range files {
		if f == "" {
			continue
		}
		fi, err := os.Stat(f)
		if err != nil {
			return "", fmt.Errorf("authz: %w", err)
		}
		stamp += fmt.Sprintf("%s:%d:%d;", f, fi.ModTime().UnixNano(), fi.Size())
	}
	return stamp, nil
}
