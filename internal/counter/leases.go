package counter

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// leasePool hands out the shared cleanup leases of counters and request
// records. Keys that must live until about the same time share one lease:
// the deadline is rounded up to the granularity, and the lease outlives
// that by the slack, since etcd's lease clock is coarse (whole seconds, a
// floor of a few seconds), lags under load and restarts on a leader change.
// The window itself is never measured by a lease (the value holds its end):
// a lease only deletes keys that are idle anyway. A pool holds one lease
// per span in use; leases are never revoked, they expire.
type leasePool struct {
	cli         *clientv3.Client
	granularity time.Duration
	slack       time.Duration

	mu     sync.Mutex
	leases map[int64]clientv3.LeaseID // span end (unix ns) -> lease
}

// get returns a lease that lives at least until until (unix ns) and the
// span end it covers (store it as the key's leaseEnd).
func (p *leasePool) get(ctx context.Context, until int64) (clientv3.LeaseID, int64, error) {
	g := int64(p.granularity)
	end := (until + g - 1) / g * g
	p.mu.Lock()
	id, ok := p.leases[end]
	p.mu.Unlock()
	if ok {
		return id, end, nil
	}
	now := time.Now().UnixNano()
	ttl := (time.Duration(end-now) + p.slack + time.Second - 1) / time.Second
	resp, err := p.cli.Grant(ctx, int64(max(ttl, 1)))
	if err != nil {
		return 0, 0, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for e := range p.leases {
		if e < now {
			delete(p.leases, e)
		}
	}
	if id, ok := p.leases[end]; ok {
		return id, end, nil // granted meanwhile; ours expires unused
	}
	p.leases[end] = resp.ID
	return resp.ID, end, nil
}

// forget drops every lease (one was found gone: revoked, or expired early).
func (p *leasePool) forget() {
	p.mu.Lock()
	clear(p.leases)
	p.mu.Unlock()
}
