package daemon_test

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/daemon"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/testpki"
)

// secureEtcd starts an etcd that requires TLS client certificates and has
// auth enabled, with a user "coord" whose role may read and write only the
// keys under "/tenant-a/" (what deploy/README.md documents with etcdctl).
func secureEtcd(t *testing.T) (eps []string, ca *testpki.CA, caFile, certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	ca = testpki.NewCA("etcd test CA")
	srvCert, srvKey := ca.Localhost().Write(dir, "etcd-server")
	caFile = ca.WriteCA(dir, "etcd-ca")
	certFile, keyFile = ca.Issue(testpki.Leaf{CN: "coordinatord"}).Write(dir, "etcd-client")
	e, err := embedetcd.Start(context.Background(), t.TempDir(), embedetcd.WithFastElection(), embedetcd.WithClientTLS(srvCert, srvKey, caFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	eps = e.Endpoints()
	if !strings.HasPrefix(eps[0], "https://") {
		t.Fatalf("endpoints %v are not https", eps)
	}

	root := ca.Issue(testpki.Leaf{CN: "root"}).TLS()
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second,
		TLS: &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{root}}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := ctxT(t)
	steps := []func() error{
		func() error { _, err := cli.UserAdd(ctx, "root", "root-password"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.RoleAdd(ctx, "coordinatord-tenant-a"); return err },
		func() error {
			_, err := cli.RoleGrantPermission(ctx, "coordinatord-tenant-a", "/tenant-a/", clientv3.GetPrefixRangeEnd("/tenant-a/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := cli.UserAdd(ctx, "coord", "coord-password"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "coord", "coordinatord-tenant-a"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	}
	for i, s := range steps {
		if err := s(); err != nil {
			t.Fatalf("etcd auth set-up step %d: %v", i, err)
		}
	}
	return eps, ca, caFile, certFile, keyFile
}

func TestDaemonOnAnEtcdWithTLSClientAuthAndPassword(t *testing.T) {
	eps, _, caFile, certFile, keyFile := secureEtcd(t)
	base := daemon.Config{EtcdEndpoints: eps, EtcdCA: caFile, EtcdCert: certFile, EtcdKey: keyFile,
		EtcdUsername: "coord", EtcdPassword: "coord-password", KeyPrefix: "/tenant-a/"}

	r := run(t, base)
	lc := coordinatorv1.NewLockServiceClient(r.conn(t))
	g, err := lc.Acquire(ctxT(t), &coordinatorv1.AcquireRequest{Name: "job", Ttl: durationpb.New(10 * time.Second)})
	if err != nil {
		t.Fatalf("acquire through a secured etcd: %v", err)
	}
	if _, err := lc.Acquire(ctxT(t), &coordinatorv1.AcquireRequest{Name: "job", Wait: durationpb.New(50 * time.Millisecond)}); err == nil {
		t.Fatal("second grant of a held lock")
	}
	if v, err := lc.ValidateToken(ctxT(t), &coordinatorv1.ValidateTokenRequest{Name: "job", Token: g.Token}); err != nil || !v.Valid {
		t.Fatalf("validate: %v, %v", v, err)
	}
	if rel, err := lc.Release(ctxT(t), &coordinatorv1.ReleaseRequest{Name: "job", Token: g.Token, Handle: g.Handle}); err != nil || !rel.Released {
		t.Fatalf("release: %v, %v", rel, err)
	}
	r.stop()

	// Refused set-ups: the daemon does not start.
	for _, tc := range []struct {
		name   string
		change func(*daemon.Config)
	}{
		{"wrong password", func(c *daemon.Config) { c.EtcdPassword = "guess" }},
		{"a prefix the role does not cover", func(c *daemon.Config) { c.KeyPrefix = "/tenant-b/" }},
		{"no password", func(c *daemon.Config) { c.EtcdUsername, c.EtcdPassword = "", "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			cfg.DataDir = t.TempDir()
			tc.change(&cfg)
			cfg.Listen, cfg.DefaultTTL, cfg.MaxTTL, cfg.ShutdownTimeout = "127.0.0.1:0", 15*time.Second, time.Minute, time.Second
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := daemon.Run(ctx, onTestCore(cfg)); err == nil || ctx.Err() != nil {
				t.Fatalf("daemon.Run = %v (ctx %v), want a start-up error", err, ctx.Err())
			}
		})
	}
}
