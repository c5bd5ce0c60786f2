package server_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/coordinator"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// FuzzAcquireRequest sends arbitrary AcquireRequests over real gRPC to a
// coordinator on embedded etcd. Every answer is OK or INVALID_ARGUMENT
// (ABORTED only if the lock is held); a refusal writes nothing to etcd; a
// grant's queue key is inside the prefix, under the name's own queue, and
// its create revision is the token. The seed corpus (testdata/fuzz) runs
// in every go test.
func FuzzAcquireRequest(f *testing.F) {
	f.Add("job-1", int64(5), int32(0), int64(0), "owner", "", int64(0), int64(0))
	f.Add("a/b%2F", int64(1), int32(0), int64(0), "", "0123456789abcdef0123", int64(3600), int64(1))
	f.Add("", int64(0), int32(-1), int64(-1), "", "short", int64(-1), int64(-1))
	f.Add("x\x00y", int64(1<<40), int32(1e9), int64(1), strings.Repeat("o", 300), "has space 0123456789", int64(1<<40), int64(120))
	f.Add("日本/ロック", int64(2), int32(500_000_000), int64(0), "o", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", int64(7200), int64(61))

	ctx := context.Background()
	etcd, err := embedetcd.Start(ctx, f.TempDir(), embedetcd.WithFastElection())
	if err != nil {
		f.Fatal(err)
	}
	defer etcd.Close()
	const prefix = "/fuzz/"
	c, err := coordinator.New(clientv3.Config{Endpoints: etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()},
		coordinator.WithLease(lease.WithKeyPrefix(prefix)),
		// The epoch keeper rewrites its beacon when etcd's raft index
		// doubled; an hour between checks keeps that write out of the
		// revision comparisons below.
		coordinator.WithEpochInterval(time.Hour))
	if err != nil {
		f.Fatal(err)
	}
	defer c.Close()
	cli, mgr := c.Etcd(), c.Leases()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	c.ServeInBackground(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		f.Fatal(err)
	}
	defer conn.Close()
	lc := coordinatorv1.NewLockServiceClient(conn)

	f.Fuzz(func(t *testing.T, name string, ttlSec int64, ttlNanos int32, waitSec int64, owner, rid string, maxHoldSec, delaySec int64) {
		if !utf8.ValidString(name) || !utf8.ValidString(owner) || !utf8.ValidString(rid) {
			t.Skip("the Go client refuses to marshal invalid UTF-8; the server's own check is in validation_test.go")
		}
		req := &coordinatorv1.AcquireRequest{
			Name: name, Owner: owner, RequestId: rid,
			Ttl:  &durationpb.Duration{Seconds: ttlSec, Nanos: ttlNanos},
			Wait: &durationpb.Duration{Seconds: min(waitSec, 0)}, // never queue behind a held lock
		}
		if maxHoldSec != 0 {
			req.MaxHold = &durationpb.Duration{Seconds: maxHoldSec}
		}
		if delaySec != 0 {
			req.LockDelay = &durationpb.Duration{Seconds: delaySec}
		}
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		before, err := cli.Get(cctx, "/")
		if err != nil {
			t.Fatal(err)
		}
		g, err := lc.Acquire(cctx, req)
		switch code(err) {
		case codes.OK:
		case codes.InvalidArgument:
			if fieldOf(err) == "" {
				t.Fatalf("INVALID_ARGUMENT without a field: %v", err)
			}
			after, err := cli.Get(cctx, "/")
			if err != nil {
				t.Fatal(err)
			}
			if after.Header.Revision != before.Header.Revision {
				t.Fatalf("refused request %v wrote to etcd (revision %d -> %d)", req, before.Header.Revision, after.Header.Revision)
			}
			return
		case codes.Aborted:
			return // held by an earlier input's lock-delay or grant
		default:
			t.Fatalf("Acquire(%v): %v", req, err)
		}
		defer func() {
			_, _ = lc.Release(cctx, &coordinatorv1.ReleaseRequest{Name: name, Token: g.GetToken(), Handle: g.GetHandle()})
		}()
		all, err := cli.Get(cctx, "", clientv3.WithFromKey(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		found := 0
		for _, kv := range all.Kvs {
			k := string(kv.Key)
			if !strings.HasPrefix(k, prefix) {
				t.Fatalf("key %q outside the prefix %q", k, prefix)
			}
			switch {
			case kv.CreateRevision != g.GetToken():
			case strings.HasPrefix(k, mgr.Keyspace().Queue(name)):
				found++
			case !strings.HasPrefix(k, prefix+"delay/") && !strings.HasPrefix(k, prefix+"requests/"):
				// The same transaction may write the lock-delay key and
				// the request record; nothing else.
				t.Fatalf("grant of %q wrote key %q outside its queue %q", name, k, mgr.Keyspace().Queue(name))
			}
		}
		if found != 1 {
			t.Fatalf("token %d: %d keys with that create revision, want the one queue key", g.GetToken(), found)
		}
	})
}
