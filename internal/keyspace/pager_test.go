package keyspace

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/embedetcd"
)

func etcdClient(t *testing.T) *clientv3.Client {
	t.Helper()
	e, err := embedetcd.Start(context.Background(), t.TempDir(), embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// readAll pages through [from, end) and returns the keys, the values seen
// and the number of pages; between pages it runs between (if set).
func readAll(t *testing.T, p *Pager, between func()) (keys []string, values int, pages int) {
	t.Helper()
	for p.Next(context.Background()) {
		pages++
		for _, kv := range p.Page() {
			keys = append(keys, string(kv.Key))
			if len(kv.Value) > 0 {
				values++
			}
		}
		if between != nil {
			between()
		}
	}
	if err := p.Err(); err != nil {
		t.Fatal(err)
	}
	return keys, values, pages
}

func TestPager(t *testing.T) {
	cli := etcdClient(t)
	ctx := context.Background()
	for i := range 7 {
		if _, err := cli.Put(ctx, fmt.Sprintf("/in/%d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"/im", "/io"} { // just outside the range
		if _, err := cli.Put(ctx, k, "v"); err != nil {
			t.Fatal(err)
		}
	}
	end := clientv3.GetPrefixRangeEnd("/in/")

	t.Run("every key once, in order, a page at a time", func(t *testing.T) {
		for _, size := range []int64{1, 2, 3, 7, 8, 100} {
			keys, values, pages := readAll(t, NewPager(cli, "/in/", end, size), nil)
			if len(keys) != 7 || values != 7 {
				t.Fatalf("size %d: read %d keys (%d values), want 7: %q", size, len(keys), values, keys)
			}
			for i, k := range keys {
				if want := fmt.Sprintf("/in/%d", i); k != want {
					t.Fatalf("size %d: key %d is %q, want %q", size, i, k, want)
				}
			}
			if want := int((7 + size - 1) / size); pages != want {
				t.Fatalf("size %d: %d pages, want %d", size, pages, want)
			}
		}
	})
	t.Run("keys only", func(t *testing.T) {
		if keys, values, _ := readAll(t, NewPager(cli, "/in/", end, 3, KeysOnly()), nil); len(keys) != 7 || values != 0 {
			t.Fatalf("read %d keys and %d values, want 7 keys and no value", len(keys), values)
		}
	})
	t.Run("empty range", func(t *testing.T) {
		p := NewPager(cli, "/none/", clientv3.GetPrefixRangeEnd("/none/"), 3)
		if p.Next(ctx) || p.Err() != nil {
			t.Fatalf("Next on an empty range = true or error %v", p.Err())
		}
	})
	t.Run("a failed read ends the paging with its error", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		p := NewPager(cli, "/in/", end, 3)
		if p.Next(cctx) || !errors.Is(p.Err(), context.Canceled) {
			t.Fatalf("Next with a cancelled context: err %v, want context.Canceled", p.Err())
		}
		if p.Next(ctx) {
			t.Fatal("Next after a failure read on")
		}
	})
}

// With OneRevision, keys written while the pages are read are not seen,
// however many pages follow: every page is read at the first page's
// revision (not at the header revision of the page before, which is the
// store's current one, not the one read).
func TestPagerOneRevisionIsOneSnapshot(t *testing.T) {
	cli := etcdClient(t)
	ctx := context.Background()
	for i := range 8 {
		if _, err := cli.Put(ctx, fmt.Sprintf("/s/%d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	end := clientv3.GetPrefixRangeEnd("/s/")
	n := 0
	writeAhead := func() { // a new key after the cursor, before the next page
		n++
		if _, err := cli.Put(ctx, fmt.Sprintf("/s/%dz", 7), fmt.Sprint(n)); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, fmt.Sprintf("/s/%d", 7), fmt.Sprint(n)); err != nil {
			t.Fatal(err)
		}
	}
	p := NewPager(cli, "/s/", end, 2, OneRevision())
	var keys []string
	for p.Next(ctx) {
		for _, kv := range p.Page() {
			keys = append(keys, string(kv.Key))
			if string(kv.Key) == "/s/7" && string(kv.Value) != "v" {
				t.Fatalf("/s/7 read as %q, written after the first page: not one snapshot", kv.Value)
			}
		}
		writeAhead()
	}
	if err := p.Err(); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 8 {
		t.Fatalf("read %q, want the 8 keys of the first page's revision", keys)
	}

	// Without it, each page is current: the writes are seen.
	if keys, _, _ := readAll(t, NewPager(cli, "/s/", end, 2), writeAhead); len(keys) != 9 {
		t.Fatalf("read %d keys without OneRevision, want 9 (the key written meanwhile)", len(keys))
	}
}
