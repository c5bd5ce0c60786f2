package client

import (
	"context"
	"iter"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// ListOption configures a listing.
type ListOption func(*listOptions)

type listOptions struct{ pageSize int32 }

// WithPageSize asks for at most n holders per page (default: the
// coordinator's, 100; it serves at most 1000).
func WithPageSize(n int32) ListOption { return func(o *listOptions) { o.pageSize = n } }

// Pager pages through the held locks whose names start with a prefix, in
// List's stable order (see the List RPC). Each page is one call, with the
// context given to it, so each can have its own deadline. A Pager is not
// safe for concurrent use.
type Pager struct {
	c      *Client
	prefix string
	size   int32
	next   string // the page token of the next page
	done   bool
}

// Pages returns a Pager over the held locks whose names start with prefix
// ("": every lock).
func (c *Client) Pages(prefix string, opts ...ListOption) *Pager {
	o := listOptions{}
	for _, opt := range opts {
		opt(&o)
	}
	return &Pager{c: c, prefix: prefix, size: o.pageSize}
}

// More reports whether a page is left to read.
func (p *Pager) More() bool { return !p.done }

// Next returns the next page (possibly empty, on the last); UNAVAILABLE is
// retried until ctx ends. After an error, Next may be called again: it asks
// for the same page.
func (p *Pager) Next(ctx context.Context) ([]Holder, error) {
	if p.done {
		return nil, nil
	}
	var resp *coordinatorv1.ListResponse
	err := p.c.retry(ctx, func(ctx context.Context) error {
		var err error
		resp, err = p.c.lc.List(ctx, &coordinatorv1.ListRequest{Prefix: p.prefix, PageSize: p.size, PageToken: p.next})
		return err
	})
	if err != nil {
		return nil, err
	}
	holders := holdersOf(resp.GetHolders())
	p.next = resp.GetNextPageToken()
	p.done = p.next == ""
	return holders, nil
}

// List yields every held lock whose name starts with prefix, page by page,
// all under ctx; on an error it yields the error once and stops.
func (c *Client) List(ctx context.Context, prefix string, opts ...ListOption) iter.Seq2[Holder, error] {
	return func(yield func(Holder, error) bool) {
		p := c.Pages(prefix, opts...)
		for p.More() {
			page, err := p.Next(ctx)
			if err != nil {
				yield(Holder{}, err)
				return
			}
			for _, h := range page {
				if !yield(h, nil) {
					return
				}
			}
		}
	}
}
