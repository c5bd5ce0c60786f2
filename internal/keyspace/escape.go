package keyspace

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// Escape maps a name to a key segment that contains no '/': '%' and '/' are
// percent-encoded, every other byte is kept. The mapping is injective and
// prefix-preserving (a is a prefix of b iff Escape(a) is a prefix of
// Escape(b)), which keeps names independent and listing by prefix exact.
func Escape(name string) string {
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

// Unescape inverts Escape.
func Unescape(seg string) string {
	if !strings.Contains(seg, "%") {
		return seg
	}
	return strings.NewReplacer("%25", "%", "%2F", "/").Replace(seg)
}

// IdentityHash is the key segment of an identity: a hash, so that the key
// space holds no identity in clear and every identity is a fixed-size,
// '/'-free segment.
func IdentityHash(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:])
}
