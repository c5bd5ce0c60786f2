package keyspace

import (
	"context"
	"encoding/base64"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Page limits of the List-style reads (List, ListMarks).
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// PageSize resolves a requested page size: 0 is DefaultPageSize, above
// MaxPageSize is MaxPageSize, below 0 is a *FieldError for page_size.
func PageSize(n int) (int, error) {
	switch {
	case n < 0:
		return 0, FieldErr("page_size", "must not be negative, got %d", n)
	case n == 0:
		return DefaultPageSize, nil
	case n > MaxPageSize:
		return MaxPageSize, nil
	}
	return n, nil
}

// EncodePageToken makes the escaped name a page ended with an opaque
// cursor.
func EncodePageToken(escName string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(escName))
}

// DecodePageToken reads a cursor made by EncodePageToken for a listing of
// the escaped prefix escPrefix: the escaped name the next page starts
// after, "" for the first page (token ""). A token that is not one of
// ours, or that belongs to a listing of another prefix, is a *FieldError
// for page_token.
func DecodePageToken(token, escPrefix string) (string, error) {
	if token == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(b) == 0 {
		return "", FieldErr("page_token", "is not a token returned by List; pass next_page_token unchanged or leave it empty")
	}
	if !strings.HasPrefix(string(b), escPrefix) {
		return "", FieldErr("page_token", "belongs to another prefix; use it with the prefix of the call that returned it")
	}
	return string(b), nil
}

// Pager reads the keys of [from, end) in key order, a page of at most size
// keys per etcd read, each page starting right after the last key of the
// one before: a range of any length is read without one response holding
// it all. Use it as a bufio.Scanner:
//
//	p := keyspace.NewPager(cli, from, end, 512)
//	for p.Next(ctx) {
//		for _, kv := range p.Page() { ... }
//	}
//	if err := p.Err(); err != nil { ... }
//
// Without OneRevision each page is read at the revision current when it is
// read (a sweep that writes between pages sees its own writes and never
// reads a compacted revision); with it, every page is read at the first
// page's revision, so the pages together are one snapshot.
type Pager struct {
	kv       clientv3.KV
	from     string
	end      string
	size     int64
	pin      bool
	keysOnly bool

	rev  int64 // the first page's revision, once read (with pin)
	page []*mvccpb.KeyValue
	done bool
	err  error
}

// PageOption configures a Pager.
type PageOption func(*Pager)

// OneRevision reads every page at the revision of the first.
func OneRevision() PageOption { return func(p *Pager) { p.pin = true } }

// KeysOnly reads keys without their values.
func KeysOnly() PageOption { return func(p *Pager) { p.keysOnly = true } }

// NewPager returns a Pager over the keys of [from, end), size keys a page.
func NewPager(kv clientv3.KV, from, end string, size int64, opts ...PageOption) *Pager {
	p := &Pager{kv: kv, from: from, end: end, size: size}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Next reads the next page; false when the range is exhausted or a read
// failed (see Err).
func (p *Pager) Next(ctx context.Context) bool {
	if p.done {
		return false
	}
	opts := []clientv3.OpOption{clientv3.WithRange(p.end), clientv3.WithLimit(p.size)}
	if p.keysOnly {
		opts = append(opts, clientv3.WithKeysOnly())
	}
	if p.rev != 0 {
		opts = append(opts, clientv3.WithRev(p.rev))
	}
	r, err := p.kv.Get(ctx, p.from, opts...)
	if err != nil {
		p.done, p.err, p.page = true, err, nil
		return false
	}
	if p.pin && p.rev == 0 {
		// The header's revision is the store's current one, not the one
		// read: only the first page's is the snapshot's.
		p.rev = r.Header.Revision
	}
	p.page = r.Kvs
	if !r.More || len(r.Kvs) == 0 {
		p.done = true
	} else {
		p.from = string(r.Kvs[len(r.Kvs)-1].Key) + "\x00"
	}
	return len(r.Kvs) > 0
}

// Page is the page the last Next read.
func (p *Pager) Page() []*mvccpb.KeyValue { return p.page }

// Err is the error of the read that ended the paging, nil if the range was
// read to its end.
func (p *Pager) Err() error { return p.err }
