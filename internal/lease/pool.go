package lease

import (
	"sync"
	"time"

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
