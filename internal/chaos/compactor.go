package chaos

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// CompactEvery is how often the Env's compactor compacts etcd's history to
// its current revision: far more aggressive than any operator's retention
// (etcd's own periodic mode compacts once per retention period, at least
// 1s apart, keeping that period's revisions), so that every watch that
// falls behind, every resume from a start revision and every restart of
// a watch after a member kill or a partition meets a compacted history.
const CompactEvery = 300 * time.Millisecond

// Compactor compacts etcd's key-value history to the current revision every
// CompactEvery, as a fault running under every scenario: waiters, Hold
// streams, Watch streams, the holder view and the lock-end watch must all
// survive it. It keeps going through member kills and quorum loss (a failed
// compaction is simply tried again at the next tick).
type Compactor struct {
	cli       *clientv3.Client
	stop      context.CancelFunc
	wg        sync.WaitGroup
	compacted atomic.Int64 // the highest revision compacted so far
	runs      atomic.Int64
}

// StartCompactor starts compacting through cli until Stop.
func StartCompactor(cli *clientv3.Client) *Compactor {
	ctx, cancel := context.WithCancel(context.Background())
	c := &Compactor{cli: cli, stop: cancel}
	c.wg.Go(func() { c.run(ctx) })
	return c
}

func (c *Compactor) run(ctx context.Context) {
	t := time.NewTicker(CompactEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.once(ctx)
	}
}

// once compacts to the current revision, if it moved since the last time.
func (c *Compactor) once(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	r, err := c.cli.Get(ctx, "/chaos/compactor", clientv3.WithSerializable(), clientv3.WithCountOnly())
	if err != nil || r.Header.Revision <= c.compacted.Load() {
		return
	}
	if _, err := c.cli.Compact(ctx, r.Header.Revision); err != nil {
		return // "required revision has been compacted" (a restarted member) included
	}
	c.compacted.Store(r.Header.Revision)
	c.runs.Add(1)
}

// Compacted is the highest revision compacted so far: every revision below
// it is gone (a start revision at or below it is OUT_OF_RANGE).
func (c *Compactor) Compacted() int64 { return c.compacted.Load() }

// Runs is how many compactions succeeded.
func (c *Compactor) Runs() int64 { return c.runs.Load() }

// Stop ends the compactor and waits for it.
func (c *Compactor) Stop() {
	c.stop()
	c.wg.Wait()
}
