package lease

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Renewing a lease once, over the shared keepalive streams.

// renew refreshes a grant's lease and its lock-delay lease, returning the
// grant lease's TTL; ErrNotHeld if the grant's lease is gone.
func (m *Manager) renew(ctx context.Context, id, delay clientv3.LeaseID) (int64, error) {
	if delay != 0 {
		if _, err := m.keepAliveOnce(ctx, delay); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return 0, err
		}
	}
	ttl, err := m.keepAliveOnce(ctx, id)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return 0, ErrNotHeld
	}
	if err != nil {
		return 0, err
	}
	return ttl, nil
}

// keepAliveOnce renews a lease once over the shared keepalive streams
// (after Close: over a stream of its own).
func (m *Manager) keepAliveOnce(ctx context.Context, id clientv3.LeaseID) (int64, error) {
	ttl, err := m.ka.once(ctx, id)
	if errors.Is(err, errStreamClosed) {
		ka, err := m.cli.KeepAliveOnce(ctx, id)
		if err != nil {
			return 0, err
		}
		return ka.TTL, nil
	}
	return ttl, err
}
