package main_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// hostileServer is a LockService that answers with the strings it is
// given: names, owners, handles and error messages no real coordinator
// would let through (newlines, ANSI escapes...), as a compromised or buggy
// server, or one another helper's input checks do not cover yet, could.
type hostileServer struct {
	coordinatorv1.UnimplementedLockServiceServer
	names   []string // List's holders, Describe's holder name
	owner   string   // every holder's and waiter's owner
	handle  string   // Acquire's handle
	message string   // the message of ForceRelease's error
}

// startHostile serves s on 127.0.0.1 until the test ends and returns its
// address.
func startHostile(t *testing.T, s *hostileServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	coordinatorv1.RegisterLockServiceServer(gs, s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = gs.Serve(lis)
	}()
	t.Cleanup(func() {
		gs.Stop()
		<-done
	})
	return lis.Addr().String()
}

var hostileTime = timestamppb.New(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC))

func (s *hostileServer) holder(name string) *coordinatorv1.Holder {
	return &coordinatorv1.Holder{Name: name, Token: 7, Owner: s.owner, AcquiredAt: hostileTime, ExpiresAt: hostileTime}
}

func (s *hostileServer) List(context.Context, *coordinatorv1.ListRequest) (*coordinatorv1.ListResponse, error) {
	resp := &coordinatorv1.ListResponse{}
	for _, n := range s.names {
		resp.Holders = append(resp.Holders, s.holder(n))
	}
	return resp, nil
}

func (s *hostileServer) Describe(context.Context, *coordinatorv1.DescribeRequest) (*coordinatorv1.DescribeResponse, error) {
	return &coordinatorv1.DescribeResponse{
		Holder:  s.holder(s.names[0]),
		Waiters: []*coordinatorv1.Waiter{{Owner: s.owner, WaitingSince: hostileTime}},
	}, nil
}

func (s *hostileServer) Watch(_ *coordinatorv1.WatchRequest, stream grpc.ServerStreamingServer[coordinatorv1.WatchResponse]) error {
	return stream.Send(&coordinatorv1.WatchResponse{Revision: 3, Kind: coordinatorv1.WatchResponse_KIND_ACQUIRED, Holder: s.holder(s.names[0])})
}

func (s *hostileServer) Acquire(context.Context, *coordinatorv1.AcquireRequest) (*coordinatorv1.AcquireResponse, error) {
	return &coordinatorv1.AcquireResponse{Token: 7, Handle: s.handle, Ttl: durationpb.New(15 * time.Second), ExpiresAt: hostileTime, SafeUntil: hostileTime, AcquiredAt: hostileTime}, nil
}

func (s *hostileServer) ForceRelease(context.Context, *coordinatorv1.ForceReleaseRequest) (*coordinatorv1.ForceReleaseResponse, error) {
	return nil, status.Error(codes.FailedPrecondition, s.message)
}
