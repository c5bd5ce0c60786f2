package lease

import (
	"cmp"
	"context"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// Holder is the current grant of a lock, as operators see it.
type Holder struct {
	Name       string
	Token      int64
	Owner      string
	AcquiredAt time.Time
	ExpiresAt  time.Time // zero in List
	Shared     bool      // a read-write lock's reader
	Slot       int32     // a semaphore holder's slot
	Limit      int32     // the queue's limit: 1 for a mutex or a read-write lock
}

// Waiter is a queued contender.
type Waiter struct {
	Owner        string
	WaitingSince time.Time
	Shared       bool
}

// Description is one lock's state.
type Description struct {
	Holder  *Holder  // the oldest holder; nil when free
	Holders []Holder // every holder, oldest first
	Waiters []Waiter
}

// holderOfRecord is the holder of a queue entry (acquired_at and
// expires_at aside).
func holderOfRecord(name string, token int64, rec record) Holder {
	return Holder{Name: name, Token: token, Owner: rec.Owner, AcquiredAt: unixTime(rec.Acquired),
		Shared: rec.Shared, Slot: rec.Slot, Limit: rec.shape().EffectiveLimit()}
}

// shapesOf are the shapes of queue entries, in their order.
func shapesOf(kvs []*mvccpb.KeyValue) []keyspace.Shape {
	out := make([]keyspace.Shape, len(kvs))
	for i, kv := range kvs {
		out[i], _ = keyspace.ShapeOf(kv.Value)
	}
	return out
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// Describe reads a lock's holder and waiters in queue order.
func (m *Manager) Describe(ctx context.Context, name string) (*Description, error) {
	if err := ValidateName("name", name, false); err != nil {
		return nil, err
	}
	q := m.admission(name)
	r, err := m.cli.Get(ctx, q.queue, clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, m.etcdErr(ctx, "describe", err)
	}
	d := &Description{}
	shapes := shapesOf(r.Kvs)
	for i, kv := range r.Kvs {
		rec := decodeRecord(kv.Value)
		if !q.admittedAt(shapes, i) {
			d.Waiters = append(d.Waiters, Waiter{Owner: rec.Owner, WaitingSince: unixTime(rec.Since), Shared: rec.Shared})
			continue
		}
		h := holderOfRecord(name, kv.CreateRevision, rec)
		start := m.now()
		ttl, err := m.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		if err != nil {
			return nil, m.etcdErr(ctx, "describe lease", err)
		}
		h.ExpiresAt = start.Add(time.Duration(max(ttl.TTL, 0)) * time.Second)
		d.Holders = append(d.Holders, h)
	}
	if len(d.Holders) > 0 {
		d.Holder = &d.Holders[0]
	}
	return d, nil
}

// Page limits of List.
const (
	DefaultPageSize = keyspace.DefaultPageSize
	MaxPageSize     = keyspace.MaxPageSize
	listBatch       = 512
)

// List returns up to pageSize holders of locks whose names start with
// prefix, in etcd key order (see the List RPC), after the cursor pageToken, and the
// cursor of the next page ("" on the last page). The queues are read at one
// revision.
func (m *Manager) List(ctx context.Context, prefix string, pageSize int, pageToken string) ([]Holder, string, error) {
	if err := ValidateName("prefix", prefix, true); err != nil {
		return nil, "", err
	}
	pageSize, err := keyspace.PageSize(pageSize)
	if err != nil {
		return nil, "", err
	}
	after, err := keyspace.DecodePageToken(pageToken, escape(prefix))
	if err != nil {
		return nil, "", err
	}
	base := m.ks.locks() + escape(prefix)
	from := base
	if after != "" {
		from = m.ks.locks() + after + "0" // "0" sorts right after "/": skip that name's keys
	}

	var (
		out   []Holder
		cur   string             // escaped name of the group being read
		group []*mvccpb.KeyValue // its entries
	)
	flush := func() {
		out = append(out, holdersOf(unescape(cur), group)...)
		group = group[:0]
	}
	pages := keyspace.NewPager(m.cli, from, clientv3.GetPrefixRangeEnd(base), listBatch, keyspace.OneRevision())
	for pages.Next(ctx) {
		for _, kv := range pages.Page() {
			n, ok := m.ks.nameOf(string(kv.Key))
			if !ok {
				continue
			}
			if n != cur && len(group) > 0 {
				flush()
				if len(out) >= pageSize {
					return out, encodePageToken(cur), nil
				}
			}
			cur, group = n, append(group, kv)
		}
	}
	if err := pages.Err(); err != nil {
		return nil, "", m.etcdErr(ctx, "list", err)
	}
	if len(group) > 0 {
		flush()
	}
	return out, "", nil
}

// holdersOf are the holders among one queue's entries (any order), oldest
// first.
func holdersOf(name string, kvs []*mvccpb.KeyValue) []Holder {
	slices.SortFunc(kvs, func(a, b *mvccpb.KeyValue) int { return cmp.Compare(a.CreateRevision, b.CreateRevision) })
	n := keyspace.Holders(shapesOf(kvs))
	out := make([]Holder, n)
	for i, kv := range kvs[:n] {
		out[i] = holderOfRecord(name, kv.CreateRevision, decodeRecord(kv.Value))
	}
	return out
}
