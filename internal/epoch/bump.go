package epoch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// bump raises the epoch above both etcd's and this replica's, in one
// transaction with a fresh beacon (so that no replica sees the same restore
// again), then fences the old epochs off (finish). Two replicas that found
// the same restore race on the epoch key's mod revision: one raises, the
// other adopts the raised epoch at its next check.
func (k *Keeper) bump(ctx context.Context, obs observation, reason string) error {
	k.mu.Lock()
	next := max(obs.rec.Epoch, k.epoch) + 1
	k.mu.Unlock()
	if next > keyspace.MaxEpoch {
		return fmt.Errorf("cannot raise the epoch past %d: tokens have no room for more restores", keyspace.MaxEpoch)
	}
	// The new epoch's beacon is as young as the restored etcd: a restore of
	// a snapshot taken right after this raise must show too.
	if err := k.raiseIndex(ctx, &obs); err != nil {
		return fmt.Errorf("raise the epoch to %d: %w", next, err)
	}
	rec := record{Epoch: next, State: stateFencing, Reason: reason, At: time.Now().UTC()}
	b := beacon{Epoch: next, RaftIndex: obs.index, RaftTerm: obs.term, At: rec.At}
	r, err := k.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k.ks.Epoch()), "=", obs.recMR)).
		Then(clientv3.OpPut(k.ks.Epoch(), encode(rec)), clientv3.OpPut(k.ks.EpochBeacon(), encode(b))).Commit()
	if err != nil {
		return fmt.Errorf("raise the epoch to %d: %w", next, err)
	}
	if !r.Succeeded {
		return errors.New("another replica raised the epoch first; adopting it at the next check")
	}
	k.bumps.Add(1)
	return k.finish(ctx, rec, r.Header.Revision)
}

// finish fences off everything of the epochs before rec's: it revokes every
// lease attached to a queue entry, a session, a lock-delay or a slot (a
// restored lease can be kept alive again), deletes those keys and every
// request record (a retried request id must not answer an old grant again),
// then marks the epoch ready and adopts it. recMR is the epoch key's mod
// revision as rec was read or written: if the key changed since, the next
// check reads it again.
func (k *Keeper) finish(ctx context.Context, rec record, recMR int64) error {
	leased := []string{k.ks.Locks(), k.ks.Sessions(), k.ks.Delays(), k.ks.Slots(), k.ks.AllOwners()}
	prefixes := append(slices.Clip(leased), k.ks.Requests())
	leases := map[clientv3.LeaseID]bool{}
	for _, p := range leased {
		// Not keys-only: etcd leaves the lease out of a keys-only answer.
		r, err := k.cli.Get(ctx, p, clientv3.WithPrefix())
		if err != nil {
			return fmt.Errorf("fence epoch %d: list %s: %w", rec.Epoch, p, err)
		}
		for _, kv := range r.Kvs {
			if kv.Lease != 0 {
				leases[clientv3.LeaseID(kv.Lease)] = true
			}
		}
	}
	for id := range leases {
		if _, err := k.cli.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return fmt.Errorf("fence epoch %d: revoke lease %x: %w", rec.Epoch, int64(id), err)
		}
	}
	ops := make([]clientv3.Op, 0, len(prefixes)+1)
	for _, p := range prefixes {
		ops = append(ops, clientv3.OpDelete(p, clientv3.WithPrefix()))
	}
	ready := rec
	ready.State = stateReady
	ops = append(ops, clientv3.OpPut(k.ks.Epoch(), encode(ready)))
	r, err := k.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k.ks.Epoch()), "=", recMR)).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("fence epoch %d: %w", rec.Epoch, err)
	}
	if !r.Succeeded {
		return fmt.Errorf("fence epoch %d: the epoch key changed meanwhile; checking again", rec.Epoch)
	}
	k.log.Warn("epoch: token epoch raised; every grant of the earlier epochs is gone", "epoch", rec.Epoch,
		"floor", keyspace.EpochFloor(rec.Epoch), "leasesRevoked", len(leases), "reason", rec.Reason)
	beaconMR := int64(0)
	if b, err := k.cli.Get(ctx, k.ks.EpochBeacon()); err == nil && len(b.Kvs) > 0 {
		beaconMR = b.Kvs[0].ModRevision
	}
	k.adopt(rec.Epoch, r.Header.Revision, beaconMR)
	return nil
}
