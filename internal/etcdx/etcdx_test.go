package etcdx

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc/metadata"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Every etcd error after which a retry may succeed is ErrUnavailable, the
// quota's is ErrStoreFull, and any other keeps its own identity: the
// server maps the first two to UNAVAILABLE and RESOURCE_EXHAUSTED.
func TestClassify(t *testing.T) {
	other := errors.New("boom")
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"no leader", rpctypes.ErrNoLeader, ErrUnavailable},
		{"leader changed", rpctypes.ErrLeaderChanged, ErrUnavailable},
		{"timeout", rpctypes.ErrTimeout, ErrUnavailable},
		{"too many requests", rpctypes.ErrTooManyRequests, ErrUnavailable},
		{"no endpoints", clientv3.ErrNoAvailableEndpoints, ErrUnavailable},
		{"deadline, wrapped", fmt.Errorf("x: %w", context.DeadlineExceeded), ErrUnavailable},
		{"no space", rpctypes.ErrNoSpace, ErrStoreFull},
		{"other", other, other},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Classify("op", tc.err)
			if !errors.Is(got, tc.want) {
				t.Fatalf("Classify(%v) = %v, want it to wrap %v", tc.err, got, tc.want)
			}
			if !errors.Is(got, tc.err) {
				t.Fatalf("Classify(%v) = %v: the cause is not inspectable", tc.err, got)
			}
			if errors.Is(tc.want, other) && (errors.Is(got, ErrUnavailable) || errors.Is(got, ErrStoreFull)) {
				t.Fatalf("Classify(%v) = %v: an unknown error is classified", tc.err, got)
			}
		})
	}
}

// streamKey is how clientv3 (watch.go, streamKeyFromCtx) tells the watch
// streams of one client apart.
func streamKey(ctx context.Context) string {
	md, _ := metadata.FromOutgoingContext(ctx)
	return fmt.Sprintf("%+v", map[string][]string(md))
}

// Contexts of two names, or with and without one, are keyed to different
// watch streams, and the caller's metadata is kept.
func TestWithOwnWatchStream(t *testing.T) {
	base := metadata.AppendToOutgoingContext(context.Background(), "k", "v")
	if streamKey(WithOwnWatchStream(base, "a")) == streamKey(base) {
		t.Fatal("a named stream is keyed as the shared one")
	}
	if streamKey(WithOwnWatchStream(base, "a")) == streamKey(WithOwnWatchStream(base, "b")) {
		t.Fatal("streams a and b are keyed as one")
	}
	a, _ := metadata.FromOutgoingContext(WithOwnWatchStream(base, "a"))
	if got := a.Get("k"); len(got) != 1 || got[0] != "v" {
		t.Fatalf("caller's metadata lost: %v", a)
	}
}
