package lease

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// leasePool keeps the leases of cleanly released grants, keyless, for the
// next Acquire with the same TTL: reusing one costs a KeepAlive (served by
// the etcd leader from memory) instead of a LeaseGrant (a raft proposal). A
// pooled lease has no keys, so its expiry in the pool harms nothing; a
// reused lease gets a new handle secret, so stale handles stay useless.
type leasePool struct {
	mu   sync.Mutex
	free map[int64][]pooledLease // by granted TTL in seconds
}

type pooledLease struct {
	id        clientv3.LeaseID
	at        time.Time // when it was pooled
	refreshed time.Time // when a refresh of it was last sent (zero: unknown)
}

const maxPooledPerTTL = 256

func (p *leasePool) put(ttl int64, id clientv3.LeaseID, now, refreshed time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.free == nil {
		p.free = map[int64][]pooledLease{}
	}
	if len(p.free[ttl]) < maxPooledPerTTL {
		p.free[ttl] = append(p.free[ttl], pooledLease{id, now, refreshed})
	}
}

// get returns a pooled lease of ttl seconds that was pooled recently enough
// to surely still live (less than half its TTL ago).
func (p *leasePool) get(ttl int64, now time.Time) (pooledLease, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := p.free[ttl]; len(l) > 0; l = p.free[ttl] {
		e := l[len(l)-1]
		p.free[ttl] = l[:len(l)-1]
		if now.Sub(e.at) < time.Duration(ttl)*time.Second/2 {
			return e, true
		}
	}
	return pooledLease{}, false
}

// freshFor is how recently a pooled lease must have been refreshed to be
// reused without a refresh: a tenth of its TTL, at most a second. Its grant
// then expires at that refresh plus the TTL, a little less than a full TTL
// from now (the answer's expires_at says so).
func freshFor(ttl int64) time.Duration { return min(time.Duration(ttl)*time.Second/10, time.Second) }

// markerLease carries the "how did it end" marker keys: short-lived, since
// readers look them up at the revision of the end (MVCC history).
type markerLease struct {
	mu      sync.Mutex
	id      clientv3.LeaseID
	expires time.Time
}

const markerTTL = 60 // seconds

func (m *Manager) markerLease(ctx context.Context) (clientv3.LeaseID, error) {
	m.marker.mu.Lock()
	defer m.marker.mu.Unlock()
	now := m.now()
	if m.marker.id != 0 && now.Add(20*time.Second).Before(m.marker.expires) {
		return m.marker.id, nil
	}
	lr, err := m.cli.Grant(ctx, markerTTL)
	if err != nil {
		return 0, err
	}
	m.marker.id, m.marker.expires = lr.ID, now.Add(time.Duration(lr.TTL)*time.Second)
	return lr.ID, nil
}

// ended is the key whose value, at the revision a grant ended, says how:
// "<released|forced>:<token>".
func (k Keyspace) ended(name string) string { return k.prefix + "ended/" + escape(name) }

// endAt says how the grant of name with token ended at revision rev.
func (m *Manager) endAt(ctx context.Context, name string, token, rev int64) EndReason {
	r, err := m.cli.Get(ctx, m.ks.ended(name), clientv3.WithRev(rev))
	if err != nil || len(r.Kvs) == 0 || r.Kvs[0].ModRevision != rev {
		return EndExpired
	}
	how, tok, _ := strings.Cut(string(r.Kvs[0].Value), ":")
	if tok != strconv.FormatInt(token, 10) {
		return EndExpired
	}
	switch how {
	case endReleased:
		return EndReleased
	case endForced:
		return EndForced
	}
	return EndExpired
}

// endedAlready says how the grant of name with token ended, from the
// lock's latest end marker (EndExpired if that marker is another grant's).
func (m *Manager) endedAlready(ctx context.Context, name string, token int64) EndReason {
	r, err := m.cli.Get(ctx, m.ks.ended(name))
	if err != nil || len(r.Kvs) == 0 {
		return EndExpired
	}
	return m.endAt(ctx, name, token, r.Kvs[0].ModRevision)
}

// end removes the grant h in one transaction, recording how it ended; a
// clean release also removes the lock-delay key. Then the grant's lease is
// recycled (released) or revoked in the background (forced); a session's
// lease is left alone.
func (m *Manager) end(ctx context.Context, h *held, how string) (bool, error) {
	marker, err := m.markerLease(ctx)
	if err != nil {
		return false, m.etcdErr(ctx, "grant marker lease", err)
	}
	ops := []clientv3.Op{
		clientv3.OpDelete(h.key),
		clientv3.OpPut(m.ks.ended(h.name), how+":"+strconv.FormatInt(h.token, 10), clientv3.WithLease(marker)),
	}
	if h.rec.Req != "" {
		ops = append(ops, clientv3.OpDelete(h.rec.Req))
	}
	ops = append(ops, m.slotsDelete(h.name, h.rec)...)
	delay := clientv3.LeaseID(h.rec.DelayLease)
	if how == endReleased && delay != 0 {
		ops = append(ops, clientv3.OpDelete(m.ks.delay(h.name)))
	}
	res := m.batch.do(ctx, "", []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(h.key), "=", h.modRev)}, ops, nil)
	if err := res.err; err != nil {
		return false, m.etcdErr(ctx, "end grant", err)
	}
	m.grants.drop(h.key)
	if !res.ok {
		return false, nil // changed or ended since it was read: not ended by this call
	}
	switch {
	case h.session:
	case how == endReleased && h.rec.TTL > 0:
		m.pool.put(h.rec.TTL, h.id, m.now(), h.refreshed)
	default:
		m.revokeLater(h.id)
	}
	if how == endReleased && delay != 0 {
		m.revokeLater(delay)
	}
	return true, nil
}

// revokeLater revokes a lease in the background; Close waits for it. On
// failure the lease ends with its TTL (it carries nothing that matters).
func (m *Manager) revokeLater(id clientv3.LeaseID) {
	m.spawn(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if _, err := m.cli.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			m.log.Debug("background revoke failed; the lease ends with its TTL", "lease", formatLease(id), "err", err)
		}
	})
}

// goOwned runs f in a goroutine that Close waits for, or reports false
// once Close has begun (f must end when m.stop does).
func (m *Manager) goOwned(f func()) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closing {
		return false
	}
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		f()
	}()
	return true
}

// keepAliveOnce renews a lease once over the shared keepalive streams
// (after Close: over a stream of its own).
func (m *Manager) keepAliveOnce(ctx context.Context, id clientv3.LeaseID) (int64, error) {
	ttl, err := m.ka.once(ctx, id)
	if errors.Is(err, errStreamClosed) {
		ka, err := m.cli.KeepAliveOnce(ctx, id)
		if err != nil {
			return 0, err
		}
		return ka.TTL, nil
	}
	return ttl, err
}

// spawn runs f in a goroutine that Close waits for; once Close has begun,
// it runs f inline instead.
func (m *Manager) spawn(f func()) {
	m.mu.Lock()
	if m.closing {
		m.mu.Unlock()
		f()
		return
	}
	m.bg.Add(1)
	m.mu.Unlock()
	go func() {
		defer m.bg.Done()
		f()
	}()
}
