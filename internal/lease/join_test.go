package lease

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Issue 13, row 18: a join that waits behind stalled commits longer than its
// fresh lease's TTL (the etcd leader crashed, say) finds its lease expired
// ("requested lease not found"). It is redone with a new lease, or answered
// ErrUnavailable (UNAVAILABLE, safe to retry), never an unclassified error
// (INTERNAL). The batcher's commits are held back until etcd expired the
// lease.
func TestJoinWhoseFreshLeaseExpiredIsRetried(t *testing.T) {
	m, cli := newTestManager(t)
	ctx := context.Background()
	pending := holdCommits(t, m)
	type result struct {
		g   *Grant
		err error
	}
	done := make(chan result, 1)
	go func() {
		g, err := m.Acquire(ctx, "slow/join", WithTTL(time.Second))
		done <- result{g, err}
	}()
	batches := pending(1) // the join's lease is granted, its transaction held back
	eventually(t, "the join's lease to expire", func() bool {
		r, err := cli.Leases(ctx)
		return err == nil && len(r.Leases) == 0
	})
	m.batch.launch(batches)
	r := <-done
	switch {
	case r.err == nil:
		if ok, err := m.Release(ctx, "slow/join", r.g.Token, r.g.Handle); err != nil || !ok {
			t.Fatalf("the grant after a redone join is not sound: release %v %v", ok, err)
		}
	case errors.Is(r.err, ErrUnavailable):
	default:
		t.Fatalf("a join whose lease expired: %v, want a grant or ErrUnavailable", r.err)
	}
}
