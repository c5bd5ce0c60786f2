package lease

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrTooManyLocks: the identity already holds or waits for as many locks as
// it may (WithOwnedLimit). Returned as *TooManyLocksError.
var ErrTooManyLocks = errors.New("lease: too many locks held or awaited by this identity")

// TooManyLocksError reports an acquisition refused by WithOwnedLimit.
type TooManyLocksError struct {
	Count, Limit int64
}

func (e *TooManyLocksError) Error() string {
	return fmt.Sprintf("lease: this identity already holds or waits for %d locks, the most allowed is %d (--max-locks-per-identity); "+
		"release locks you no longer need (or stop waiting for some), then retry", e.Count, e.Limit)
}

// Is makes errors.Is(err, ErrTooManyLocks) true.
func (e *TooManyLocksError) Is(target error) bool { return target == ErrTooManyLocks }

// WithIdentity indexes the acquisition under the authenticated identity id
// (never a value the caller chose in its request): the queue key gets a
// companion key <prefix>owners/<sha256(id)>/<lease>/<name> on the same lease,
// written in the same transaction and removed with the queue key however the
// wait or grant ends (release, force-release, withdrawal, expiry). CountOwned
// counts them. An empty id indexes nothing.
func WithIdentity(id string) AcquireOption { return func(o *acquireOptions) { o.identity = id } }

// WithOwnedLimit refuses the acquisition with a *TooManyLocksError, writing
// nothing, when the identity of WithIdentity already holds or waits for n
// locks (0: no limit). A retry with the request id of a live acquisition is
// not refused: it joins nothing new. The limit is soft: the index is counted
// just before joining, so concurrent acquisitions of one identity may
// overshoot it by a few.
func WithOwnedLimit(n int64) AcquireOption { return func(o *acquireOptions) { o.ownedLimit = n } }

// identityHash is the index segment of an identity: a hash, so that the key
// space holds no identity in clear and every identity is a fixed-size,
// '/'-free segment.
func identityHash(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:])
}

// ownersOf is the prefix of the index of the identity whose hash is ih.
func (k Keyspace) ownersOf(ih string) string { return k.prefix + "owners/" + ih + "/" }

// owned is the index key of one acquisition: the lease and the escaped name
// make it unique (a session's lease carries several queue keys).
func (k Keyspace) owned(ih string, id clientv3.LeaseID, name string) string {
	return k.ownersOf(ih) + fmt.Sprintf("%016x", uint64(id)) + "/" + escape(name)
}

// ownedPut is the write of a's index key, if a is indexed.
func (m *Manager) ownedPut(a *attempt) []clientv3.Op {
	if a.rec.Ident == "" {
		return nil
	}
	return []clientv3.Op{clientv3.OpPut(m.ks.owned(a.rec.Ident, a.id, a.name), "", clientv3.WithLease(a.id))}
}

// ownedDelete is the removal of the index key of the queue key with record
// rec on lease id, if it is indexed.
func (m *Manager) ownedDelete(name string, id clientv3.LeaseID, rec record) []clientv3.Op {
	if rec.Ident == "" {
		return nil
	}
	return []clientv3.Op{clientv3.OpDelete(m.ks.owned(rec.Ident, id, name))}
}

// CountOwned counts the locks that identity holds or waits for, across
// every replica sharing the key prefix: the acquisitions made with
// WithIdentity(identity) that have not ended.
func (m *Manager) CountOwned(ctx context.Context, identity string) (int64, error) {
	r, err := m.cli.Get(ctx, m.ks.ownersOf(identityHash(identity)), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, m.etcdErr(ctx, "count owned locks", err)
	}
	return r.Count, nil
}

// checkOwned enforces WithOwnedLimit before an acquisition joins a queue.
func (m *Manager) checkOwned(ctx context.Context, o acquireOptions) error {
	if o.identity == "" || o.ownedLimit <= 0 {
		return nil
	}
	n, err := m.CountOwned(ctx, o.identity)
	if err != nil {
		return err
	}
	if n >= o.ownedLimit {
		return &TooManyLocksError{Count: n, Limit: o.ownedLimit}
	}
	return nil
}
