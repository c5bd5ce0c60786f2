package embedetcd_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/embedetcd"
)

func TestStartRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	var rev int64
	for i := range 2 {
		start := time.Now()
		s, err := embedetcd.Start(ctx, dir, embedetcd.WithFastElection(), embedetcd.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("start %d took %v, endpoints %v", i, time.Since(start), s.Endpoints())
		c, err := clientv3.New(clientv3.Config{Endpoints: s.Endpoints(), DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Put(ctx, "k", "v")
		if err != nil {
			t.Fatal(err)
		}
		if resp.Header.Revision <= rev {
			t.Fatalf("revision went from %d to %d after restart", rev, resp.Header.Revision)
		}
		rev = resp.Header.Revision
		c.Close()
		s.Close()
	}
}
