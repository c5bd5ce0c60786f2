package epoch

import (
	"context"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// How the beacon shows a restore of a young snapshot (issue 26, item 5).
//
// A restore restarts etcd's raft index at the member count, exactly as a
// new cluster starts: a snapshot taken before the beacon's first rewrite
// holds a beacon whose index a restored etcd reaches again at once, and
// "below half the beacon's index" showed nothing (a new holder got the
// token of a holder of the lost history, and both validated). Two rules
// close that:
//
//   - A beacon never records an index below minBeaconIndex: on a new
//     cluster (and after a restore, whose index is as small) the keeper
//     first raises the index with no-op transactions, so a restored etcd,
//     which is checked long before it makes that many entries, is below
//     the beacon's index from the first write on.
//   - Every entry raises etcd's revision by at most one, so a member that
//     applied revision rev, the beacon having been written at revision mr
//     after the index was index, has committed at least index + 1 +
//     (rev - mr) entries. A restore keeps the revisions (or raises them,
//     with --bump-revision) and restarts the index: a member below that
//     count shows it, whatever the bump and however few the writes. Each
//     member is judged by its own answer (Status reads its revision, then
//     its committed index), so a member that lags shows no restore: its
//     revision lags with its index. (etcd keeps its backend's applied
//     index at or below its WAL's commit, across restarts too.)

// minBeaconIndex is the least raft index a beacon records. A restored
// etcd starts at its member count, and before a coordinator checks it
// makes a few entries of its own (an election, each member's attributes,
// the cluster version) and the replicas' lease grants: far below 128.
// Raising a new cluster's index that far takes at most 128 no-op
// transactions, sent 64 at a time (20 to 60 ms on an embedded etcd), once
// in an etcd's life and once after each restore.
const minBeaconIndex = 128

// position is one member's answer to Status: the revision its store had
// applied, and its committed raft index, read after it.
type position struct {
	rev   int64
	index uint64
}

// behind says whether member p has committed fewer entries than its
// revision needs since beacon b, written at revision mr: a restore.
func behind(p position, b *beacon, mr int64) bool {
	if b == nil || mr <= 0 || p.rev < mr {
		return false // no beacon, or a member that has not applied it yet
	}
	return p.index < b.RaftIndex+1+uint64(p.rev-mr)
}

// raiseIndex makes etcd's raft index at least minBeaconIndex before a
// beacon records it, with no-op transactions (a compare that never holds:
// an entry each, no revision), and reads the raft position again into obs.
func (k *Keeper) raiseIndex(ctx context.Context, obs *observation) error {
	const parallel = 64
	// Bounded: an etcd whose index these entries do not raise (none known)
	// gets the beacon it has.
	for round := 0; obs.index < minBeaconIndex && round < 2*minBeaconIndex/parallel; round++ {
		n := min(int(minBeaconIndex-obs.index), parallel)
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			last error
		)
		for range n {
			wg.Go(func() {
				_, err := k.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k.ks.EpochBeacon()), "<", 0)).
					Then(clientv3.OpDelete(k.ks.EpochBeacon())).Commit()
				if err != nil {
					mu.Lock()
					last = err
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if last != nil {
			return fmt.Errorf("raise etcd's raft index to %d: %w", minBeaconIndex, last)
		}
		var err error
		if obs.index, obs.term, obs.members, err = k.raftPosition(ctx); err != nil {
			return err
		}
	}
	return nil
}
