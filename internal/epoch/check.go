package epoch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// observation is what one check reads: the epoch record and the beacon at
// one revision, then etcd's raft position. The raft position is read after
// the beacon, so that a beacon any replica wrote before the read recorded a
// position at or below the live one, unless etcd was restored.
type observation struct {
	rev      int64 // the read's revision
	rec      record
	recMR    int64 // the epoch key's mod revision (0: no key)
	beacon   *beacon
	beaconMR int64
	index    uint64     // etcd's raft index (the greatest a member reported)
	term     uint64     // and term
	members  []position // each member's answer
}

// check reads etcd's history, raises the epoch if it was restored, finishes
// a raise another replica left unfinished, and otherwise adopts the epoch
// etcd holds and reopens.
func (k *Keeper) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, k.timeout())
	defer cancel()
	// Only what was answered before the read starts bounds it from below:
	// a write answered while the read is in flight may be after it.
	k.mu.Lock()
	seen := k.maxRev
	k.mu.Unlock()
	obs, err := k.observe(ctx)
	if err != nil {
		return err
	}
	if reason := k.restored(obs, seen); reason != "" {
		k.log.Warn("epoch: etcd was restored from a backup; raising the token epoch", "reason", reason, "epoch", obs.rec.Epoch)
		k.pause("etcd was restored: " + reason)
		return k.bump(ctx, obs, reason)
	}
	if obs.rec.State == stateFencing {
		// Raised by a replica that has not finished (or died): finishing
		// is idempotent.
		k.pause(fmt.Sprintf("epoch %d is being installed", obs.rec.Epoch))
		return k.finish(ctx, obs.rec, obs.recMR)
	}
	if obs.beacon == nil || obs.beacon.Epoch != obs.rec.Epoch || obs.index >= 2*obs.beacon.RaftIndex {
		// Best effort: a full store refuses writes, and reads must go on;
		// the beacon recorded earlier still shows a restore.
		if err := k.writeBeacon(ctx, &obs); err != nil {
			k.log.Warn("epoch: beacon not rewritten", "err", err)
		}
	}
	k.adopt(obs.rec.Epoch, obs.rev, obs.beaconMR)
	return nil
}

// observe reads the epoch record and the beacon (linearizably, at one
// revision), then the raft position.
func (k *Keeper) observe(ctx context.Context) (observation, error) {
	r, err := k.cli.Txn(ctx).Then(clientv3.OpGet(k.ks.Epoch()), clientv3.OpGet(k.ks.EpochBeacon())).Commit()
	if err != nil {
		return observation{}, fmt.Errorf("read the epoch: %w", err)
	}
	obs := observation{rev: r.Header.Revision}
	var recKV, beaconKV *mvccpb.KeyValue
	if kvs := r.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		recKV, obs.recMR = kvs[0], kvs[0].ModRevision
	}
	if kvs := r.Responses[1].GetResponseRange().GetKvs(); len(kvs) > 0 {
		beaconKV, obs.beaconMR = kvs[0], kvs[0].ModRevision
	}
	obs.rec, obs.beacon = decodeRecord(recKV), decodeBeacon(beaconKV)
	obs.index, obs.term, obs.members, err = k.raftPosition(ctx)
	return obs, err
}

// raftPosition is the greatest raft index and term the endpoints report,
// and each one's answer, asked all at once, each for half the check's time:
// a member that is down does not hold the check up, and the greatest
// answer is the leader's when it answers (a follower may lag, never lead).
func (k *Keeper) raftPosition(ctx context.Context) (index, term uint64, members []position, err error) {
	type answer struct {
		index, term uint64
		rev         int64
		err         error
	}
	eps := k.cli.Endpoints()
	answers := make(chan answer, len(eps))
	for _, ep := range eps {
		go func() {
			sctx, cancel := context.WithTimeout(ctx, k.timeout()/2)
			defer cancel()
			s, err := k.cli.Status(sctx, ep)
			if err != nil {
				answers <- answer{err: fmt.Errorf("%s: %w", ep, err)}
				return
			}
			answers <- answer{index: s.RaftIndex, term: s.RaftTerm, rev: s.Header.GetRevision()}
		}()
	}
	var errs []error
	for range eps {
		a := <-answers
		if a.err != nil {
			errs = append(errs, a.err)
			continue
		}
		index, term = max(index, a.index), max(term, a.term)
		members = append(members, position{rev: a.rev, index: a.index})
	}
	if len(errs) == len(eps) {
		return 0, 0, nil, fmt.Errorf("etcd status: %w", errors.Join(errs...))
	}
	return index, term, members, nil
}

// restored says why obs shows a restore, or "" if it does not. maxRev is
// the greatest revision read or witnessed before obs was read.
func (k *Keeper) restored(obs observation, maxRev int64) string {
	k.mu.Lock()
	epoch, beaconMR := k.epoch, k.beaconMR
	k.mu.Unlock()
	switch {
	case obs.rec.Epoch < epoch:
		return fmt.Sprintf("the token epoch went back from %d to %d", epoch, obs.rec.Epoch)
	case obs.rec.Epoch == epoch && obs.rev < maxRev:
		return fmt.Sprintf("etcd's revision went back from %d to %d", maxRev, obs.rev)
	case obs.rec.Epoch == epoch && obs.beaconMR < beaconMR:
		return fmt.Sprintf("the beacon went back from revision %d to %d", beaconMR, obs.beaconMR)
	case obs.beacon != nil && obs.index < obs.beacon.RaftIndex/2:
		// Below half: a restore restarts the index at 1, while a member
		// that lags (one that restarted after a long absence) is never
		// behind by half its log's length, and the beacon is rewritten
		// whenever the index doubled. The term is no signal on its own: a
		// member that restarted after elections reports an older one.
		return fmt.Sprintf("etcd's raft index went back from %d to %d", obs.beacon.RaftIndex, obs.index)
	}
	for _, p := range obs.members {
		if behind(p, obs.beacon, obs.beaconMR) {
			return fmt.Sprintf("a member at revision %d has committed %d raft entries, fewer than the %d its revisions need since the beacon (raft index %d at revision %d)",
				p.rev, p.index, obs.beacon.RaftIndex+1+uint64(p.rev-obs.beaconMR), obs.beacon.RaftIndex, obs.beaconMR)
		}
	}
	return ""
}

// writeBeacon records obs's raft position, unless another replica rewrote
// the beacon since obs read it.
func (k *Keeper) writeBeacon(ctx context.Context, obs *observation) error {
	if err := k.raiseIndex(ctx, obs); err != nil {
		return fmt.Errorf("write the beacon: %w", err)
	}
	b := beacon{Epoch: obs.rec.Epoch, RaftIndex: obs.index, RaftTerm: obs.term, At: time.Now().UTC()}
	r, err := k.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k.ks.EpochBeacon()), "=", obs.beaconMR)).
		Then(clientv3.OpPut(k.ks.EpochBeacon(), encode(b))).Commit()
	if err != nil {
		return fmt.Errorf("write the beacon: %w", err)
	}
	if r.Succeeded {
		obs.beaconMR, obs.rev = r.Header.Revision, r.Header.Revision
	}
	return nil
}

// adopt makes epoch the current one, remembers the history seen in it, and
// reopens the gate: after onBump, when the epoch changed.
func (k *Keeper) adopt(epoch, rev, beaconMR int64) {
	k.mu.Lock()
	from := k.epoch
	if epoch != from {
		k.maxRev, k.beaconMR = 0, 0
		k.gen.Add(1)
		close(k.changed)
		k.changed = make(chan struct{})
	}
	k.epoch, k.maxRev, k.beaconMR = epoch, max(k.maxRev, rev), max(k.beaconMR, beaconMR)
	k.mu.Unlock()
	if epoch != from {
		k.log.Info("epoch: adopted a new token epoch", "from", from, "to", epoch)
		if k.onBump != nil {
			k.onBump(epoch)
		}
	}
	k.pause("")
}
