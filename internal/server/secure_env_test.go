package server_test

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/server"
)

// newEnvWith is newEnv with gRPC server options (credentials, interceptors,
// limits). Its e.conn is plaintext; use e.dialWith for other credentials.
func newEnvWith(t *testing.T, srv []server.Option, opts ...lease.Option) *env {
	t.Helper()
	e := &env{t: t, dataDir: t.TempDir()}
	var err error
	e.etcd, err = embedetcd.Start(context.Background(), e.dataDir, embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	e.assemble(clientv3.Config{Endpoints: e.etcd.Endpoints(), DialTimeout: 5 * time.Second}, srv, opts...)
	t.Cleanup(e.stop)
	return e
}

// dialWith opens a client connection with extra dial options; it is closed
// at the end of the test.
func (e *env) dialWith(opts ...grpc.DialOption) coordinatorv1.LockServiceClient {
	e.t.Helper()
	conn, err := grpc.NewClient(e.addr, opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.Close() })
	return coordinatorv1.NewLockServiceClient(conn)
}

func plaintext() grpc.DialOption { return grpc.WithTransportCredentials(insecure.NewCredentials()) }

func withTLS(cfg *tls.Config) grpc.DialOption {
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg))
}

// bearer sends "authorization: Bearer <token>" on every call (allowed over
// plaintext: the sidecar case on loopback).
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }
