package epoch_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/coordinatord/coordinatord/internal/chaos"
)

// member is a single-member etcd on fixed loopback URLs, so that a
// coordinator that keeps running across a restore finds the restored etcd
// where the old one was. Clients reach it through a proxy, which resets
// their connections when the member stops, as a killed etcd would (etcd's
// own Close waits 5 s for open watch streams).
type member struct {
	client, peer string // URLs
	proxy        *chaos.Proxy
	e            *embed.Etcd
}

func newMember(t *testing.T) *member {
	t.Helper()
	m := &member{client: "http://" + freeAddr(t), peer: "http://" + freeAddr(t)}
	p, err := chaos.NewProxy(strings.TrimPrefix(m.client, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	m.proxy = p
	return m
}

// runningMember is a member started in a temporary directory and stopped
// when the test ends, and a context that bounds the test's calls.
func runningMember(t *testing.T) (context.Context, *member) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	m := newMember(t)
	m.start(t, t.TempDir())
	t.Cleanup(m.stop)
	return ctx, m
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

const memberName = "restore"

// start runs etcd on dir (a fresh one, or one etcdutl restored).
func (m *member) start(t *testing.T, dir string) {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = memberName, dir
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cu, pu := mustURL(t, m.client), mustURL(t, m.peer)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = memberName + "=" + m.peer
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(20 * time.Second):
		e.Close()
		t.Fatal("etcd not ready after 20s")
	}
	m.e = e
	m.proxy.Set(chaos.Pass, 0)
}

func (m *member) stop() {
	if m.e != nil {
		m.proxy.Set(chaos.Reset, 0)
		m.e.Close()
		m.e = nil
	}
}

func mustURL(t *testing.T, s string) url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return *u
}

func (m *member) clientConfig() clientv3.Config {
	// Reconnect fast once the restored etcd is up (gRPC's default backoff
	// grows to seconds while etcd is down).
	backoff := grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.2, MaxDelay: 200 * time.Millisecond}, MinConnectTimeout: time.Second})
	return clientv3.Config{Endpoints: []string{"http://" + m.proxy.Addr()}, DialTimeout: 2 * time.Second, Logger: zap.NewNop(), DialOptions: []grpc.DialOption{backoff}}
}

// saveSnapshot writes etcd's snapshot (Maintenance.Snapshot) to a file and
// returns its path and the revision it was taken at.
func (m *member) saveSnapshot(t *testing.T, ctx context.Context) (string, int64) {
	t.Helper()
	cli, err := clientv3.New(m.clientConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	r, err := cli.Get(ctx, "any")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := cli.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	path := filepath.Join(t.TempDir(), "backup.db")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, rc); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path, r.Header.Revision
}

// restore is `etcdutl snapshot restore [--bump-revision bump --mark-compacted]`
// into a new data directory, which it returns.
func (m *member) restore(t *testing.T, snap string, bump uint64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "restored")
	err := snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath: snap, Name: memberName, OutputDataDir: dir,
		PeerURLs: []string{m.peer}, InitialCluster: fmt.Sprintf("%s=%s", memberName, m.peer), InitialClusterToken: "etcd-cluster",
		RevisionBump: bump, MarkCompacted: bump > 0,
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}
