package lease

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// ErrTooManyLocks: the identity already holds or waits for as many locks as
// it may (WithMaxLocksPerIdentity). Returned as *TooManyLocksError.
var ErrTooManyLocks = errors.New("lease: too many locks held or awaited by this identity")

// TooManyLocksError reports an acquisition refused by
// WithMaxLocksPerIdentity; nothing of it is left in etcd.
type TooManyLocksError struct {
	Count, Limit int64
}

func (e *TooManyLocksError) Error() string {
	return fmt.Sprintf("lease: this identity already holds or waits for %d locks, the most allowed is %d (--max-locks-per-identity); "+
		"release locks you no longer need (or stop waiting for some), then retry", e.Count, e.Limit)
}

// Is makes errors.Is(err, ErrTooManyLocks) true.
func (e *TooManyLocksError) Is(target error) bool { return target == ErrTooManyLocks }

// WithIdentity names the authenticated identity the acquisition counts
// against (never a value the caller chose in its request). Under
// WithMaxLocksPerIdentity, the acquisition claims one of the identity's
// slots, <prefix>owners/<sha256(id)>/<i>, on the queue key's lease, in the
// transaction that writes the queue key; it is removed with the queue key
// however the wait or grant ends (release, force-release, withdrawal,
// expiry). CountOwned counts them. An empty id, or no limit, claims nothing.
func WithIdentity(id string) AcquireOption { return func(o *acquireOptions) { o.identity = id } }

// identityHash is the index segment of an identity: a hash, so that the key
// space holds no identity in clear and every identity is a fixed-size,
// '/'-free segment.
func identityHash(id string) string { return keyspace.IdentityHash(id) }

// ownersOf is the prefix of the slots of the identity whose hash is ih.
func (k Keyspace) ownersOf(ih string) string { return k.Owners(ih) }

// CountOwned counts the locks that identity holds or waits for, across
// every replica sharing the key prefix: the live acquisitions made with
// WithIdentity(identity) under WithMaxLocksPerIdentity.
func (m *Manager) CountOwned(ctx context.Context, identity string) (int64, error) {
	r, err := m.cli.Get(ctx, m.ks.ownersOf(identityHash(identity)), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, m.etcdErr(ctx, "count owned locks", err)
	}
	return r.Count, nil
}
