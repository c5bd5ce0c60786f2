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

// Ending a grant: the end transaction, the marker that records how a grant
// ended (released, forced or, without a marker, expired), and the
// background revoke of a lease nobody needs any more.

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
func (k Keyspace) ended(name string) string { return k.Ended(name) }

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
		ops = append(ops, clientv3.OpDelete(m.ks.SlotDelay(h.name, h.rec.Slot)))
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
