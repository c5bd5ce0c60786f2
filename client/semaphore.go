package client

import "context"

// Semaphores and read-write locks: the same queue as a lock, admitting
// more than one holder (AcquireRequest.limit and mode). Each permit is a
// *Lock of its own, with its token, heartbeat, Done and SafeUntil.

// WithLimit makes the acquisition a counting semaphore's: n holders at
// once (n > 1; 0 or 1 is a mutex). Every acquisition of a name must ask for
// the same limit: another answers FAILED_PRECONDITION, reason
// LIMIT_MISMATCH. Semaphore sets it.
func WithLimit(n int32) AcquireOption { return func(o *acquireOptions) { o.limit = n } }

// WithShared makes the acquisition a read-write lock's reader's: it holds
// together with other readers, never with a writer (an acquisition without
// it). RWMutex.RLock sets it.
func WithShared() AcquireOption { return func(o *acquireOptions) { o.shared = true } }

// Semaphore is a fenced counting semaphore: at most Limit holders of Name
// at once, granted first come, first served. Each permit has a slot
// (Lock.Slot) and tokens rise per slot: a resource protected by the
// semaphore keeps one high-water mark per (resource, slot) and refuses a
// paused former holder of that slot (ValidateToken with a resource does).
type Semaphore struct {
	c     *Client
	name  string
	limit int32
}

// Semaphore returns the semaphore of n permits on name. Nothing is sent
// until Acquire.
func (c *Client) Semaphore(name string, n int32) *Semaphore {
	return &Semaphore{c: c, name: name, limit: n}
}

// Acquire waits for a permit (as Client.Acquire waits for a lock: same
// options, retries and errors) and keeps it alive until Release.
func (s *Semaphore) Acquire(ctx context.Context, opts ...AcquireOption) (*Lock, error) {
	return s.c.Acquire(ctx, s.name, append(opts, WithLimit(s.limit))...)
}

// RWMutex is a fenced read-write lock: many readers (RLock) or one writer
// (Lock) of Name, first come, first served; a reader behind a waiting
// writer waits, so readers cannot starve a writer. Only the writer's token
// may raise a resource's mark.
type RWMutex struct {
	c    *Client
	name string
}

// RWMutex returns the read-write lock on name. Nothing is sent until Lock
// or RLock. A plain Client.Acquire of the same name is a writer.
func (c *Client) RWMutex(name string) *RWMutex { return &RWMutex{c: c, name: name} }

// Lock waits to hold name as its writer.
func (m *RWMutex) Lock(ctx context.Context, opts ...AcquireOption) (*Lock, error) {
	return m.c.Acquire(ctx, m.name, opts...)
}

// RLock waits to hold name as one of its readers.
func (m *RWMutex) RLock(ctx context.Context, opts ...AcquireOption) (*Lock, error) {
	return m.c.Acquire(ctx, m.name, append(opts, WithShared())...)
}
