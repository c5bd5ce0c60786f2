package shard

// The campaign: which member each shard is assigned to (rendezvous hashing
// over the live members), and the guarded Txns that win, hand over and
// drop shards.

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ownPlan is what reconcile does next.
type ownPlan struct {
	register bool
	orphans  []ownTerm // keys on our lease that we do not own (ambiguous campaigns)
	handOver []ownTerm
	campaign []uint32
	adopt    map[uint32]string // campaigned shards that are not ours: their assignee
}

// reconcile acts on the view: register again if the member key is gone,
// delete orphan keys, hand over shards assigned to other members, and
// campaign for free shards assigned to us or left free too long.
func (o *Ownership) reconcile(ctx context.Context) {
	if o.lease == nil {
		return
	}
	p := o.plan(time.Now())
	if p.register {
		if err := o.register(ctx); err != nil {
			o.log.Warn("shard ownership: register again", "err", err)
		}
		return
	}
	if err := o.deleteTerms(ctx, p.orphans); err != nil {
		o.log.Debug("shard ownership: delete orphan owner keys", "err", err)
	}
	o.handOver(ctx, p.handOver)
	for len(p.campaign) > 0 && ctx.Err() == nil {
		n := min(len(p.campaign), ownMaxTxnOps)
		o.campaign(ctx, p.campaign[:n], p.adopt)
		p.campaign = p.campaign[n:]
	}
}

// plan reads the view into an ownPlan.
func (o *Ownership) plan(now time.Time) ownPlan {
	o.mu.Lock()
	defer o.mu.Unlock()
	var p ownPlan
	switch {
	case o.leaseGone:
		return p
	case o.closing:
		// After HandOver a key on our lease is an orphan (a campaign that
		// was in flight won it): delete it, so that its shard is not left
		// unowned until the lease ends.
		if o.handedOver {
			for i, v := range o.slots {
				if _, mine := o.owned[uint32(i)]; !mine && v.create != 0 && v.lease == o.lease.ID() {
					p.orphans = append(p.orphans, ownTerm{uint32(i), v.create})
				}
			}
		}
		return p
	}
	id := o.opts.id
	if _, ok := o.members[id]; !ok {
		p.register = true
		return p
	}
	assign := o.assignmentLocked()
	for i, v := range o.slots {
		s, a := uint32(i), assign[i]
		rev, mine := o.owned[s]
		switch {
		case mine:
			if a != id && o.adopted[s] != a {
				p.handOver = append(p.handOver, ownTerm{s, rev})
			}
		case v.create != 0:
			if v.lease == o.lease.ID() {
				p.orphans = append(p.orphans, ownTerm{s, v.create})
			}
		case a == id:
			p.campaign = append(p.campaign, s)
		case now.Sub(v.freeSince) >= o.opts.adoptAfter:
			if p.adopt == nil {
				p.adopt = map[uint32]string{}
			}
			p.campaign, p.adopt[s] = append(p.campaign, s), a
		}
	}
	return p
}

// assignmentLocked is each shard's assignee among the live members.
func (o *Ownership) assignmentLocked() []string {
	if o.assign == nil {
		ids := make([]string, 0, len(o.members))
		for id := range o.members {
			ids = append(ids, id)
		}
		o.assign = make([]string, len(o.slots))
		for s := range o.assign {
			o.assign[s] = ownAssignee(uint32(s), ids)
		}
	}
	return o.assign
}

// ownAssignee is the member with the highest rendezvous weight for shard
// (ties to the greater id); "" if there is none.
func ownAssignee(shard uint32, ids []string) string {
	var best string
	var bestW uint64
	for _, id := range ids {
		w := ownWeight(shard, id)
		if best == "" || w > bestW || (w == bestW && id > best) {
			best, bestW = id, w
		}
	}
	return best
}

// ownWeight mixes FNV-1a of the id with the shard through splitmix64's
// finalizer: FNV alone scatters the last bytes poorly.
func ownWeight(shard uint32, id string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(id))
	return ownMix(h.Sum64() ^ ownMix(uint64(shard)+0x9e3779b97f4a7c15))
}

func ownMix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// handOver gives shards to their assignees: handed off (Lost for each, the
// Guard holding), then their keys deleted.
func (o *Ownership) handOver(ctx context.Context, terms []ownTerm) {
	dropped := o.handOff(terms)
	if len(dropped) == 0 {
		return
	}
	o.log.Info("shard ownership: handing over shards", "count", len(dropped))
	if err := o.deleteTerms(ctx, dropped); err != nil {
		o.log.Warn("shard ownership: hand-over: owner keys stay for now", "err", err)
	}
}

// campaign tries to take free shards (at most ownMaxTxnOps) in one Txn, one
// compare and one put per shard; if one was taken meanwhile, one by one.
// An error leaves the outcome unknown: a key won that way is on our lease
// but not owned, and is deleted as an orphan.
func (o *Ownership) campaign(ctx context.Context, shards []uint32, adopt map[uint32]string) {
	cmps := make([]clientv3.Cmp, len(shards))
	puts := make([]clientv3.Op, len(shards))
	for i, s := range shards {
		key := o.keys.owner(s)
		cmps[i] = clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
		puts[i] = clientv3.OpPut(key, o.opts.id, clientv3.WithLease(o.lease.ID()))
	}
	resp, err := o.cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
	switch {
	case err != nil:
		o.log.Debug("shard ownership: campaign failed", "shards", len(shards), "err", err)
	case resp.Succeeded:
		for _, s := range shards {
			o.acquire(s, resp.Header.Revision, adopt[s])
		}
	case len(shards) > 1:
		for _, s := range shards {
			o.campaign(ctx, []uint32{s}, adopt)
		}
	}
}

// deleteTerms deletes the owner keys of terms, each only if its create
// revision is still the term's, at most ownMaxTxnOps per Txn; a key already
// gone or created again is no longer ours, which is success.
func (o *Ownership) deleteTerms(ctx context.Context, terms []ownTerm) error {
	var first error
	for len(terms) > 0 {
		n := min(len(terms), ownMaxTxnOps)
		if err := o.deleteBatch(ctx, terms[:n]); err != nil && first == nil {
			first = err
		}
		terms = terms[n:]
	}
	return first
}

func (o *Ownership) deleteBatch(ctx context.Context, terms []ownTerm) error {
	cmps := make([]clientv3.Cmp, len(terms))
	dels := make([]clientv3.Op, len(terms))
	for i, t := range terms {
		key := o.keys.owner(t.shard)
		cmps[i] = clientv3.Compare(clientv3.CreateRevision(key), "=", t.rev)
		dels[i] = clientv3.OpDelete(key)
	}
	resp, err := o.cli.Txn(ctx).If(cmps...).Then(dels...).Commit()
	if err != nil {
		return err
	}
	switch {
	case resp.Succeeded:
		o.markFree(terms, resp.Header.Revision)
	case len(terms) > 1:
		var first error
		for i := range terms {
			if err := o.deleteBatch(ctx, terms[i:i+1]); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	return nil
}

// markFree records in the view that our delete at rev freed terms' keys.
func (o *Ownership) markFree(terms []ownTerm, rev int64) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, t := range terms {
		if o.slots[t.shard].mod < rev {
			o.slots[t.shard] = ownSlot{mod: rev, freeSince: now}
		}
	}
	o.changedLocked()
}

// acquire records that we won shard at rev and calls Acquired, unless we
// are closing or lost the lease meanwhile (Close deletes the key; a lost
// lease took it).
func (o *Ownership) acquire(shard uint32, rev int64, adoptedFrom string) {
	o.cbMu.Lock()
	defer o.cbMu.Unlock()
	o.mu.Lock()
	if o.slots[shard].mod < rev {
		o.slots[shard] = ownSlot{id: o.opts.id, create: rev, mod: rev, lease: o.lease.ID()}
		o.changedLocked()
	}
	if o.closing || o.leaseGone {
		o.mu.Unlock()
		return
	}
	o.owned[shard] = rev
	if adoptedFrom != "" {
		o.adopted[shard] = adoptedFrom
	}
	o.mu.Unlock()
	o.log.Debug("shard ownership: acquired", "shard", shard, "rev", rev)
	if o.cb.Acquired != nil {
		o.cb.Acquired(shard, rev)
	}
}

// drop ends our ownership of shard (of its term rev; 0: any) and calls
// Lost: the shard is lost (its key is gone or not ours, or the lease is),
// so the Guard ends first. It reports the term it ended.
func (o *Ownership) drop(shard uint32, rev int64) (int64, bool) {
	o.cbMu.Lock()
	defer o.cbMu.Unlock()
	o.mu.Lock()
	have, ok := o.owned[shard]
	if !ok || (rev != 0 && have != rev) {
		o.mu.Unlock()
		return 0, false
	}
	delete(o.owned, shard)
	delete(o.adopted, shard)
	o.mu.Unlock()
	o.log.Debug("shard ownership: lost", "shard", shard, "rev", have)
	if o.cb.Lost != nil {
		o.cb.Lost(shard)
	}
	return have, true
}

func (o *Ownership) dropTerms(terms []ownTerm) {
	for _, t := range terms {
		o.drop(t.shard, t.rev)
	}
}

// dropAll ends every ownership (lost) and returns the terms it ended.
func (o *Ownership) dropAll() []ownTerm {
	var ended []ownTerm
	for _, t := range o.ownedTerms() {
		if _, ok := o.drop(t.shard, t.rev); ok {
			ended = append(ended, t)
		}
	}
	return ended
}

// ownedTerms are the terms this member owns now.
func (o *Ownership) ownedTerms() []ownTerm {
	o.mu.Lock()
	defer o.mu.Unlock()
	terms := make([]ownTerm, 0, len(o.owned))
	for s, rev := range o.owned {
		terms = append(terms, ownTerm{s, rev})
	}
	return terms
}

// handOff ends our ownership of terms (rev 0: any term) gracefully and
// reports the terms it ended: Lost for each, all at once and while the
// Guard still holds, so that the runtime can let the units it has in
// flight commit and answer them (see the guarantees); then the Guard
// ends. The caller deletes the keys.
func (o *Ownership) handOff(terms []ownTerm) []ownTerm {
	o.cbMu.Lock()
	defer o.cbMu.Unlock()
	o.mu.Lock()
	var ending []ownTerm
	seen := map[uint32]bool{}
	for _, t := range terms {
		if have, ok := o.owned[t.shard]; ok && (t.rev == 0 || have == t.rev) && !seen[t.shard] {
			seen[t.shard] = true
			ending = append(ending, ownTerm{t.shard, have})
		}
	}
	o.mu.Unlock()
	if len(ending) == 0 {
		return nil
	}
	o.log.Debug("shard ownership: handing off", "shards", len(ending))
	if o.cb.Lost != nil {
		var wg sync.WaitGroup
		for _, t := range ending {
			wg.Go(func() { o.cb.Lost(t.shard) })
		}
		wg.Wait()
	}
	o.mu.Lock()
	for _, t := range ending {
		delete(o.owned, t.shard)
		delete(o.adopted, t.shard)
	}
	o.mu.Unlock()
	return ending
}

// leaseLost is the lease's Lost channel until the loss is handled; nil for
// a relay and afterwards.
func (o *Ownership) leaseLost() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.lease == nil || o.leaseGone {
		return nil
	}
	return o.lease.Lost()
}

// loseLease ends every ownership: etcd deleted our keys with the lease.
// This Ownership campaigns no more; the caller makes a new Lease and
// Ownership.
func (o *Ownership) loseLease() {
	o.mu.Lock()
	o.leaseGone = true
	o.mu.Unlock()
	n := len(o.dropAll())
	o.log.Warn("shard ownership: lease lost; every shard dropped", "shards", n)
}

// ownKeys is the key layout under a prefix.
type ownKeys struct{ root, count, members, owners string }

func ownKeysFor(prefix string) ownKeys {
	root := prefix + "shards/"
	return ownKeys{root: root, count: root + "count", members: root + "members/", owners: root + "owners/"}
}

func (k ownKeys) member(id string) string { return k.members + id }

// viewEnd ends the range the view reads and watches: from members/ to the
// last owner key. data/, marks/ and markcounts/ sort before members/, and
// nothing else sorts between members/ and owners/.
func (k ownKeys) viewEnd() string { return clientv3.GetPrefixRangeEnd(k.owners) }

func (k ownKeys) owner(shard uint32) string { return fmt.Sprintf("%s%05d", k.owners, shard) }

// shard parses an owner key of a shard below count.
func (k ownKeys) shard(key string, count int) (uint32, bool) {
	rest, ok := strings.CutPrefix(key, k.owners)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(rest, 10, 32)
	if err != nil || n >= uint64(count) || k.owner(uint32(n)) != key {
		return 0, false
	}
	return uint32(n), true
}
