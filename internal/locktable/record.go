package locktable

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Record is what etcd keeps of a grant, under its own key: enough for a new
// owner to honour it (Load) and to recognise its handle and request id.
// The handle's secret is kept only as its SHA-256.
type Record struct {
	Name       string `json:"n"`
	ID         string `json:"id"`
	Caller     string `json:"c,omitempty"`
	Owner      string `json:"o,omitempty"`
	RequestID  string `json:"r,omitempty"` // SHA-256 of the request id, hex
	TTLms      int64  `json:"ttl"`
	MaxHoldMs  int64  `json:"mh,omitempty"` // max hold left at AcquiredMs, 0: unbounded
	AcquiredMs int64  `json:"at"`           // Unix milliseconds
	Limit      int32  `json:"l,omitempty"`
	Slot       int32  `json:"s,omitempty"`
	Shared     bool   `json:"sh,omitempty"`
	// LockDelayMs is the grant's lock-delay (applied if it expires).
	LockDelayMs int64  `json:"ld,omitempty"`
	Secret      string `json:"h"` // SHA-256 of the handle's secret, hex
	// Session is the id of the session the grant is held through: its
	// handle is "<session id>.<secret>".
	Session string `json:"ss,omitempty"`
	// Reservation is the slot of its caller's per-identity lock count
	// the grant holds (Acquire.Reservation; reservation.go).
	Reservation string `json:"rv,omitempty"`
}

func (r Record) encode() string {
	b, _ := json.Marshal(r) // a struct of strings and numbers always encodes
	return string(b)
}

// DecodeRecord reads a grant's record as Record.encode wrote it.
func DecodeRecord(v []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(v, &r); err != nil {
		return Record{}, fmt.Errorf("locktable: grant record: %w", err)
	}
	if r.Name == "" || r.ID == "" || r.TTLms <= 0 || r.Secret == "" {
		return Record{}, fmt.Errorf("locktable: grant record %q of %q is incomplete", r.ID, r.Name)
	}
	return r, nil
}

// A handle is "<grant id>.<secret, base64url of 16 bytes>". The grant id
// locates the grant; the secret proves the caller is its grantee.
func formatHandle(id string, secret []byte) string {
	return id + "." + base64.RawURLEncoding.EncodeToString(secret)
}

// parseHandle splits a handle into its grant id and secret.
func parseHandle(h string) (id string, secret []byte, ok bool) {
	i := strings.LastIndexByte(h, '.')
	if i <= 0 {
		return "", nil, false
	}
	s, err := base64.RawURLEncoding.Strict().DecodeString(h[i+1:])
	if err != nil || len(s) != 16 {
		return "", nil, false
	}
	return h[:i], s, true
}

// secretSum is the hex SHA-256 of a handle's secret, as a record keeps it.
func secretSum(secret []byte) string {
	s := sha256.Sum256(secret)
	return fmt.Sprintf("%x", s[:])
}

// sumMatches compares a secret against a record's sum in constant time.
func sumMatches(secret []byte, sum string) bool {
	return subtle.ConstantTimeCompare([]byte(secretSum(secret)), []byte(sum)) == 1
}

// derivedSecret is the secret of a grant made with a request id: an HMAC
// keyed by the id over the caller, the name and the grant id, so that a
// retry by the same caller with the same id gets the same handle from any
// owner (a new one after a takeover too) while etcd keeps only hashes.
// Another identity sending the same id derives another secret.
func derivedSecret(requestID, caller, name, id string) []byte {
	m := hmac.New(sha256.New, []byte(requestID))
	m.Write([]byte(caller + "\x00" + name + "\x00" + id))
	return m.Sum(nil)[:16]
}

// requestDigest is how a record names its request id: the id itself is a
// secret of its caller (it derives the handle).
func requestDigest(caller, requestID string) string {
	if requestID == "" {
		return ""
	}
	s := sha256.Sum256([]byte(caller + "\x00" + requestID))
	return fmt.Sprintf("%x", s[:])
}

func millis(d time.Duration) int64 { return d.Milliseconds() }
