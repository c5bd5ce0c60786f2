package chaos

import (
	"context"
	mrand "math/rand/v2"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// watchServer answers every Watch with answer, or, when answer is nil,
// not at all until the caller goes away (etcd cannot serve the read).
type watchServer struct {
	coordinatorv1.UnimplementedLockServiceServer
	answer error
}

func (s watchServer) Watch(_ *coordinatorv1.WatchRequest, st grpc.ServerStreamingServer[coordinatorv1.WatchResponse]) error {
	if s.answer != nil {
		return s.answer
	}
	<-st.Context().Done()
	return st.Context().Err()
}

// probeOnce runs one watcher stream from a compacted start_revision (a
// probe) against a server that answers as srv does, for at most d, under
// a run that ends after runEnds (0: not during the stream); it returns the
// watchers' report.
func probeOnce(t *testing.T, srv watchServer, d, runEnds time.Duration) WatchReport {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	coordinatorv1.RegisterLockServiceServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	w := &Workload{Replicas: []coordinatorv1.LockServiceClient{coordinatorv1.NewLockServiceClient(conn)}, Rec: NewRecorder()}
	wt := &watcher{w: w, c: &Client{w: w, id: 500, name: "a"}, rng: mrand.New(mrand.NewPCG(1, 2))}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if runEnds > 0 {
		time.AfterFunc(runEnds, cancel)
	}
	wt.stream(ctx, 2, true, d)
	return w.Watches()
}

// TestWatchProbeCutOffByTheRunsEndIsNotJudged (issue 26, item 12): seed
// 110113 of the chaos suite failed on a Watch probe (a stream from a
// compacted start_revision, which must answer OUT_OF_RANGE) that the run
// itself cancelled at its end: the checker took the CANCELLED of its own
// cancellation for the server's answer. A probe the run cut off is not
// judged; one whose own time ran out is not either (etcd could not serve
// the read); a probe the server answered is judged as before.
func TestWatchProbeCutOffByTheRunsEndIsNotJudged(t *testing.T) {
	for _, tc := range []struct {
		name          string
		srv           watchServer
		d, runEnds    time.Duration
		violations    int
		compactedSeen int
	}{
		{name: "cut off by the run's end", d: time.Minute, runEnds: 100 * time.Millisecond},
		{name: "its own time ran out", d: 100 * time.Millisecond},
		{name: "answered OUT_OF_RANGE", srv: watchServer{answer: status.Error(codes.OutOfRange, "compacted")}, d: time.Minute, compactedSeen: 1},
		{name: "answered CANCELLED by the server", srv: watchServer{answer: status.Error(codes.Canceled, "no")}, d: time.Minute, violations: 1},
		{name: "answered NOT_FOUND by the server", srv: watchServer{answer: status.Error(codes.NotFound, "no")}, d: time.Minute, violations: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := probeOnce(t, tc.srv, tc.d, tc.runEnds)
			if len(r.Violations) != tc.violations || r.CompactedProbes != tc.compactedSeen || r.Streams != 1 {
				t.Fatalf("report %+v; want %d violations, %d compacted probes, 1 stream", r, tc.violations, tc.compactedSeen)
			}
		})
	}
}
