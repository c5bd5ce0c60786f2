package lease

import (
	"context"
	"time"

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
}

// Waiter is a queued contender.
type Waiter struct {
	Owner        string
	WaitingSince time.Time
}

// Description is one lock's state.
type Description struct {
	Holder  *Holder // nil when free
	Waiters []Waiter
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
	for i, kv := range r.Kvs {
		rec := decodeRecord(kv.Value)
		if !q.admittedAt(i) {
			d.Waiters = append(d.Waiters, Waiter{Owner: rec.Owner, WaitingSince: unixTime(rec.Since)})
			continue
		}
		h := &Holder{Name: name, Token: kv.CreateRevision, Owner: rec.Owner, AcquiredAt: unixTime(rec.Acquired)}
		start := m.now()
		ttl, err := m.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		if err != nil {
			return nil, m.etcdErr(ctx, "describe lease", err)
		}
		h.ExpiresAt = start.Add(time.Duration(max(ttl.TTL, 0)) * time.Second)
		d.Holder = h
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
		out  []Holder
		cur  string // escaped name of the group being read
		best *holderKV
	)
	flush := func() {
		if best != nil {
			out = append(out, best.holder(unescape(cur)))
		}
	}
	pages := keyspace.NewPager(m.cli, from, clientv3.GetPrefixRangeEnd(base), listBatch, keyspace.OneRevision())
	for pages.Next(ctx) {
		for _, kv := range pages.Page() {
			n, ok := m.ks.nameOf(string(kv.Key))
			if !ok {
				continue
			}
			if n != cur || best == nil {
				flush()
				if len(out) == pageSize {
					return out, encodePageToken(cur), nil
				}
				cur, best = n, &holderKV{rev: kv.CreateRevision, value: kv.Value}
				continue
			}
			if kv.CreateRevision < best.rev {
				best = &holderKV{rev: kv.CreateRevision, value: kv.Value}
			}
		}
	}
	if err := pages.Err(); err != nil {
		return nil, "", m.etcdErr(ctx, "list", err)
	}
	flush()
	return out, "", nil
}

type holderKV struct {
	rev   int64
	value []byte
}

func (h *holderKV) holder(name string) Holder {
	rec := decodeRecord(h.value)
	return Holder{Name: name, Token: h.rev, Owner: rec.Owner, AcquiredAt: unixTime(rec.Acquired)}
}
