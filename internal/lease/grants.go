package lease

import (
	"sync"
	"time"
)

// grantCache remembers the grants this manager made, so that their release
// needs no read: the release transaction compares the queue key's mod
// revision with the one remembered, which proves the key still holds the
// very record written at the grant (nothing rewrites a granted key). A
// miss, or a failed compare, falls back to reading the grant. Entries of
// grants that ended elsewhere (expiry, another replica) are harmless: their
// compare fails; the size is bounded.
type grantCache struct {
	mu sync.Mutex
	m  map[string]cachedGrant // by queue key
}

type cachedGrant struct {
	token  int64
	modRev int64
	rec    record
	// refreshed is when this manager last sent a refresh of the grant's
	// lease (at the grant; zero if unknown): its lease lives at least
	// until refreshed + TTL.
	refreshed time.Time
}

const maxCachedGrants = 16384

func (c *grantCache) put(key string, g cachedGrant) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]cachedGrant{}
	}
	if _, ok := c.m[key]; !ok && len(c.m) >= maxCachedGrants {
		for k := range c.m { // evict an arbitrary entry
			delete(c.m, k)
			break
		}
	}
	c.m[key] = g
}

func (c *grantCache) get(key string) (cachedGrant, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	g, ok := c.m[key]
	return g, ok
}

// touch records a refresh of the grant's lease sent at t.
func (c *grantCache) touch(key string, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g, ok := c.m[key]; ok && t.After(g.refreshed) {
		g.refreshed = t
		c.m[key] = g
	}
}

func (c *grantCache) drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
}
