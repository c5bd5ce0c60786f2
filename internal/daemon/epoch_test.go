package daemon_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/daemon"
	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// epochSeen is what a scrape shows of the token epoch.
type epochSeen struct {
	epoch, paused, raises float64
}

func scrapeEpoch(t *testing.T, base string) (epochSeen, bool) {
	t.Helper()
	m := scrape(t, base)
	e, ok1 := m["coordinatord_token_epoch"][""]
	p, ok2 := m["coordinatord_token_epoch_paused"][""]
	r, ok3 := m["coordinatord_token_epoch_raises_total"][""]
	return epochSeen{e, p, r}, ok1 && ok2 && ok3
}

// TestTokenEpochInMetricsAndReadiness drives a daemon's epoch keeper
// through etcd, as a restore and an exhausted epoch show there, and checks
// what an operator sees: the epoch gauges and raise counter on /metrics,
// and /readyz (503 with the reason EPOCH_PAUSED, and the gRPC readiness
// service NOT_SERVING) while the keeper is paused though etcd answers.
func TestTokenEpochInMetricsAndReadiness(t *testing.T) {
	e, err := embedetcd.Start(context.Background(), t.TempDir(), embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	const prefix = "/ep/"
	r := run(t, daemon.Config{EtcdEndpoints: e.Endpoints(), KeyPrefix: prefix, MetricsListen: "127.0.0.1:0"})
	defer r.stop()
	base := "http://" + r.metrics
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ks := keyspace.New(prefix)
	conn := r.conn(t)
	lc, hc := coordinatorv1.NewLockServiceClient(conn), healthpb.NewHealthClient(conn)
	readiness := func() healthpb.HealthCheckResponse_ServingStatus {
		h, err := hc.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: "coordinator.v1.LockService"})
		if err != nil {
			t.Fatal(err)
		}
		return h.Status
	}
	// A beacon that recorded a raft index far above etcd's live one: what
	// a restore (which restarts the index at 1) shows every replica.
	restoredBeacon := func(epoch int64) string {
		return fmt.Sprintf(`{"epoch":%d,"raftIndex":%d,"raftTerm":1}`, epoch, uint64(1)<<50)
	}
	put := func(ops ...clientv3.Op) {
		t.Helper()
		if _, err := cli.Txn(ctxT(t)).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	waitEpoch := func(what string, want epochSeen) {
		t.Helper()
		var got epochSeen
		eventually(t, what, func() bool {
			var ok bool
			got, ok = scrapeEpoch(t, base)
			return ok && got == want
		})
	}

	eventually(t, "/readyz answers 200", func() bool { c, _ := get(t, base+"/readyz"); return c == http.StatusOK })
	waitEpoch("epoch 0, open, never raised", epochSeen{epoch: 0, paused: 0, raises: 0})

	// A restore found: this replica raises the epoch, and serves again.
	put(clientv3.OpPut(ks.EpochBeacon(), restoredBeacon(0)))
	waitEpoch("epoch 1 raised by this replica", epochSeen{epoch: 1, paused: 0, raises: 1})
	eventually(t, "/readyz answers 200 after the raise", func() bool { c, _ := get(t, base+"/readyz"); return c == http.StatusOK })

	// A restore found when the epoch has no room left: the keeper stays
	// paused while etcd answers every probe.
	put(clientv3.OpPut(ks.Epoch(), fmt.Sprintf(`{"epoch":%d,"state":"ready"}`, keyspace.MaxEpoch)),
		clientv3.OpPut(ks.EpochBeacon(), restoredBeacon(keyspace.MaxEpoch)))
	waitEpoch("paused in epoch 1", epochSeen{epoch: 1, paused: 1, raises: 1})
	var body string
	eventually(t, "/readyz answers 503 with EPOCH_PAUSED", func() bool {
		var code int
		code, body = get(t, base+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "EPOCH_PAUSED")
	})
	t.Logf("/readyz while paused: %s", strings.TrimSpace(body))
	eventually(t, "gRPC readiness NOT_SERVING", func() bool { return readiness() == healthpb.HealthCheckResponse_NOT_SERVING })
	_, err = lc.ValidateToken(ctxT(t), &coordinatorv1.ValidateTokenRequest{Name: "x", Token: 1})
	if status.Code(err) != codes.Unavailable || reason(err) != "EPOCH_PAUSED" {
		t.Fatalf("ValidateToken while paused: %v, want UNAVAILABLE, reason EPOCH_PAUSED", err)
	}
	if c, _ := get(t, base+"/healthz"); c != http.StatusOK {
		t.Fatalf("/healthz while paused: %d, want 200", c)
	}

	// The epoch record raisable again: the keeper adopts it and reopens.
	put(clientv3.OpPut(ks.Epoch(), `{"epoch":2,"state":"ready"}`), clientv3.OpDelete(ks.EpochBeacon()))
	waitEpoch("epoch 2 adopted (raised elsewhere), open", epochSeen{epoch: 2, paused: 0, raises: 1})
	eventually(t, "/readyz answers 200 again", func() bool { c, _ := get(t, base+"/readyz"); return c == http.StatusOK })
	eventually(t, "gRPC readiness SERVING again", func() bool { return readiness() == healthpb.HealthCheckResponse_SERVING })
	r.stop()
}
