package lease

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// ErrRequestIDReused: a live acquisition with this request id (of this
// caller, for this lock) was made with other parameters. Nothing is written:
// a request id names one request, as idempotency keys do in payment APIs.
var ErrRequestIDReused = errors.New("lease: request_id reused with different parameters (ttl, max_hold, lock_delay or owner): use a new request_id for a new request")

// The idempotency record of an acquisition with a request id lives at
//
//	<prefix>requests/<escaped name>/<hex sha256(len-prefixed "v2", identity, request id)>
//
// on the acquisition's lease, written in the join's transaction and deleted
// by its release. Only a hash of the id is stored: the id is a secret from
// which (with the record's salt) the handle is derived. Records written by
// versions before v2 (keyed by name and id alone, valued by the bare lease
// id) are never read: a retry after an upgrade is a new acquisition, and the
// old one, if still queued or held, ends with its lease as an abandoned one
// would.
func (k Keyspace) request(identity, name, requestID string) string {
	h := sha256.New()
	writeFields(h, "coordinatord/request/v2", identity, requestID)
	return k.Request(name, hex.EncodeToString(h.Sum(nil)))
}

// requestRecord is the value of an idempotency record.
type requestRecord struct {
	// Lease is the acquisition's lease, hex: its queue key is
	// Queue(name)+Lease and the record lives on it.
	Lease string `json:"lease"`
	// Salt is random, per acquisition: it enters the handle's derivation,
	// so that knowing the request id (and the caller, name and lease) is
	// not enough to compute the handle without reading etcd.
	Salt []byte `json:"salt"`
	// Params is the digest of the parameters that shape the grant
	// (paramsDigest): a retry must match it.
	Params []byte `json:"params"`
}

func (r requestRecord) encode() string {
	b, _ := json.Marshal(r) // cannot fail: plain fields
	return string(b)
}

// decodeRequestRecord reads a record of this version, or reports false (a
// foreign or older value: not ours to interpret).
func decodeRequestRecord(kv []byte, lease int64) (requestRecord, bool) {
	var r requestRecord
	if json.Unmarshal(kv, &r) != nil || len(r.Salt) != secretLen || len(r.Params) == 0 {
		return r, false
	}
	if v, err := strconv.ParseInt(r.Lease, 16, 64); err != nil || v != lease {
		return r, false
	}
	return r, true
}

// newRequestRecord is the record of a new acquisition of o on lease id.
func newRequestRecord(id clientv3.LeaseID, o acquireOptions) requestRecord {
	salt := make([]byte, secretLen)
	secrets.read(salt)
	return requestRecord{Lease: strconv.FormatInt(int64(id), 16), Salt: salt, Params: paramsDigest(o)}
}

// given records which grant parameters the caller set: unset is a value of
// its own in the request digest.
type given uint8

const (
	givenTTL given = 1 << iota
	givenMaxHold
	givenLockDelay
)

// paramsDigest is the SHA-256 of the parameters that shape a grant, as the
// caller gave them: the TTL, max hold, lock-delay and owner, each unset or
// its value. The wait is not one: a retry may well wait longer. The name and
// caller are in the record's key. As given, not after defaults: the answer
// to a retry does not depend on which replica's defaults it meets.
func paramsDigest(o acquireOptions) []byte {
	h := sha256.New()
	param := func(g given, d time.Duration) string {
		if o.given&g == 0 {
			return "unset"
		}
		return strconv.FormatInt(int64(d), 10)
	}
	writeFields(h, "coordinatord/params/v1", param(givenTTL, o.ttl), param(givenMaxHold, o.maxHold),
		param(givenLockDelay, o.lockDelay), o.owner)
	if o.shape != (keyspace.Shape{}) { // a mutex's digest is as before semaphores
		writeFields(h, "limit", strconv.Itoa(int(o.shape.Limit)), "shared", strconv.FormatBool(o.shape.Shared))
	}
	return h.Sum(nil)
}

// handle derives the acquisition's handle: a retry (on any replica) with the
// same caller, name and request id recomputes it, while etcd stores only
// its hash.
func (r requestRecord) handle(id clientv3.LeaseID, o acquireOptions, name string) (string, []byte) {
	return derivedHandle(id, o.requestID, o.caller, name, r.Salt)
}

// checkRequest checks that a retry's parameters are those of the record.
func (r requestRecord) checkRequest(o acquireOptions) error {
	if !sameHash(r.Params, paramsDigest(o)) {
		return ErrRequestIDReused
	}
	return nil
}

func validateRequestID(id string) error {
	if id == "" {
		return nil
	}
	if len(id) < MinRequestIDLen || len(id) > MaxRequestIDLen {
		return fieldErr("request_id", "is %d bytes long; use %d to %d bytes of printable ASCII (a random UUID is ideal)", len(id), MinRequestIDLen, MaxRequestIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x21 || c > 0x7e {
			return fieldErr("request_id", "must be printable ASCII without spaces or control characters; byte %d is 0x%02x", i, c)
		}
	}
	return nil
}

// writeFields writes each field length-prefixed, so that no two field
// lists share an encoding whatever bytes they hold.
func writeFields(w interface{ Write([]byte) (int, error) }, fields ...string) {
	for _, f := range fields {
		fmt.Fprintf(w, "%d:%s", len(f), f)
	}
}
