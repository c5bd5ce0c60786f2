// Package keyspace is the floor the domain packages (internal/lease,
// internal/fence) stand on: the etcd key layout of every subtree under the
// coordinator's prefix, the escaping of names into key segments, the rules
// for the names, owners and tokens that go into keys, the FieldError that
// reports bad input, and the pager of every paged range read.
//
// Every key the coordinator writes or reads is spelled here, so that two
// packages sharing one prefix cannot disagree about it, and a new subtree
// is added beside the others, where its independence from them shows:
//
//	<prefix>locks/<name>/<lease>           a lock's queue: one key per contender (lease)
//	<prefix>delay/<name>                   a lock's lock-delay key (lease)
//	<prefix>ended/<name>                   how a lock's last grant ended (lease)
//	<prefix>requests/<name>/<digest>       idempotency records of request ids (lease)
//	<prefix>slots/<name>/<n>               a lock's waiter slots (lease)
//	<prefix>owners/<identity>/<n>          an identity's lock slots (lease)
//	<prefix>sessions/<lease>               a session's key (lease)
//	<prefix>sessions/<lease>/locks/<name>  a session's index of locks (lease)
//	<prefix>fence/<resource>               a resource's high-water mark (fence)
//	<prefix>fence/barrier                  read only: the linearizable barrier (fence)
//	<prefix>markcounts/<identity>          an identity's count of marks (fence)
//	<prefix>counters/<name>                a rate-limit counter (counter)
//	<prefix>counterreqs/<identity>/<digest> a counter hit's request-id record (counter)
//	<prefix>readyz                         the daemon's readiness probe
//	<prefix>epoch/current                  the token epoch and its state (epoch)
//	<prefix>epoch/beacon                   the raft position last seen (epoch)
//
// <name> and <resource> are escaped (Escape), <lease> is 16 hex digits,
// <identity> is IdentityHash. The barrier key shares the marks' range: it is
// only ever read (a count), so a resource named "barrier" is unaffected.
package keyspace

import (
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Keyspace is the etcd key layout under one prefix.
type Keyspace struct{ prefix string }

// DefaultPrefix is the prefix of a Keyspace made from "".
const DefaultPrefix = "/coordinatord/"

// New returns the layout under prefix; a missing trailing "/" is added. An
// empty prefix means DefaultPrefix.
func New(prefix string) Keyspace {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return Keyspace{prefix: prefix}
}

// Prefix is the root of every key the coordinator writes.
func (k Keyspace) Prefix() string { return k.prefix }

// Locks is the prefix of every lock's queue keys.
func (k Keyspace) Locks() string { return k.prefix + "locks/" }

// Queue is the key prefix of the lock's queue: every contender's key starts
// with it and no other lock's key does.
func (k Keyspace) Queue(name string) string { return k.Locks() + Escape(name) + "/" }

// Key is the queue key of the contender on lease id.
func (k Keyspace) Key(name string, id clientv3.LeaseID) string {
	return k.Queue(name) + leaseSegment(id)
}

// NameOf returns the escaped name of a queue key, or false if key is not one.
func (k Keyspace) NameOf(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, k.Locks())
	if !ok {
		return "", false
	}
	i := strings.LastIndexByte(rest, '/')
	if i < 0 {
		return "", false
	}
	return rest[:i], true
}

// Delay is the lock-delay key of a lock: while it exists, nobody but the
// grant that wrote it (its create revision is that grant's token) may hold.
func (k Keyspace) Delay(name string) string { return k.prefix + "delay/" + Escape(name) }

// Ended is the key whose value, at the revision a grant ended, says how.
func (k Keyspace) Ended(name string) string { return k.prefix + "ended/" + Escape(name) }

// Request is the idempotency record of an acquisition of name whose
// request digest (a fixed-size, '/'-free string) is digest.
func (k Keyspace) Request(name, digest string) string {
	return k.prefix + "requests/" + Escape(name) + "/" + digest
}

// WaiterSlots is the prefix of a lock's waiter slots.
func (k Keyspace) WaiterSlots(name string) string { return k.prefix + "slots/" + Escape(name) + "/" }

// Owners is the prefix of the lock slots of the identity whose hash is ih.
func (k Keyspace) Owners(ih string) string { return k.prefix + "owners/" + ih + "/" }

// Session is the key that marks a lease as a session's.
func (k Keyspace) Session(id clientv3.LeaseID) string {
	return k.prefix + "sessions/" + leaseSegment(id)
}

// SessionIndex is the prefix of a session's index of lock names.
func (k Keyspace) SessionIndex(id clientv3.LeaseID) string { return k.Session(id) + "/locks/" }

// Marks is the prefix of every resource's high-water mark.
func (k Keyspace) Marks() string { return k.prefix + "fence/" }

// Mark is the high-water mark key of a resource.
func (k Keyspace) Mark(resource string) string { return k.Marks() + Escape(resource) }

// Barrier is the key a batch of linearizable barrier reads counts: read,
// never written.
func (k Keyspace) Barrier() string { return k.Marks() + "barrier" }

// MarkCount is the counter of the marks created by the identity whose hash
// is ih: outside the marks' range, so that listing marks never sees it.
func (k Keyspace) MarkCount(ih string) string { return k.prefix + "markcounts/" + ih }

// Epoch is the key of the current token epoch (internal/epoch).
func (k Keyspace) Epoch() string { return k.prefix + "epoch/current" }

// EpochBeacon is the key where coordinators record the raft index and term
// they saw, so that a restore, which restarts them small, shows.
func (k Keyspace) EpochBeacon() string { return k.prefix + "epoch/beacon" }

// Sessions is the prefix of every session's keys.
func (k Keyspace) Sessions() string { return k.prefix + "sessions/" }

// Requests is the prefix of every idempotency record.
func (k Keyspace) Requests() string { return k.prefix + "requests/" }

// Delays is the prefix of every lock-delay key.
func (k Keyspace) Delays() string { return k.prefix + "delay/" }

// Slots is the prefix of every lock's waiter slots.
func (k Keyspace) Slots() string { return k.prefix + "slots/" }

// AllOwners is the prefix of every identity's lock slots.
func (k Keyspace) AllOwners() string { return k.prefix + "owners/" }

// Counters is the prefix of every rate-limit counter.
func (k Keyspace) Counters() string { return k.prefix + "counters/" }

// Counter is the key of the counter name: its value is its whole state
// (window end and count, or the bucket's refill state).
func (k Keyspace) Counter(name string) string { return k.Counters() + Escape(name) }

// CounterRequest is the request-id record of a counter hit by the identity
// whose hash is ih; digest (fixed-size, '/'-free) stands for the counter's
// name and the request id.
func (k Keyspace) CounterRequest(ih, digest string) string {
	return k.prefix + "counterreqs/" + ih + "/" + digest
}

// Readyz is the key the daemon's readiness probe reads.
func (k Keyspace) Readyz() string { return k.prefix + "readyz" }

// leaseSegment is a lease id as a key segment: 16 hex digits, so that keys
// of one queue sort by lease id.
func leaseSegment(id clientv3.LeaseID) string { return fmt.Sprintf("%016x", uint64(id)) }
