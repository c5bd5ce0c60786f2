package fence

import (
	"context"
	"fmt"
	"strconv"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/etcdx"
	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// DeleteMark removes the mark id names (ErrNoMark if it has none) and
// frees its place in its creator's cap, for admins. It never lets a stale
// token through: a token validates only while its grant's queue key exists,
// and etcd never recreates a key with the same create revision, so every
// token whose grant has ended stays refused by the lock check alone. What
// is lost is the mark's ownership: the next lock to validate a current
// token against the resource owns it. It returns the mark as it was.
func (v *Validator) DeleteMark(ctx context.Context, id MarkID) (*Mark, error) {
	if err := id.validate(); err != nil {
		return nil, err
	}
	for range maxAttempts {
		kv, m, err := v.readMark(ctx, id)
		if err != nil {
			return nil, err
		}
		ok, err := v.deleteIf(ctx, kv, m)
		if err != nil {
			return nil, err
		}
		if ok {
			return &m, nil
		}
	}
	return nil, fmt.Errorf("%w: %w (resource %q); retry", etcdx.ErrUnavailable, errConflict, id.Resource)
}

// RebindMark gives the mark id names to lock, for admins: the token is
// kept (a token below it is still refused), and from then on only lock's
// tokens raise it. ErrNoMark if it has none. It returns the mark after the
// change.
func (v *Validator) RebindMark(ctx context.Context, id MarkID, lock string) (*Mark, error) {
	if err := id.validate(); err != nil {
		return nil, err
	}
	if err := keyspace.ValidateName("lock", lock, false); err != nil {
		return nil, err
	}
	for range maxAttempts {
		kv, m, err := v.readMark(ctx, id)
		if err != nil {
			return nil, err
		}
		if m.Lock == lock {
			return &m, nil
		}
		m.Lock, m.idleSince = lock, timeZero
		ok, err := v.replaceIf(ctx, kv, m)
		if err != nil {
			return nil, err
		}
		if ok {
			return &m, nil
		}
	}
	return nil, fmt.Errorf("%w: %w (resource %q); retry", etcdx.ErrUnavailable, errConflict, id.Resource)
}

// readMark reads the key of the mark id names, or ErrNoMark.
func (v *Validator) readMark(ctx context.Context, id MarkID) (*mvccpb.KeyValue, Mark, error) {
	r, err := v.cli.Get(ctx, id.key(v.ks))
	if err != nil {
		return nil, Mark{}, v.etcdErr(ctx, "get mark", err)
	}
	if len(r.Kvs) == 0 {
		return nil, Mark{}, id.noMark()
	}
	return r.Kvs[0], decodeMark(id, r.Kvs[0]), nil
}

// replaceIf writes m over the mark read as kv if nobody changed it since,
// keeping its UpdatedAt (a rebind or an idle stamp is not an advance).
func (v *Validator) replaceIf(ctx context.Context, kv *mvccpb.KeyValue, m Mark, also ...clientv3.Cmp) (bool, error) {
	key := string(kv.Key)
	tr, err := v.cli.Txn(ctx).If(append(also, clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision))...).
		Then(clientv3.OpPut(key, m.encodeAt(m.UpdatedAt))).Commit()
	if err != nil {
		return false, v.etcdErr(ctx, "write mark", err)
	}
	return tr.Succeeded, nil
}

// deleteIf deletes the mark read as kv (decoded as m) if nobody changed it
// since and the conditions also hold, and lowers its creator's counter in
// the same transaction. false: something changed; read again.
func (v *Validator) deleteIf(ctx context.Context, kv *mvccpb.KeyValue, m Mark, also ...clientv3.Cmp) (bool, error) {
	key := string(kv.Key)
	// A copy: appending to also could write into the caller's array.
	cmps := make([]clientv3.Cmp, 0, len(also)+2)
	cmps = append(cmps, also...)
	cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision))
	ops := []clientv3.Op{clientv3.OpDelete(key)}
	if m.creator != "" {
		c, err := v.readCount(ctx, m.creator)
		if err != nil {
			return false, err
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(c.key), "=", c.mr))
		ops = append(ops, clientv3.OpPut(c.key, strconv.FormatInt(max(c.n-1, 0), 10)))
	}
	tr, err := v.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return false, v.etcdErr(ctx, "delete mark", err)
	}
	return tr.Succeeded, nil
}
