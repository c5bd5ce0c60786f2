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
	_, _ = rand.Read(secret) // crypto/rand.Read never fails (Go 1.24+)
	return formatHandle(id, secret)
}

// derivedHandle is the handle of an acquisition with a request id: its
// secret is an HMAC keyed by the id, so a retry with the same id (on any
// replica) can return the same handle while etcd stores only hashes.
func derivedHandle(id clientv3.LeaseID, requestID, name string) (handle string, sum []byte) {
	mac := hmac.New(sha256.New, []byte(requestID))
	fmt.Fprintf(mac, "coordinatord/handle/v1\x00%s\x00%016x", name, uint64(id))
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
