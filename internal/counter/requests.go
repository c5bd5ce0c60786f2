package counter

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// A request-id record keeps the first answer to a hit with a request id,
// under the caller's identity (keyspace.CounterRequest), written in the
// same transaction as the hit it answers and only if no record exists yet
// (create revision 0): two concurrent retries cannot both count. Its value
// is the digest of the hit's parameters and the answer; it rides on a
// cleanup lease that outlives both the retention and the answer's reset.

// requestDigest names the record of request id on counter name: fixed-size
// and '/'-free, whatever the name and id.
func requestDigest(name, id string) string {
	sum := sha256.Sum256([]byte(name + "\x00" + id))
	return hex.EncodeToString(sum[:16])
}

// paramsDigest stands for the parameters a retry must repeat.
func paramsDigest(h *Hit) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%d\x00%d\x00%d", h.Name, h.Hits, h.Limit, int64(h.Window), h.Algorithm))
	return hex.EncodeToString(sum[:12])
}

func encodeRecord(params string, r Result) string {
	var reset int64
	if !r.ResetAt.IsZero() {
		reset = r.ResetAt.UnixNano()
	}
	return fmt.Sprintf("%s %t %d %d %d %d", params, r.Allowed, r.Count, r.Remaining, reset, int64(r.RetryAfter))
}

// decodeRecord is the recorded answer, if its parameters are params.
func decodeRecord(v []byte, params string) (Result, error) {
	f := strings.Fields(string(v))
	var r Result
	var reset, retry int64
	if len(f) != 6 {
		return r, fmt.Errorf("request record %q: want 6 fields", v)
	}
	if f[0] != params {
		return r, ErrRequestIDReused
	}
	if _, err := fmt.Sscan(strings.Join(f[1:], " "), &r.Allowed, &r.Count, &r.Remaining, &reset, &retry); err != nil {
		return r, fmt.Errorf("request record %q: %w", v, err)
	}
	if reset != 0 {
		r.ResetAt = time.Unix(0, reset)
	}
	r.RetryAfter, r.Replayed = time.Duration(retry), true
	return r, nil
}
