package lease

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A handle is "<lease id, 16 hex digits>.<128 random bits, base64url>". The
// lease id locates the grant's queue key; the random part is the secret whose
// SHA-256 is stored in etcd.
const (
	secretLen = 16
	handleLen = 16 + 1 + 22
)

func newHandle(id clientv3.LeaseID) (handle string, sum []byte) {
	secret := make([]byte, secretLen)
	secrets.read(secret)
	return formatHandle(id, secret)
}

// secrets hands out crypto/rand bytes from a buffer refilled 4 KiB at a
// time: one getrandom system call per 256 handles instead of one each (that
// call was ~4% of the coordinator's CPU under load). Every byte is handed
// out once and wiped from the buffer as it is.
var secrets randomBuffer

type randomBuffer struct {
	mu  sync.Mutex
	buf [4096]byte
	off int  // the bytes before off are used
	ok  bool // filled at least once
}

func (r *randomBuffer) read(p []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.ok || r.off+len(p) > len(r.buf) {
		_, _ = rand.Read(r.buf[:]) // crypto/rand.Read never fails (Go 1.24+)
		r.off, r.ok = 0, true
	}
	n := copy(p, r.buf[r.off:])
	clear(r.buf[r.off : r.off+n])
	r.off += n
}

// derivedHandle is the handle of an acquisition with a request id: its
// secret is an HMAC keyed by the id over the caller's identity, the name,
// the lease and the request record's random salt, so a retry by the same
// caller with the same id (on any replica) can return the same handle while
// etcd stores only hashes. Another identity sending the id reads another
// record (Keyspace.request) and derives another handle; and without the salt,
// which only etcd holds, even the id does not yield the handle.
func derivedHandle(id clientv3.LeaseID, requestID, caller, name string, salt []byte) (handle string, sum []byte) {
	mac := hmac.New(sha256.New, []byte(requestID))
	writeFields(mac, "coordinatord/handle/v2", caller, name, fmt.Sprintf("%016x", uint64(id)), string(salt))
	return formatHandle(id, mac.Sum(nil)[:secretLen])
}

func formatHandle(id clientv3.LeaseID, secret []byte) (string, []byte) {
	h := sha256.Sum256(secret)
	return fmt.Sprintf("%016x.%s", uint64(id), base64.RawURLEncoding.EncodeToString(secret)), h[:]
}

// parseHandle splits a handle into its lease id and the hash of its secret.
func parseHandle(handle string) (clientv3.LeaseID, []byte, error) {
	bad := fieldErr("handle", "is malformed; pass the handle exactly as Acquire returned it")
	if len(handle) != handleLen || handle[16] != '.' {
		return 0, nil, bad
	}
	// One spelling per handle: lower-case hex, canonical base64.
	idb, err := hex.DecodeString(handle[:16])
	if err != nil || strings.ToLower(handle[:16]) != handle[:16] {
		return 0, nil, bad
	}
	secret, err := base64.RawURLEncoding.Strict().DecodeString(handle[17:])
	if err != nil || len(secret) != secretLen {
		return 0, nil, bad
	}
	var id uint64
	for _, b := range idb {
		id = id<<8 | uint64(b)
	}
	if id == 0 || int64(id) < 0 {
		return 0, nil, bad
	}
	h := sha256.Sum256(secret)
	return clientv3.LeaseID(id), h[:], nil
}

func sameHash(a, b []byte) bool { return len(a) == len(b) && subtle.ConstantTimeCompare(a, b) == 1 }
