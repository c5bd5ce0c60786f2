// Package testcoord runs a real coordinator (embedded etcd with fast
// elections, and the daemon's assembly, internal/coordinator: lease manager,
// fence validator with its holder view, gRPC on 127.0.0.1:0) inside a test
// process, for the tests and runnable examples of the public packages.
//
// COORDINATORD_TEST_CORE=shard runs it on the shard-owner core,
// as internal/server's suite does: 16 shards, a 2 s member lease, every
// shard served before Start returns.
package testcoord

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/coordinatord/coordinatord/internal/coordinator"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/server"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// Coordinator is one running coordinator over its own embedded etcd.
type Coordinator struct {
	// Addr is the gRPC address (127.0.0.1:port).
	Addr string
	// Etcd is a client of the embedded etcd, for assertions.
	Etcd *clientv3.Client

	dir   string
	etcd  *embedetcd.Server
	coord *coordinator.Coordinator
}

// sharded says whether the tests run on the shard-owner core:
// COORDINATORD_TEST_CORE=shard, else the queue core.
func sharded() bool { return os.Getenv("COORDINATORD_TEST_CORE") == "shard" }

// Start starts a coordinator; opts are extra gRPC server options (e.g.
// interceptors that inject faults). Stop it with Stop.
func Start(opts ...grpc.ServerOption) (*Coordinator, error) {
	dir, err := os.MkdirTemp("", "testcoord")
	if err != nil {
		return nil, err
	}
	c := &Coordinator{dir: dir}
	if err := c.start(opts); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Coordinator) start(opts []grpc.ServerOption) error {
	var err error
	c.etcd, err = embedetcd.Start(context.Background(), c.dir, embedetcd.WithFastElection())
	if err != nil {
		return err
	}
	// Bound first: a member of the shard core advertises its address.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	c.Addr = lis.Addr().String()
	copts := []coordinator.Option{coordinator.WithLease(lease.WithKeyPrefix("/test/")), coordinator.WithServer(server.WithServerOptions(opts...))}
	if sharded() {
		copts = append(copts, coordinator.WithShardCore(shard.WithShards(16), shard.WithLeaseTTL(2*time.Second), shard.WithMember("", c.Addr)))
	}
	c.coord, err = coordinator.New(clientv3.Config{Endpoints: c.etcd.Endpoints(), DialTimeout: 5 * time.Second}, copts...)
	if err != nil {
		lis.Close()
		return err
	}
	c.Etcd = c.coord.Etcd()
	c.coord.ServeInBackground(lis)
	if sharded() {
		return c.awaitShards()
	}
	return nil
}

// awaitShards waits until the shard core serves every shard: before, a
// call on a shard still loading would answer SHARD_NOT_SERVED.
func (c *Coordinator) awaitShards() error {
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st := c.coord.Shards().Status()
		if st.Serving == st.Shards {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the shard core serves %d of %d shards 15s after start", st.Serving, st.Shards)
		}
	}
}

// Stop stops gRPC and etcd and removes the data directory.
func (c *Coordinator) Stop() {
	if c.coord != nil {
		c.coord.Close()
	}
	if c.etcd != nil {
		c.etcd.Close()
	}
	os.RemoveAll(c.dir)
}

// LeakIgnores are the process-wide goroutines of grpc-go and etcd's
// libraries that goroutine-leak checks (goleak) must not count.
var LeakIgnores = []goleak.Option{
	goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
	goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/logutil.(*MergeLogger).outputLoop"),
}
