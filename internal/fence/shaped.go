package fence

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// Validation against a resource for a semaphore's or a read-write lock's
// holders. A semaphore's permits are slots, and tokens rise per slot
// (internal/lease grants in queue order), so a resource keeps one mark per
// (resource, slot): a paused former holder of slot k is below the mark of
// slot k. A read-write lock's readers hold together, in no order a
// resource could check: only a writer (an exclusive holder, the queue's
// head alone) raises the resource's mark, validated as a mutex's holder.

// SharedHolderError refuses a validation with a resource of a reader's
// token: only an exclusive holder may raise a resource's mark.
type SharedHolderError struct {
	Name, Resource string
	Token          int64
}

func (e *SharedHolderError) Error() string {
	return fmt.Sprintf("fence: token %d is a shared (reader's) hold of lock %q: readers hold together, so their tokens "+
		"cannot order writes to resource %q; validate without a resource, or write as the exclusive holder", e.Token, e.Name, e.Resource)
}

// validateShapedAt is one attempt of validateAt for a queue whose oldest
// entry is a semaphore's or a reader's, for a token of the current epoch
// (epoch): the holders are read up to its revision;
// a reader's token is refused (*SharedHolderError); a semaphore holder's
// token is checked against, and raises, the mark of its slot, in a
// transaction that asserts its entry still exists (an entry once admitted
// stays admitted while it exists: older entries only leave).
func (v *Validator) validateShapedAt(ctx context.Context, name string, token, epoch int64, resource, ih string) (Verdict, attempt, error) {
	queue := v.ks.Queue(name)
	rev := revisionOf(token) // token is of the current epoch
	r, err := v.cli.Get(ctx, queue, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(rev),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return Verdict{}, attemptDone, v.etcdErr(ctx, "validate", err)
	}
	hs := tokensIn(epoch, holderTokens(r.Kvs))
	n := len(r.Kvs)
	if n == 0 || r.Kvs[n-1].CreateRevision != rev || len(hs) < n {
		return judgeAmong(token, hs, 0), attemptDone, nil // not a holder: no mark to compare
	}
	entry := r.Kvs[n-1]
	shape, slot := keyspace.ShapeOf(entry.Value)
	if !shape.Semaphore() {
		return Verdict{}, attemptDone, &SharedHolderError{Name: name, Resource: resource, Token: token}
	}
	id := MarkID{Resource: resource, PerSlot: true, Slot: slot}
	markKey := id.key(v.ks)
	mr, err := v.cli.Get(ctx, markKey)
	if err != nil {
		return Verdict{}, attemptDone, v.etcdErr(ctx, "validate", err)
	}
	var (
		m      Mark
		markMR int64
	)
	if len(mr.Kvs) > 0 {
		m, markMR = decodeMark(id, mr.Kvs[0]), mr.Kvs[0].ModRevision
	}
	if markMR != 0 && m.Lock != name {
		return Verdict{}, attemptDone, &MarkOwnedError{Resource: resource, Lock: name, Owner: m.Lock}
	}
	verdict := judge(token, token, m.Token)
	if !verdict.Valid || token == m.Token {
		return verdict, attemptDone, nil
	}
	holds := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(string(entry.Key)), "=", rev)}
	return v.advance(ctx, verdict, holds, markKey, markMR, m, Mark{MarkID: id, Token: token, Lock: name, creator: ih})
}
