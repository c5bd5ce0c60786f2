package lease

import (
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// The key layout, escaping and input rules live in internal/keyspace, the
// floor lease and fence share; what follows are the spellings the lease
// files use.

// Limits on names and owners.
const (
	MaxNameLen  = keyspace.MaxNameLen
	MaxOwnerLen = keyspace.MaxOwnerLen
)

// Keyspace is the etcd key layout under one prefix (keyspace.Keyspace),
// with the unexported spellings of its keys the lease files use.
type Keyspace struct {
	keyspace.Keyspace
}

// NewKeyspace returns the layout under prefix; a missing trailing "/" is
// added. An empty prefix means "/coordinatord/".
func NewKeyspace(prefix string) Keyspace {
	return Keyspace{Keyspace: keyspace.New(prefix)}
}

func (k Keyspace) locks() string { return k.Locks() }

func (k Keyspace) key(name string, id clientv3.LeaseID) string { return k.Key(name, id) }

// nameOf returns the escaped name of a queue key, or false if key is not one.
func (k Keyspace) nameOf(key string) (string, bool) { return k.NameOf(key) }

// delay is the lock-delay key of a lock (keyspace.Keyspace.Delay).
func (k Keyspace) delay(name string) string { return k.Delay(name) }

// session is the key that marks a lease as a session's.
func (k Keyspace) session(id clientv3.LeaseID) string { return k.Session(id) }

// sessionIndex is the prefix of a session's index of lock names.
func (k Keyspace) sessionIndex(id clientv3.LeaseID) string { return k.SessionIndex(id) }

// escape maps a name to a key segment without '/' (keyspace.Escape).
func escape(name string) string { return keyspace.Escape(name) }

func unescape(s string) string { return keyspace.Unescape(s) }

// ValidateName checks a lock name (or, with allowEmpty, a name prefix) and
// returns a *FieldError for field if it is not acceptable.
func ValidateName(field, name string, allowEmpty bool) error {
	return keyspace.ValidateName(field, name, allowEmpty)
}

// validateOwner checks an owner description (keyspace.ValidateOwner).
func validateOwner(owner string) error { return keyspace.ValidateOwner(owner) }

// ValidateToken checks a fencing token argument.
func ValidateToken(token int64) error { return keyspace.ValidateToken(token) }

// encodePageToken makes List's cursor opaque (keyspace.EncodePageToken).
func encodePageToken(escName string) string { return keyspace.EncodePageToken(escName) }

func formatLease(id clientv3.LeaseID) string { return strconv.FormatInt(int64(id), 16) }
