package fence

import (
	"context"
	"log/slog"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

var timeZero time.Time

// testHookBeforeRetain, if set, runs between retention's read of a lock's
// queue and its transaction (tests add a holder there).
var testHookBeforeRetain func()

// Sweep counts what one SweepMarks did.
type Sweep struct {
	Marks   int // marks looked at
	Idle    int // newly seen with their lock free (stamped)
	Revived int // stamped earlier, their lock had a holder or waiter again (stamp cleared)
	Deleted int
}

// SweepMarks applies the retention rule once to every mark: a mark is
// deleted when its lock's queue has been seen empty (no holder, no waiter)
// at two sweeps at least retention apart, with no advance, rebind or
// holder seen in between, and the deletion's transaction asserts that the
// mark is unchanged and the queue still empty.
//
// Why that cannot let a stale token through (the proof in fence.proto): a
// token validates only while its grant's queue key exists, and etcd never
// creates a key with a revision it already used, so a token whose key is
// gone never validates again. The mark's token t held its lock when it was
// accepted, so every older key of that queue was already gone; an empty
// queue means t's key is gone too. Every token the mark refused (below t)
// is thus refused by the lock check alone, forever. The time rule is only
// about ownership: an idle owner keeps its resource for retention.
//
// now is the sweeper's clock (time.Now outside tests).
func (v *Validator) SweepMarks(ctx context.Context, now time.Time, retention time.Duration) (Sweep, error) {
	var s Sweep
	// Each page at its own revision: the sweep writes between pages.
	pages := keyspace.NewPager(v.cli, v.marks(), clientv3.GetPrefixRangeEnd(v.marks()), keyspace.DefaultPageSize)
	for pages.Next(ctx) {
		for _, kv := range pages.Page() {
			m := decodeMark(markIDOf(v.ks, kv.Key), kv)
			if m.Token <= 0 || m.Lock == "" {
				continue // not a mark (e.g. a foreign value): not ours to delete
			}
			s.Marks++
			if err := v.retain(ctx, &s, kv, m, now, retention); err != nil {
				return s, err
			}
		}
	}
	if err := pages.Err(); err != nil {
		return s, v.etcdErr(ctx, "sweep marks", err)
	}
	return s, nil
}

// retain takes one mark one step along the retention rule. A lost race
// (the mark or the queue changed) is left to the next sweep.
func (v *Validator) retain(ctx context.Context, s *Sweep, kv *mvccpb.KeyValue, m Mark, now time.Time, retention time.Duration) error {
	queue := v.ks.Queue(m.Lock)
	q, err := v.cli.Get(ctx, queue, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return v.etcdErr(ctx, "sweep marks", err)
	}
	// Every queue key has version >= 1; an empty range compares as a zero
	// key: this holds exactly when the queue is empty at commit.
	free := clientv3.Compare(clientv3.Version(queue), "=", 0).WithPrefix()
	if testHookBeforeRetain != nil {
		testHookBeforeRetain()
	}
	switch {
	case q.Count > 0 && !m.idleSince.IsZero():
		m.idleSince = timeZero
		if ok, err := v.replaceIf(ctx, kv, m); err != nil || !ok {
			return err
		}
		s.Revived++
	case q.Count > 0:
	case m.idleSince.IsZero():
		m.idleSince = now
		if ok, err := v.replaceIf(ctx, kv, m, free); err != nil || !ok {
			return err
		}
		s.Idle++
	case now.Sub(m.idleSince) >= retention:
		if ok, err := v.deleteIf(ctx, kv, m, free); err != nil || !ok {
			return err
		}
		s.Deleted++
	}
	return nil
}

// RetainMarks runs SweepMarks every sweepEvery(retention) until ctx ends
// (then it returns nil). retention 0 keeps marks forever: it returns at once.
// Every replica may run it: each step is a compare-and-swap, so concurrent
// sweepers only repeat each other's work.
func (v *Validator) RetainMarks(ctx context.Context, retention time.Duration, log *slog.Logger) error {
	if retention <= 0 {
		return nil
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := time.NewTicker(sweepEvery(retention))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		s, err := v.SweepMarks(ctx, time.Now(), retention)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			log.Warn("mark retention sweep failed; retrying at the next one", "err", err)
		case s.Deleted > 0:
			log.Info("deleted idle resource marks", "deleted", s.Deleted, "marks", s.Marks)
		}
	}
}

// sweepEvery is the sweep period: a tenth of the retention, between a
// minute and an hour, so a mark goes at most that much past its retention.
func sweepEvery(retention time.Duration) time.Duration {
	return min(max(retention/10, time.Minute), time.Hour)
}
