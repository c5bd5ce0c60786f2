package chaos_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/coordinatord/coordinatord/internal/chaos"
	"github.com/coordinatord/coordinatord/internal/coordinator"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// The test binary run as a member process of the shard core (TestMain
// calls shardChildMain when shardChildEnv is set): what coordinatord
// -core shard runs, with two settings the daemon has no flag for: the
// shard count, and the epoch keeper's interval, which
// TestShardOwnerSIGSTOPPedPastItsTTL/lease-only sets long so that a
// process resumed after a SIGSTOP is held back by its shard lease alone
// (S2), not by the epoch keeper's stale check (EPOCH_PAUSED), which
// otherwise answers first.
const (
	shardChildEnv       = "CHAOS_SHARD_CHILD" // etcd endpoints, comma-separated
	shardChildTTL       = "CHAOS_SHARD_CHILD_TTL"
	shardChildShards    = "CHAOS_SHARD_CHILD_SHARDS"
	shardChildEpochEvry = "CHAOS_SHARD_CHILD_EPOCH_INTERVAL"
)

// shardChildMain serves until killed; it prints "serving <addr>" once it
// serves.
func shardChildMain() {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "chaos child:", err)
		os.Exit(2)
	}
	ttl, err := time.ParseDuration(os.Getenv(shardChildTTL))
	if err != nil {
		fail(err)
	}
	every, err := time.ParseDuration(os.Getenv(shardChildEpochEvry))
	if err != nil {
		fail(err)
	}
	var shards int
	if _, err := fmt.Sscan(os.Getenv(shardChildShards), &shards); err != nil {
		fail(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	c, err := coordinator.New(clientv3.Config{Endpoints: strings.Split(os.Getenv(shardChildEnv), ","), DialTimeout: 2 * time.Second, Logger: zap.NewNop()},
		coordinator.WithLease(lease.WithKeyPrefix(chaos.KeyPrefix)), coordinator.WithEpochInterval(every),
		coordinator.WithShardCore(shard.WithShards(shards), shard.WithLeaseTTL(ttl), shard.WithMember("child", lis.Addr().String())))
	if err != nil {
		fail(err)
	}
	fmt.Printf("serving %s\n", lis.Addr())
	_ = c.Serve(lis)
}

// startShardChild runs the test binary as a member process (see
// shardChildMain) on the cluster; it returns the process and its address.
func startShardChild(t *testing.T, endpoints []string, ttl time.Duration, shards int, epochEvery time.Duration) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), shardChildEnv+"="+strings.Join(endpoints, ","), shardChildTTL+"="+ttl.String(),
		fmt.Sprintf("%s=%d", shardChildShards, shards), shardChildEpochEvry+"="+epochEvery.String())
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	addr := make(chan string, 1)
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "serving "); ok {
				addr <- a
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-done
		_ = cmd.Wait()
	})
	select {
	case a := <-addr:
		return cmd, a
	case <-done:
		t.Fatal("the member process exited before serving")
	case <-time.After(60 * time.Second):
		t.Fatal("the member process not serving after 60s")
	}
	return nil, ""
}
