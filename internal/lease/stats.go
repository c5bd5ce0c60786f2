package lease

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// Census counts, at one etcd revision, the locks that have a holder and the
// contenders waiting behind them, across every coordinator sharing the key
// prefix. It reads every queue key (keys only), in pages.
func (m *Manager) Census(ctx context.Context) (held, waiting int64, err error) {
	var (
		last string
		seen bool
	)
	pages := keyspace.NewPager(m.cli, m.ks.locks(), clientv3.GetPrefixRangeEnd(m.ks.locks()), listBatch,
		keyspace.OneRevision(), keyspace.KeysOnly())
	for pages.Next(ctx) {
		for _, kv := range pages.Page() {
			n, ok := m.ks.nameOf(string(kv.Key))
			if !ok {
				continue
			}
			if !seen || n != last {
				held++
				last, seen = n, true
			} else {
				waiting++
			}
		}
	}
	if err := pages.Err(); err != nil {
		return 0, 0, m.etcdErr(ctx, "census", err)
	}
	return held, waiting, nil
}

// QueueLen is the number of contenders for the lock name: its holder and
// its waiters (0 when the lock is free).
func (m *Manager) QueueLen(ctx context.Context, name string) (int64, error) {
	if err := ValidateName("name", name, false); err != nil {
		return 0, err
	}
	r, err := m.cli.Get(ctx, m.ks.Queue(name), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, m.etcdErr(ctx, "queue length", err)
	}
	return r.Count, nil
}
