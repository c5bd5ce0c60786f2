package client_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// coordinatorAddr is the address of the coordinator every test and example
// of this package talks to: a real coordinatord process built from this
// repository (see daemon_test.go), since the SDK's module cannot import the
// daemon's.
var coordinatorAddr string

func TestMain(m *testing.M) {
	d, err := startDaemon()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start coordinatord:", err)
		os.Exit(1)
	}
	coordinatorAddr = d.addr
	code := m.Run()
	if err := d.stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop coordinatord:", err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run")); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// mustConn is a plain connection to the coordinator (no injected faults).
func mustConn(t *testing.T) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(coordinatorAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
