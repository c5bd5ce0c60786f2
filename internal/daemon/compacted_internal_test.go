package daemon

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/embedetcd"
)

// An external etcd that never compacted (revision 1 still readable) is
// reported at start, once it is past neverCompactedAfter; one that has
// compacted is not.
func TestWarnIfNeverCompacted(t *testing.T) {
	e, err := embedetcd.Start(context.Background(), t.TempDir(), embedetcd.WithFastElection(), embedetcd.WithAutoCompaction("revision", "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	var rev int64
	for range 3 {
		r, err := cli.Put(ctx, "/k", "v")
		if err != nil {
			t.Fatal(err)
		}
		rev = r.Header.Revision
	}
	warned := func() bool {
		var buf bytes.Buffer
		// The revision is passed as if the cluster were far along.
		warnIfNeverCompacted(ctx, cli, "/k", neverCompactedAfter, slog.New(slog.NewTextHandler(&buf, nil)))
		return strings.Contains(buf.String(), "level=WARN")
	}
	if !warned() {
		t.Fatal("no warning for an etcd that never compacted")
	}
	if _, err := cli.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	if warned() {
		t.Fatal("warning for an etcd that compacted")
	}
}
