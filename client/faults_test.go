package client_test

import (
	"context"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// faults makes the coordinator seem to misbehave, for the clients dial
// makes, for lock names with particular prefixes (a client-side interceptor:
// the daemon is a separate process):
//
//	unavailable-2/...  the first 2 Acquire calls answer UNAVAILABLE, unsent
//	lostack/...        the first Acquire is granted, then its answer is lost (UNAVAILABLE)
//	nokeepalive/...    every KeepAlive answers UNAVAILABLE, unsent
var faults = &faultInjector{acquireIDs: map[string][]string{}, lostTokens: map[string]int64{}}

type faultInjector struct {
	mu         sync.Mutex
	acquireIDs map[string][]string // request ids seen per name
	lostTokens map[string]int64    // tokens of the grants whose answer was lost
}

// dialOption installs the injector on a connection.
func (f *faultInjector) dialOption() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(f.intercept)
}

func (f *faultInjector) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	unavailable := status.Error(codes.Unavailable, "injected fault")
	switch r := req.(type) {
	case *coordinatorv1.AcquireRequest:
		f.mu.Lock()
		f.acquireIDs[r.Name] = append(f.acquireIDs[r.Name], r.RequestId)
		n := len(f.acquireIDs[r.Name])
		f.mu.Unlock()
		switch {
		case strings.HasPrefix(r.Name, "unavailable-2/") && n <= 2:
			return unavailable
		case strings.HasPrefix(r.Name, "lostack/") && n == 1:
			if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
				return err
			}
			f.mu.Lock()
			f.lostTokens[r.Name] = reply.(*coordinatorv1.AcquireResponse).GetToken()
			f.mu.Unlock()
			return unavailable
		}
	case *coordinatorv1.KeepAliveRequest:
		if strings.HasPrefix(r.Name, "nokeepalive/") {
			return unavailable
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (f *faultInjector) ids(name string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.acquireIDs[name]...)
}

func (f *faultInjector) lostToken(name string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lostTokens[name]
}
