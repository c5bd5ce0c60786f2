package lease_test

import (
	"context"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// A second contender's try-lock fails while the lock is held; after the
// release it succeeds with a greater fencing token.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "lease-example")
	defer os.RemoveAll(dir)
	etcd, err := embedetcd.Start(ctx, dir, embedetcd.WithFastElection())
	if err != nil {
		panic(err)
	}
	defer etcd.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints()})
	if err != nil {
		panic(err)
	}
	defer cli.Close()
	m, err := lease.New(cli)
	if err != nil {
		panic(err)
	}
	defer m.Close()

	first, err := m.Acquire(ctx, "reports/daily", lease.WithTTL(10*time.Second), lease.WithOwner("worker-1"))
	if err != nil {
		panic(err)
	}
	_, err = m.Acquire(ctx, "reports/daily", lease.WithWait(0))
	fmt.Println("try-lock while held:", err != nil)

	released, _ := m.Release(ctx, "reports/daily", first.Token, first.Handle)
	fmt.Println("released:", released)

	second, err := m.Acquire(ctx, "reports/daily", lease.WithWait(0))
	if err != nil {
		panic(err)
	}
	fmt.Println("second token is greater:", second.Token > first.Token)
	// Output:
	// try-lock while held: true
	// released: true
	// second token is greater: true
}
