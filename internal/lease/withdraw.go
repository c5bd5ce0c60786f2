package lease

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Withdrawal: how an acquisition that gives up (its wait elapsed, its
// caller's deadline passed, etcd failed) removes its queue entry, without
// ever ending an entry that another call took over.
//
// Who can take an entry over. A plain entry is known to the call that
// queued it alone: its handle is a fresh secret. A session's entry belongs
// to the session, and a second Acquire of the same lock in it is refused.
// But an entry with a request id is known to every retry with that id, on
// any replica: the retry takes it over (adoptRequest) and waits for it, or is
// handed its grant (regrant). The call that queued it may meanwhile have
// been paused (GC, SIGSTOP) past its caller's deadline; when it wakes,
// its clean-up must not end what the retry now relies on.
//
// So a request-id entry is ended only by a compare on what the withdrawing
// call knows: the entry's mod revision. A retry that finds a waiting entry
// adopts it by rewriting it (adopt), and a claim rewrites it too, so either
// makes that compare fail and the clean-up leave the entry alone. A granted
// request-id entry is never withdrawn: a retry is handed a grant without a
// write, so nothing in etcd would tell that the grant is in use. Such an
// entry (the caller saw an error after the grant was made) ends by release,
// or with its lease, which nobody renews unless a retry was handed it.
// Leases are revoked only when nothing on them can matter to anyone else:
// always for a plain entry, and for a request-id entry only once its keys
// are deleted by the compare.

// withdraw removes an attempt's queue entry, even if the caller's context
// is done, unless another call may have taken it over (see above). On
// failure the entry still ends with its lease.
func (m *Manager) withdraw(a *attempt) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	var err error
	switch {
	case a.session:
		err = m.withdrawSession(ctx, a)
	case a.rec.Req != "":
		err = m.withdrawShared(ctx, a)
	default:
		err = m.revokeAttempt(ctx, a)
	}
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		m.log.Warn("withdrawing an abandoned queue entry failed; it ends with its lease", "lease", formatLease(a.id), "err", err)
	}
}

// discard ends the leases of an attempt that wrote nothing (its join was
// refused, or never sent): they carry no key anyone else could rely on. A
// session's lease is the session's and is left alone.
func (m *Manager) discard(a *attempt) {
	if a.session {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := m.revokeAttempt(ctx, a); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		m.log.Warn("revoking an unused lease failed; it ends with its TTL", "lease", formatLease(a.id), "err", err)
	}
}

// revokeAttempt revokes the attempt's leases: its lock-delay lease, then
// the lease of its queue key.
func (m *Manager) revokeAttempt(ctx context.Context, a *attempt) error {
	if a.delay != 0 {
		_, _ = m.cli.Revoke(ctx, a.delay)
	}
	if a.id == 0 {
		return nil
	}
	_, err := m.cli.Revoke(ctx, a.id)
	return err
}

// withdrawShared withdraws a request-id entry: it deletes the entry (with its
// request record and limit slots) only if the entry is still waiting and
// unchanged since this call last wrote or read it, then revokes its leases.
// When this call does not know the entry's mod revision (its join's outcome
// was lost), it reads the entry and takes it for its own only if it was
// never written after its creation (never adopted nor claimed).
func (m *Manager) withdrawShared(ctx context.Context, a *attempt) error {
	modRev, rec := a.modRev, a.rec
	if modRev == 0 {
		r, err := m.cli.Get(ctx, a.key)
		if err != nil {
			return err
		}
		if len(r.Kvs) == 0 {
			// Not written, or not yet: a join still in flight may land
			// later, so the lease is left to end unrenewed.
			return nil
		}
		kv := r.Kvs[0]
		if clientv3.LeaseID(kv.Lease) != a.id || kv.ModRevision != kv.CreateRevision {
			return nil
		}
		modRev, rec = kv.ModRevision, decodeRecord(kv.Value)
	}
	if rec.Acquired != 0 {
		return nil // a grant: a retry may have been handed it
	}
	ops := append([]clientv3.Op{clientv3.OpDelete(a.key)}, m.slotsDelete(a.name, rec)...)
	if rec.Req != "" {
		ops = append(ops, clientv3.OpDelete(rec.Req))
	}
	tr, err := m.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(a.key), "=", modRev)).Then(ops...).Commit()
	if err != nil {
		return err
	}
	if !tr.Succeeded {
		return nil // adopted, claimed or ended since: not ours to end
	}
	return m.revokeAttempt(ctx, a)
}

// withdrawSession deletes a session's waiting entry (and its limit slots)
// by its create revision; the session's lease lives on. If the join's
// outcome was lost (no token), the entry is read first and deleted only if
// it is this attempt's (joined at the same instant) and still waiting.
func (m *Manager) withdrawSession(ctx context.Context, a *attempt) error {
	if a.key == "" {
		return nil
	}
	token, rec := a.token, a.rec
	if token == 0 {
		r, err := m.cli.Get(ctx, a.key)
		if err != nil || len(r.Kvs) == 0 {
			return err
		}
		kv := r.Kvs[0]
		if rec = decodeRecord(kv.Value); rec.Since != a.rec.Since || rec.Acquired != 0 {
			return nil
		}
		token = kv.CreateRevision
	}
	_, err := m.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(a.key), "=", token)).
		Then(append([]clientv3.Op{clientv3.OpDelete(a.key)}, m.slotsDelete(a.name, rec)...)...).Commit()
	return err
}
