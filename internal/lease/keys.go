package lease

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Limits on names and owners.
const (
	MaxNameLen  = 512
	MaxOwnerLen = 256
)

// Keyspace is the etcd key layout under one prefix.
type Keyspace struct{ prefix string }

// NewKeyspace returns the layout under prefix; a missing trailing "/" is
// added. An empty prefix means "/coordinatord/".
func NewKeyspace(prefix string) Keyspace {
	if prefix == "" {
		prefix = "/coordinatord/"
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return Keyspace{prefix: prefix}
}

// Prefix is the root of every key the coordinator writes.
func (k Keyspace) Prefix() string { return k.prefix }

func (k Keyspace) locks() string { return k.prefix + "locks/" }

// Locks is the prefix of every lock's queue keys.
func (k Keyspace) Locks() string { return k.locks() }

// Queue is the key prefix of the lock's queue: every contender's key starts
// with it and no other lock's key does.
func (k Keyspace) Queue(name string) string { return k.locks() + escape(name) + "/" }

func (k Keyspace) key(name string, id clientv3.LeaseID) string {
	return k.Queue(name) + fmt.Sprintf("%016x", uint64(id))
}

// nameOf returns the escaped name of a queue key, or false if key is not one.
func (k Keyspace) nameOf(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, k.locks())
	if !ok {
		return "", false
	}
	i := strings.LastIndexByte(rest, '/')
	if i < 0 {
		return "", false
	}
	return rest[:i], true
}

// escape maps a name to a key segment that contains no '/': '%' and '/' are
// percent-encoded, every other byte is kept. The mapping is injective and
// prefix-preserving (a is a prefix of b iff escape(a) is a prefix of
// escape(b)), which keeps names independent and List by prefix exact.
func escape(name string) string {
	if !strings.ContainsAny(name, "%/") {
		return name
	}
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		switch c := name[i]; c {
		case '%':
			b.WriteString("%25")
		case '/':
			b.WriteString("%2F")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func unescape(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	return strings.NewReplacer("%25", "%", "%2F", "/").Replace(s)
}

// ValidateName checks a lock name (or, with allowEmpty, a name prefix) and
// returns a *FieldError for field if it is not acceptable.
func ValidateName(field, name string, allowEmpty bool) error {
	switch {
	case name == "" && !allowEmpty:
		return fieldErr(field, "must not be empty")
	case len(name) > MaxNameLen:
		return fieldErr(field, "is %d bytes long; at most %d are allowed", len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return fieldErr(field, "must be valid UTF-8")
	}
	return noControlCharacters(field, name)
}

// noControlCharacters refuses the characters that forge rows, run terminal
// escapes or hide text when a value is printed in a terminal or a log line:
// C0 and C1 controls (U+0000..U+001F, U+007F..U+009F; U+009B is CSI on
// many terminals) and the bidi controls that reorder what is shown
// (U+061C, U+200E, U+200F, U+202A..U+202E, U+2066..U+2069).
func noControlCharacters(field, s string) error {
	for i, r := range s {
		if unicode.IsControl(r) || isBidiControl(r) {
			return fieldErr(field, "contains control character %U at byte %d; use printable text", r, i)
		}
	}
	return nil
}

func isBidiControl(r rune) bool {
	switch {
	case r == 0x061c, r == 0x200e, r == 0x200f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// validateOwner checks an owner description (of a lock or a session): free
// text, shown by Describe, List and coordctl, so it obeys the rules of
// names, except that it may be empty.
func validateOwner(owner string) error {
	switch {
	case len(owner) > MaxOwnerLen:
		return fieldErr("owner", "is %d bytes long; at most %d are allowed", len(owner), MaxOwnerLen)
	case !utf8.ValidString(owner):
		return fieldErr("owner", "must be valid UTF-8")
	}
	return noControlCharacters("owner", owner)
}

// ValidateToken checks a fencing token argument.
func ValidateToken(token int64) error {
	if token <= 0 {
		return fieldErr("token", "must be a positive fencing token as returned by Acquire, got %d", token)
	}
	return nil
}

// encodePageToken and decodePageToken make List's cursor opaque.
func encodePageToken(escName string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(escName))
}

func decodePageToken(tok string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) == 0 {
		return "", fieldErr("page_token", "is not a token returned by List; pass next_page_token unchanged or leave it empty")
	}
	return string(b), nil
}

func formatLease(id clientv3.LeaseID) string { return strconv.FormatInt(int64(id), 16) }

// delay is the lock-delay key of a lock: while it exists, nobody but the
// grant that wrote it (its create revision is that grant's token) may hold.
func (k Keyspace) delay(name string) string { return k.prefix + "delay/" + escape(name) }

// session is the key that marks a lease as a session's.
func (k Keyspace) session(id clientv3.LeaseID) string {
	return k.prefix + "sessions/" + fmt.Sprintf("%016x", uint64(id))
}

// sessionIndex is the prefix of a session's index of lock names.
func (k Keyspace) sessionIndex(id clientv3.LeaseID) string {
	return k.session(id) + "/locks/"
}
