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
//	breakhold/...      the first heartbeat on a Hold stream breaks the stream
var faults = &faultInjector{acquireIDs: map[string][]string{}, lostTokens: map[string]int64{}, holds: map[string][]string{}}

type faultInjector struct {
	mu         sync.Mutex
	acquireIDs map[string][]string // request ids seen per name
	lostTokens map[string]int64    // tokens of the grants whose answer was lost
	holds      map[string][]string // the first message of each Hold stream per name: acquire or resume
	broken     map[string]bool     // names whose Hold stream was broken once
}

// dialOptions installs the injector, unary calls and streams.
func (f *faultInjector) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(f.intercept), grpc.WithChainStreamInterceptor(f.interceptStream)}
}

func (f *faultInjector) interceptStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	ctx, cancel := context.WithCancel(ctx)
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		cancel()
		return nil, err
	}
	return &faultyStream{ClientStream: s, f: f, cancel: cancel}, nil
}

// faultyStream records Hold streams and breaks the first heartbeat of a
// breakhold/ name: the send fails UNAVAILABLE and the stream is cancelled,
// as when a connection drops.
type faultyStream struct {
	grpc.ClientStream
	f      *faultInjector
	cancel context.CancelFunc
	name   string
}

func (s *faultyStream) SendMsg(m any) error {
	req, ok := m.(*coordinatorv1.HoldRequest)
	if !ok {
		return s.ClientStream.SendMsg(m)
	}
	f := s.f
	f.mu.Lock()
	switch {
	case req.GetAcquire() != nil:
		s.name = req.GetAcquire().GetRequest().GetName()
		f.holds[s.name] = append(f.holds[s.name], "acquire")
	case req.GetResume() != nil:
		s.name = req.GetResume().GetName()
		f.holds[s.name] = append(f.holds[s.name], "resume")
	case req.GetHeartbeat() != nil && strings.HasPrefix(s.name, "breakhold/") && !f.broken[s.name]:
		if f.broken == nil {
			f.broken = map[string]bool{}
		}
		f.broken[s.name] = true
		f.mu.Unlock()
		s.cancel()
		return status.Error(codes.Unavailable, "injected fault")
	}
	f.mu.Unlock()
	return s.ClientStream.SendMsg(m)
}

func (f *faultInjector) holdStreams(name string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.holds[name]...)
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
