package client

import (
	"context"
	"iter"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// Mark is a protected resource's high-water mark: the greatest token
// ValidateToken accepted for it, and the lock whose tokens raise it.
type Mark struct {
	Resource string
	// PerSlot marks the mark of one slot (Slot) of a semaphore that protects
	// the resource: its holders raise one mark per (resource, slot), since
	// tokens rise per slot. Otherwise it is the resource's own mark, the
	// one a mutex's holders and a read-write lock's writers raise.
	PerSlot bool
	Slot    int32
	// Token is the mark: tokens below it are refused (REASON_FENCED).
	Token int64
	// Lock owns the mark: only its tokens raise it.
	Lock string
	// UpdatedAt is when the mark last advanced (coordinator clock).
	UpdatedAt time.Time
}

// MarkOption chooses which of a resource's marks GetMark, DeleteMark and
// RebindMark mean: without one, the resource's own.
type MarkOption func(*markOptions)

type markOptions struct{ slot *wrapperspb.Int32Value }

// OfSlot means the mark of slot k of a semaphore that protects the resource
// (Grant.Slot of its holders); a negative k is INVALID_ARGUMENT.
func OfSlot(k int32) MarkOption { return func(o *markOptions) { o.slot = wrapperspb.Int32(k) } }

func slotOf(opts []MarkOption) *wrapperspb.Int32Value {
	var o markOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o.slot
}

// GetMark returns the mark of resource (of one semaphore slot with
// OfSlot); NOT_FOUND when no token was ever accepted for it. UNAVAILABLE is
// retried until ctx ends.
func (c *Client) GetMark(ctx context.Context, resource string, opts ...MarkOption) (Mark, error) {
	var resp *coordinatorv1.GetMarkResponse
	req := &coordinatorv1.GetMarkRequest{Resource: resource, Slot: slotOf(opts)}
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.fc.GetMark(ctx, req)
		return err
	})
	return markOf(resp.GetMark()), err
}

// MarkPager pages through the marks of the resources whose names start with
// a prefix, in ListMarks' stable order. Each page is one call, with the
// context given to it. A MarkPager is not safe for concurrent use.
type MarkPager struct {
	c      *Client
	prefix string
	size   int32
	next   string
	done   bool
}

// MarkPages returns a MarkPager over the marks of the resources whose names
// start with prefix ("": every mark the caller may see). WithPageSize sets
// the marks per page.
func (c *Client) MarkPages(prefix string, opts ...ListOption) *MarkPager {
	o := listOptions{}
	for _, opt := range opts {
		opt(&o)
	}
	return &MarkPager{c: c, prefix: prefix, size: o.pageSize}
}

// More reports whether a page is left to read.
func (p *MarkPager) More() bool { return !p.done }

// Next returns the next page (possibly empty, on the last); UNAVAILABLE is
// retried until ctx ends. After an error, Next may be called again: it asks
// for the same page.
func (p *MarkPager) Next(ctx context.Context) ([]Mark, error) {
	if p.done {
		return nil, nil
	}
	var resp *coordinatorv1.ListMarksResponse
	err := p.c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = p.c.fc.ListMarks(ctx, &coordinatorv1.ListMarksRequest{Prefix: p.prefix, PageSize: p.size, PageToken: p.next})
		return err
	})
	if err != nil {
		return nil, err
	}
	marks := make([]Mark, 0, len(resp.GetMarks()))
	for _, m := range resp.GetMarks() {
		marks = append(marks, markOf(m))
	}
	p.next = resp.GetNextPageToken()
	p.done = p.next == ""
	return marks, nil
}

// Marks yields every mark of the resources whose names start with prefix,
// page by page, all under ctx; on an error it yields the error once and
// stops.
func (c *Client) Marks(ctx context.Context, prefix string, opts ...ListOption) iter.Seq2[Mark, error] {
	return func(yield func(Mark, error) bool) {
		p := c.MarkPages(prefix, opts...)
		for p.More() {
			page, err := p.Next(ctx)
			if err != nil {
				yield(Mark{}, err)
				return
			}
			for _, m := range page {
				if !yield(m, nil) {
					return
				}
			}
		}
	}
}

// DeleteMark removes the mark of resource (of one semaphore slot with
// OfSlot), for admins (PERMISSION_DENIED
// otherwise), and returns it as it was; NOT_FOUND when there is none. No
// stale token gets through after it (the lock check alone refuses them),
// but the ownership is given up: the next lock to validate a current token
// against resource owns it. UNAVAILABLE is not retried: a retry after a
// lost answer would answer NOT_FOUND, or delete a mark made in between.
func (c *Client) DeleteMark(ctx context.Context, resource string, opts ...MarkOption) (Mark, error) {
	resp, err := c.fc.DeleteMark(ctx, &coordinatorv1.DeleteMarkRequest{Resource: resource, Slot: slotOf(opts)})
	return markOf(resp.GetMark()), err
}

// RebindMark gives the mark of resource (of one semaphore slot with
// OfSlot) to lock, for admins
// (PERMISSION_DENIED otherwise), keeping its token, and returns the mark
// after the change; NOT_FOUND when resource has none. UNAVAILABLE is
// retried until ctx ends: rebinding twice to the same lock is rebinding
// once.
func (c *Client) RebindMark(ctx context.Context, resource, lock string, opts ...MarkOption) (Mark, error) {
	var resp *coordinatorv1.RebindMarkResponse
	req := &coordinatorv1.RebindMarkRequest{Resource: resource, Lock: lock, Slot: slotOf(opts)}
	err := c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = c.fc.RebindMark(ctx, req)
		return err
	})
	return markOf(resp.GetMark()), err
}

// markOf converts a Mark message (nil: the zero Mark).
func markOf(m *coordinatorv1.Mark) Mark {
	return Mark{Resource: m.GetResource(), PerSlot: m.GetSlot() != nil, Slot: m.GetSlot().GetValue(),
		Token: m.GetToken(), Lock: m.GetLock(), UpdatedAt: asTime(m.GetUpdatedAt())}
}
