package counter

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/coordinatord/coordinatord/internal/etcdx"
)

// batcher is group commit for hits. Hits on one counter that arrive while
// a commit is in flight form one group: decided in arrival order against
// the counter's state at one mod revision, written once, compared on that
// revision (a lost race re-reads the state from the failed branch and
// decides again: nothing is answered before its compare succeeded). Groups
// on different counters share one Txn, each a nested transaction with its
// own compare. A lone hit is committed at once; at most maxInflight
// commits run, and a counter is in at most one of them. The batcher's
// goroutines are its own: close waits for them.
type batcher struct {
	s *Service

	mu       sync.Mutex
	pending  map[string]*group // by counter key
	order    []string          // pending keys, first come first
	busy     map[string]bool   // keys in a commit
	inflight int
	closed   bool
	cache    map[string]cached // last known state of counters
	wg       sync.WaitGroup

	txns, decided atomic.Int64 // etcd transactions committed, calls answered by them
}

const (
	maxInflight = 2
	maxGroups   = 64 // counters per Txn
	maxRecords  = 32 // request-id records per counter per Txn (etcd allows 128 ops per level)
	maxCache    = 1 << 14
)

type call struct {
	hit    Hit
	key    string // the counter's
	recKey string // its request-id record's, if any
	params string // paramsDigest, with recKey
	res    chan outcome

	answered bool // by settle (its group's committer's own)
}

type outcome struct {
	res Result
	err error
}

type group struct {
	key   string
	calls []*call
}

// cached is a counter's state (nil: no key) at its mod revision (0: none).
type cached struct {
	st  *state
	rev int64
}

func newBatcher(s *Service) *batcher {
	return &batcher{s: s, pending: map[string]*group{}, busy: map[string]bool{}, cache: map[string]cached{}}
}

func (b *batcher) submit(c *call) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrShuttingDown
	}
	g := b.pending[c.key]
	if g == nil {
		g = &group{key: c.key}
		b.pending[c.key] = g
		b.order = append(b.order, c.key)
	}
	g.calls = append(g.calls, c)
	if b.inflight < maxInflight {
		if batch := b.take(); len(batch) > 0 {
			b.inflight++
			b.wg.Add(1)
			go b.run(batch)
		}
	}
	return nil
}

func (b *batcher) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.wg.Wait()
}

// take removes from pending the groups of the next commit; b.mu is held.
func (b *batcher) take() []*group {
	var batch []*group
	var rest []string
	for _, k := range b.order {
		if len(batch) == maxGroups || b.busy[k] {
			rest = append(rest, k)
			continue
		}
		g := b.pending[k]
		delete(b.pending, k)
		b.busy[k] = true
		batch = append(batch, g)
	}
	b.order = rest
	return batch
}

// run commits batch, then whatever is pending, until nothing is.
func (b *batcher) run(batch []*group) {
	defer b.wg.Done()
	for len(batch) > 0 {
		b.commit(batch)
		b.mu.Lock()
		for _, g := range batch {
			delete(b.busy, g.key)
		}
		batch = b.take()
		if len(batch) == 0 {
			b.inflight--
		}
		b.mu.Unlock()
	}
}

// commit decides and writes batch, round after round until every call has
// its answer: a group whose compare failed goes again with the state its
// failed branch read.
func (b *batcher) commit(batch []*group) {
	ctx, cancel := context.WithTimeout(context.Background(), b.s.o.timeout)
	defer cancel()
	for len(batch) > 0 {
		plans := make([]*plan, 0, len(batch))
		for _, g := range batch {
			p, err := b.plan(ctx, g, time.Now().UnixNano())
			if err != nil {
				g.fail(etcdx.Classify("counter lease", err))
				continue
			}
			plans = append(plans, p)
		}
		results, err := b.txn(ctx, plans)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) && ctx.Err() == nil {
			b.s.leases.forget() // a lease ended early: grant anew and go again
			continue
		}
		if err != nil {
			err = etcdx.Classify("counter hit", err)
			for _, p := range plans {
				p.g.fail(err)
			}
			return
		}
		batch = batch[:0]
		for i, p := range plans {
			if b.settle(p, results[i]) {
				batch = append(batch, p.g)
			}
		}
	}
}

type txnResult struct {
	rev   int64
	ok    bool
	resps []*pb.ResponseOp
}

// txn commits the plans as one Txn (nested when more than one).
func (b *batcher) txn(ctx context.Context, plans []*plan) ([]txnResult, error) {
	if len(plans) == 0 {
		return nil, nil
	}
	b.txns.Add(1)
	if len(plans) == 1 {
		p := plans[0]
		resp, err := b.s.txns.Commit(ctx, etcdx.Txn(p.cmps, p.then, p.els))
		if err != nil {
			return nil, err
		}
		return []txnResult{{rev: resp.Header.Revision, ok: resp.Succeeded, resps: resp.Responses}}, nil
	}
	resp, err := b.s.txns.Commit(ctx, nestedTxn(plans))
	if err != nil {
		return nil, err
	}
	out := make([]txnResult, len(plans))
	for i := range plans {
		t := resp.Responses[i].GetResponseTxn()
		out[i] = txnResult{rev: resp.Header.Revision, ok: t.GetSucceeded(), resps: t.GetResponses()}
	}
	return out, nil
}

// nestedTxn is the Txn of plans, each a nested transaction of its Then.
func nestedTxn(plans []*plan) *pb.TxnRequest {
	ops := make([]*pb.RequestOp, len(plans))
	for i, p := range plans {
		ops[i] = etcdx.OpTxn(etcdx.Txn(p.cmps, p.then, p.els))
	}
	return etcdx.Txn(nil, ops, nil)
}

func (g *group) fail(err error) {
	for _, c := range g.calls {
		c.res <- outcome{err: err}
	}
	g.calls = nil
}

func (b *batcher) lookup(key string) cached {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cache[key]
}

func (b *batcher) remember(key string, c cached) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.cache[key]; !ok && len(b.cache) >= maxCache {
		for k := range b.cache {
			delete(b.cache, k)
			break
		}
	}
	b.cache[key] = c
}

func (b *batcher) forget(key string) {
	b.mu.Lock()
	delete(b.cache, key)
	b.mu.Unlock()
}
