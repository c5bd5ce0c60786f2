package lease

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Census counts, at one etcd revision, the locks that have a holder and the
// contenders waiting behind them, across every coordinator sharing the key
// prefix. It reads every queue key (keys only), in pages.
func (m *Manager) Census(ctx context.Context) (held, waiting int64, err error) {
	from, end := m.ks.locks(), clientv3.GetPrefixRangeEnd(m.ks.locks())
	var (
		rev  int64
		last string
		seen bool
	)
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(listBatch), clientv3.WithKeysOnly()}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		r, err := m.cli.Get(ctx, from, opts...)
		if err != nil {
			return 0, 0, m.etcdErr(ctx, "census", err)
		}
		rev = r.Header.Revision
		for _, kv := range r.Kvs {
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
		if !r.More || len(r.Kvs) == 0 {
			return held, waiting, nil
		}
		from = string(r.Kvs[len(r.Kvs)-1].Key) + "\x00"
	}
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
