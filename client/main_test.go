package client_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/testcoord"
)

// coordinatorAddr is the address of the coordinator every test and example
// of this package talks to.
var (
	coordinatorAddr string
	coord           *testcoord.Coordinator
	faults          = &faultInjector{acquireIDs: map[string][]string{}, lostTokens: map[string]int64{}}
)

func TestMain(m *testing.M) {
	var err error
	coord, err = testcoord.Start(grpc.ChainUnaryInterceptor(faults.intercept))
	if err != nil {
		fmt.Fprintln(os.Stderr, "start coordinator:", err)
		os.Exit(1)
	}
	coordinatorAddr = coord.Addr
	code := m.Run()
	coord.Stop()
	if code == 0 {
		if err := goleak.Find(testcoord.LeakIgnores...); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// faultInjector makes the coordinator misbehave for lock names with
// particular prefixes:
//
//	unavailable-2/...  the first 2 Acquire calls answer UNAVAILABLE unprocessed
//	lostack/...        the first Acquire is granted, then its answer is lost (UNAVAILABLE)
//	nokeepalive/...    every KeepAlive answers UNAVAILABLE
type faultInjector struct {
	mu         sync.Mutex
	acquireIDs map[string][]string // request ids seen per name
	lostTokens map[string]int64    // tokens of the grants whose answer was lost
}

func (f *faultInjector) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	unavailable := status.Error(codes.Unavailable, "injected fault")
	switch r := req.(type) {
	case *coordinatorv1.AcquireRequest:
		f.mu.Lock()
		f.acquireIDs[r.Name] = append(f.acquireIDs[r.Name], r.RequestId)
		n := len(f.acquireIDs[r.Name])
		f.mu.Unlock()
		switch {
		case strings.HasPrefix(r.Name, "unavailable-2/") && n <= 2:
			return nil, unavailable
		case strings.HasPrefix(r.Name, "lostack/") && n == 1:
			resp, err := handler(ctx, req)
			if err != nil {
				return nil, err
			}
			f.mu.Lock()
			f.lostTokens[r.Name] = resp.(*coordinatorv1.AcquireResponse).GetToken()
			f.mu.Unlock()
			return nil, unavailable
		}
	case *coordinatorv1.KeepAliveRequest:
		if strings.HasPrefix(r.Name, "nokeepalive/") {
			return nil, unavailable
		}
	}
	return handler(ctx, req)
}

func (f *faultInjector) ids(name string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.acquireIDs[name]...)
}

func mustConn(t *testing.T) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(coordinatorAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func (f *faultInjector) lostToken(name string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lostTokens[name]
}
