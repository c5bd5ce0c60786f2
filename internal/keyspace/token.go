package keyspace

// A fencing token is one int64 made of two parts:
//
//	token = epoch << EpochShift + revision
//
// revision is the etcd create revision of the holder's queue key, epoch the
// number of etcd restores coordinatord has detected and fenced (see
// internal/epoch). In a cluster never restored the epoch is 0 and the token
// is exactly the create revision. A detected restore raises the epoch, so
// every token issued after it is greater than every token issued before,
// whatever revisions the restored etcd hands out.
//
// EpochShift is 48: revisions below 2^48 (2.8e14) last 89 years at 100,000
// etcd writes a second, and the 15 bits left below the sign give 32,767
// restores.
const EpochShift = 48

// maxRevision is the greatest revision a token can carry.
const maxRevision = 1<<EpochShift - 1

// MaxEpoch is the greatest epoch a token can carry.
const MaxEpoch = 1<<(63-EpochShift) - 1

// TokenOf is the token of create revision rev in epoch epoch. rev must be in
// [1, 2^48) and epoch in [0, MaxEpoch]; callers check with TokenFits.
func TokenOf(epoch, rev int64) int64 { return epoch<<EpochShift | rev }

// TokenFits reports whether rev and epoch can make a token.
func TokenFits(epoch, rev int64) bool {
	return epoch >= 0 && epoch <= MaxEpoch && rev > 0 && rev <= maxRevision
}

// SplitToken is the epoch and the create revision of token.
func SplitToken(token int64) (epoch, rev int64) {
	return token >> EpochShift, token & maxRevision
}

// EpochFloor is the smallest token of epoch: every token of an earlier epoch
// is below it.
func EpochFloor(epoch int64) int64 { return epoch << EpochShift }
