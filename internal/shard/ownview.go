package shard

// The ownership view: one goroutine follows the members and owner keys
// (<prefix>shards/members/ through <prefix>shards/owners/, one range that
// holds nothing else: the shards' grants and marks sort before it, so no
// member watches another's writes) from an initial Get, re-reading after a watch error or a
// compaction, and reconciles after every change.

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// run is the goroutine: follow the view from rev and reconcile, re-read
// after a watch ends, until Close.
func (o *Ownership) run(ctx context.Context, rev int64) {
	defer close(o.done)
	tick := time.NewTicker(min(max(o.opts.adoptAfter/4, 50*time.Millisecond), time.Second))
	defer tick.Stop()
	for ctx.Err() == nil {
		o.reconcile(ctx)
		o.follow(ctx, rev+1, tick.C)
		rev = o.reload(ctx)
	}
}

// follow applies the watch's events from revision from, and reconciles
// after each change and tick, until the watch fails or ctx ends.
func (o *Ownership) follow(ctx context.Context, from int64, tick <-chan time.Time) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := o.cli.Watch(wctx, o.keys.members, clientv3.WithRange(o.keys.viewEnd()), clientv3.WithRev(from))
	for {
		select {
		case <-ctx.Done():
			return
		case <-o.leaseLost():
			o.loseLease()
		case <-tick:
		case resp, ok := <-wch:
			if !ok || resp.Err() != nil || resp.Canceled {
				o.log.Debug("shard ownership: watch ended; reading again", "err", resp.Err())
				return
			}
			o.apply(resp.Events)
		}
		o.reconcile(ctx)
	}
}

// reload reads the view again, retrying until it succeeds or ctx ends.
func (o *Ownership) reload(ctx context.Context) int64 {
	for {
		select {
		case <-ctx.Done():
			return 0
		case <-o.leaseLost():
			o.loseLease()
		case <-time.After(ownRetry):
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		rev, err := o.load(rctx)
		cancel()
		if err == nil {
			return rev
		}
		o.log.Debug("shard ownership: read failed", "err", err)
	}
}

// load replaces the view with a read of the members and owner keys, drops the shards
// it shows are no longer ours, and returns the read's revision.
func (o *Ownership) load(ctx context.Context) (int64, error) {
	resp, err := o.cli.Get(ctx, o.keys.members, clientv3.WithRange(o.keys.viewEnd()))
	if err != nil {
		return 0, err
	}
	now := time.Now()
	o.mu.Lock()
	old := o.slots
	o.members, o.slots, o.assign = map[string]Member{}, make([]ownSlot, o.opts.count), nil
	for _, kv := range resp.Kvs {
		o.applyLocked(&clientv3.Event{Type: clientv3.EventTypePut, Kv: kv}, now)
	}
	for s := range o.slots {
		if v := &o.slots[s]; v.create == 0 {
			v.mod, v.freeSince = resp.Header.Revision, now
			if old[s].create == 0 && !old[s].freeSince.IsZero() {
				v.freeSince = old[s].freeSince
			}
		}
	}
	lost := o.lostLocked()
	o.changedLocked()
	o.mu.Unlock()
	o.dropTerms(lost)
	return resp.Header.Revision, nil
}

// apply applies watch events to the view and drops the shards they show
// are no longer ours.
func (o *Ownership) apply(evs []*clientv3.Event) {
	now := time.Now()
	o.mu.Lock()
	for _, ev := range evs {
		o.applyLocked(ev, now)
	}
	lost := o.lostLocked()
	if len(evs) > 0 {
		o.changedLocked()
	}
	o.mu.Unlock()
	o.dropTerms(lost)
}

// applyLocked applies one change of a member or owner key.
func (o *Ownership) applyLocked(ev *clientv3.Event, now time.Time) {
	key := string(ev.Kv.Key)
	if id, ok := strings.CutPrefix(key, o.keys.members); ok {
		delete(o.members, id)
		if ev.Type == clientv3.EventTypePut {
			m := Member{ID: id}
			if err := json.Unmarshal(ev.Kv.Value, &m); err != nil {
				o.log.Warn("shard ownership: unreadable member key", "key", key, "err", err)
			}
			m.ID = id
			o.members[id] = m
		}
		o.assign = nil
		return
	}
	s, ok := o.keys.shard(key, o.opts.count)
	if !ok || ev.Kv.ModRevision <= o.slots[s].mod {
		return
	}
	if ev.Type == clientv3.EventTypeDelete {
		o.slots[s] = ownSlot{mod: ev.Kv.ModRevision, freeSince: now}
		return
	}
	o.slots[s] = ownSlot{id: string(ev.Kv.Value), create: ev.Kv.CreateRevision, mod: ev.Kv.ModRevision,
		lease: clientv3.LeaseID(ev.Kv.Lease)}
}

// lostLocked lists the owned terms whose owner key the view no longer
// shows (deleted, or created again).
func (o *Ownership) lostLocked() []ownTerm {
	var lost []ownTerm
	for s, rev := range o.owned {
		if o.slots[s].create != rev {
			lost = append(lost, ownTerm{s, rev})
		}
	}
	return lost
}
