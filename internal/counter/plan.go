package counter

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/coordinatord/coordinatord/internal/etcdx"
)

// plan is one group's transaction: the compares (the counter at the mod
// revision its calls were decided on, every new request record absent),
// the writes if they hold, the reads that decide again if they do not,
// and the answers to give once the compares held.
type plan struct {
	g        *group
	next     *state // the state written, if wrote
	wrote    bool
	answers  []answer
	recCalls []*call       // whose records els[1:] read, in order
	cmps     []*pb.Compare // built as etcd's protobuf (etcdx.Txns)
	then     []*pb.RequestOp
	els      []*pb.RequestOp
}

type answer struct {
	c *call
	o outcome
}

// plan decides g's calls in arrival order against the counter's last known
// state. A call whose request id repeats one earlier in the group, or past
// maxRecords records, waits for the next round.
func (b *batcher) plan(ctx context.Context, g *group, now int64) (*plan, error) {
	base := b.lookup(g.key)
	p := &plan{g: g,
		cmps: []*pb.Compare{etcdx.CompareMod(g.key, base.rev)},
		els:  []*pb.RequestOp{etcdx.OpGet(g.key)}}
	st := base.st
	var seen map[string]bool // request ids in this plan; most hits have none
	for _, c := range g.calls {
		if c.recKey != "" && (seen[c.recKey] || len(seen) == maxRecords) {
			continue
		}
		next, r, err := apply(st, &c.hit, now)
		p.answers = append(p.answers, answer{c: c, o: outcome{res: r, err: err}})
		if err != nil {
			continue
		}
		st = next
		if c.recKey == "" {
			continue
		}
		if seen == nil {
			seen = map[string]bool{}
		}
		seen[c.recKey] = true
		id, _, err := b.s.leases.get(ctx, max(now+int64(b.s.o.retention), r.ResetAt.UnixNano()))
		if err != nil {
			return nil, err
		}
		p.recCalls = append(p.recCalls, c)
		p.cmps = append(p.cmps, etcdx.CompareCreate(c.recKey, 0))
		p.els = append(p.els, etcdx.OpGet(c.recKey))
		p.then = append(p.then, etcdx.OpPut(c.recKey, encodeRecord(c.params, r), id))
	}
	if st == nil || st == base.st {
		return p, nil
	}
	put := etcdx.OpPutIgnoreLease(g.key, "") // inside its lease's span: keep the lease
	if need := st.expiry(); need > st.leaseEnd {
		id, end, err := b.s.leases.get(ctx, need)
		if err != nil {
			return nil, err
		}
		st.leaseEnd, put = end, etcdx.OpPut(g.key, "", id)
	}
	put.GetRequestPut().Value = []byte(st.encode()) // with its lease end
	p.next, p.wrote = st, true
	p.then = append(p.then, put)
	return p, nil
}

// settle gives the answers of a plan whose compares held, or takes in what
// its failed branch read (the counter's state, existing request records,
// whose answers are given now); it reports whether calls of the group are
// left for another round.
func (b *batcher) settle(p *plan, r txnResult) bool {
	g := p.g
	if r.ok {
		if p.wrote {
			b.remember(g.key, cached{st: p.next, rev: r.rev})
		}
		for _, a := range p.answers {
			a.c.res <- a.o
			a.c.answered = true
		}
		b.decided.Add(int64(len(p.answers)))
	} else {
		cur := cached{}
		if kvs := r.resps[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
			st, err := decodeState(kvs[0].Value)
			if err != nil {
				b.forget(g.key)
				g.fail(err)
				return false
			}
			cur = cached{st: st, rev: kvs[0].ModRevision}
		}
		b.remember(g.key, cur)
		for i, c := range p.recCalls {
			if kvs := r.resps[1+i].GetResponseRange().GetKvs(); len(kvs) > 0 {
				res, err := decodeRecord(kvs[0].Value, c.params)
				c.res <- outcome{res: res, err: err}
				c.answered = true
			}
		}
	}
	left := g.calls[:0]
	for _, c := range g.calls {
		if !c.answered {
			left = append(left, c)
		}
	}
	g.calls = left
	return len(left) > 0
}
