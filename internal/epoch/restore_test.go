package epoch_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/coordinator"
	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// coord is a coordinator over a member, served on loopback, with clients.
type coord struct {
	c     *coordinator.Coordinator
	conn  *grpc.ClientConn
	lock  coordinatorv1.LockServiceClient
	fence coordinatorv1.FenceServiceClient
}

const prefix = "/r/"

// startCoord starts a coordinator over m (its keeper checks every 100 ms
// unless opts say otherwise).
func startCoord(t *testing.T, m *member, opts ...coordinator.Option) *coord {
	t.Helper()
	opts = append([]coordinator.Option{coordinator.WithLease(lease.WithKeyPrefix(prefix)),
		coordinator.WithEpochInterval(100 * time.Millisecond)}, opts...)
	c, err := coordinator.New(m.clientConfig(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	c.ServeInBackground(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	return &coord{c: c, conn: conn, lock: coordinatorv1.NewLockServiceClient(conn), fence: coordinatorv1.NewFenceServiceClient(conn)}
}

func (c *coord) close() {
	c.conn.Close()
	c.c.Close()
}

type grant struct {
	name, handle string
	token        int64
}

// unavailable retries call while it answers UNAVAILABLE (a check of
// etcd's history that failed on a slow machine pauses a replica briefly).
func unavailable[T any](ctx context.Context, call func() (T, error)) (T, error) {
	for {
		r, err := call()
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return r, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *coord) acquire(t *testing.T, ctx context.Context, name string) grant {
	t.Helper()
	r, err := unavailable(ctx, func() (*coordinatorv1.AcquireResponse, error) {
		return c.lock.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: name, Ttl: durationpb.New(30 * time.Second), Wait: durationpb.New(5 * time.Second)})
	})
	if err != nil {
		t.Fatalf("acquire %s: %v", name, err)
	}
	return grant{name: name, handle: r.GetHandle(), token: r.GetToken()}
}

func (c *coord) release(t *testing.T, ctx context.Context, g grant) bool {
	t.Helper()
	r, err := unavailable(ctx, func() (*coordinatorv1.ReleaseResponse, error) {
		return c.lock.Release(ctx, &coordinatorv1.ReleaseRequest{Name: g.name, Token: g.token, Handle: g.handle})
	})
	if err != nil {
		t.Fatalf("release %s %d: %v", g.name, g.token, err)
	}
	return r.GetReleased()
}

func (c *coord) validate(ctx context.Context, g grant, resource string) (*coordinatorv1.ValidateTokenResponse, error) {
	return c.lock.ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: g.name, Token: g.token, Resource: resource})
}

// mustValidate validates g, which must be valid.
func (c *coord) mustValidate(t *testing.T, ctx context.Context, g grant, resource string) {
	t.Helper()
	r, err := unavailable(ctx, func() (*coordinatorv1.ValidateTokenResponse, error) { return c.validate(ctx, g, resource) })
	if err != nil || !r.GetValid() {
		t.Fatalf("validate %s %d at %q: %v, %v; want valid", g.name, g.token, resource, r, err)
	}
}

// marked is the resource each lock's holders validate against.
var marked = map[string]string{"a": "db"}

// refused asserts that no stale grant validates, without a resource and,
// withMarks, against its lock's resource (an UNAVAILABLE answer, while the
// coordinator handles the restore, is a refusal too).
func (c *coord) refused(t *testing.T, ctx context.Context, stale []grant, withMarks bool) {
	t.Helper()
	for _, g := range stale {
		resources := []string{""}
		if res, ok := marked[g.name]; ok && withMarks {
			resources = append(resources, res)
		}
		for _, res := range resources {
			r, err := c.validate(ctx, g, res)
			if err != nil && status.Code(err) != codes.Unavailable {
				t.Fatalf("validate stale %s %d at %q: %v", g.name, g.token, res, err)
			}
			if r.GetValid() {
				t.Fatalf("stale token %d of %s validated at %q after the restore", g.token, g.name, res)
			}
		}
	}
}

type bumpKind string

const (
	noBump    bumpKind = "NoBump"
	largeBump bumpKind = "LargeBump" // beyond every revision issued before the restore
	smallBump bumpKind = "SmallBump" // half of what it takes
)

// TestRestoreFencesOldTokens: a snapshot, more grants and validations, a
// restore of the snapshot (without --bump-revision, with a large enough
// one, with a too small one) into a new data directory, etcd on it; with a
// coordinator that kept running across the restore and with a fresh one.
// Every token issued after the snapshot is invalid, every new token is
// greater than every token issued before the restore, a holder whose key
// came back cannot renew, release or validate, and the restored (lower)
// mark lets no older token in.
func TestRestoreFencesOldTokens(t *testing.T) {
	for _, bump := range []bumpKind{noBump, largeBump, smallBump} {
		for _, running := range []bool{true, false} {
			mode := "FreshCoordinator"
			if running {
				mode = "RunningCoordinator"
			}
			t.Run(string(bump)+"/"+mode, func(t *testing.T) { restoreCase(t, bump, running) })
		}
	}
}

func restoreCase(t *testing.T, bump bumpKind, running bool) {
	ctx, m := runningMember(t)
	c := startCoord(t, m)
	defer func() { c.close() }()

	// Before the snapshot: grants and validations of lock a (raising the
	// mark of resource db), and b held across it.
	var before []grant
	for range 20 {
		g := c.acquire(t, ctx, "a")
		c.mustValidate(t, ctx, g, "db")
		c.release(t, ctx, g)
		before = append(before, g)
	}
	held := c.acquire(t, ctx, "b") // its key comes back with the snapshot
	before = append(before, held)
	if err := c.c.Epochs().Check(ctx); err != nil { // as the running loop does every interval
		t.Fatal(err)
	}
	snap, snapRev := m.saveSnapshot(t, ctx)

	// After the snapshot: b released and taken again, more grants of a,
	// the mark raised further. All of it is lost with the restore.
	if !c.release(t, ctx, held) {
		t.Fatal("release of b failed")
	}
	var after []grant
	for range 10 {
		g := c.acquire(t, ctx, "a")
		c.mustValidate(t, ctx, g, "db")
		c.release(t, ctx, g)
		after = append(after, g)
	}
	after = append(after, c.acquire(t, ctx, "b"))
	last := after[len(after)-2]
	c.mustValidate(t, ctx, after[len(after)-1], "")
	lastRev := m.revision(t, ctx)

	if !running {
		c.close()
	}
	m.stop()
	if running {
		// A restore takes etcd away for longer than a check interval:
		// the replica has paused before the restored etcd answers.
		eventually(t, 10*time.Second, "paused while etcd is away", func() bool { return c.c.Epochs().Status().Paused != "" })
	}
	var n uint64
	switch bump {
	case largeBump:
		n = uint64(lastRev-snapRev) + 1000
	case smallBump:
		n = uint64(lastRev-snapRev) / 2
	}
	m.start(t, m.restore(t, snap, n))
	if !running {
		c = startCoord(t, m)
	}

	// Until the coordinator raised the epoch, nothing stale validates.
	for deadline := time.Now().Add(20 * time.Second); ; {
		c.refused(t, ctx, append(after, held), true)
		if st := c.c.Epochs().Status(); st.Epoch >= 1 && st.Paused == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("epoch not raised after the restore: %+v", c.c.Epochs().Status())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := c.c.Epochs().Status(); st.Epoch != 1 || st.Floor != 1<<keyspace.EpochShift {
		t.Fatalf("status %+v, want epoch 1, floor 2^48", st)
	}

	// Every token issued after the snapshot is invalid (with and without a
	// resource), and every earlier one too.
	c.refused(t, ctx, append(append(after, before...), held), true)

	// The holder whose key came back cannot renew, release or validate.
	_, err := unavailable(ctx, func() (*coordinatorv1.KeepAliveResponse, error) {
		return c.lock.KeepAlive(ctx, &coordinatorv1.KeepAliveRequest{Name: held.name, Token: held.token, Handle: held.handle})
	})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("KeepAlive of the restored holder: %v, want NOT_FOUND", err)
	}
	if c.release(t, ctx, held) {
		t.Fatal("the restored holder released the lock")
	}
	if r, err := unavailable(ctx, func() (*coordinatorv1.DescribeResponse, error) {
		return c.lock.Describe(ctx, &coordinatorv1.DescribeRequest{Name: "b"})
	}); err != nil || r.GetHolder() != nil {
		t.Fatalf("lock b after the restore: %v, %v; want free (its restored holder revoked)", r, err)
	}
	// Its lease, restored with the snapshot, is revoked: nobody keeps it
	// alive again.
	id, err := strconv.ParseUint(held.handle[:16], 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	if ttl, err := c.c.Etcd().TimeToLive(ctx, clientv3.LeaseID(id)); err != nil || ttl.TTL != -1 {
		t.Fatalf("the restored holder's lease: %v, %v; want revoked (TTL -1)", ttl, err)
	}

	// New tokens are greater than every token issued before the restore,
	// and take the restored (lower) mark past every old token.
	maxOld := int64(0)
	for _, g := range append(append(after, before...), held) {
		maxOld = max(maxOld, g.token)
	}
	ga, gb := c.acquire(t, ctx, "a"), c.acquire(t, ctx, "b")
	for _, g := range []grant{ga, gb} {
		if g.token <= maxOld {
			t.Fatalf("new token %d of %s is not above the old ones (max %d)", g.token, g.name, maxOld)
		}
	}
	c.mustValidate(t, ctx, ga, "db")
	mk, err := c.fence.GetMark(ctx, &coordinatorv1.GetMarkRequest{Resource: "db"})
	if err != nil || mk.GetMark().GetToken() != ga.token {
		t.Fatalf("mark of db: %v, %v; want %d", mk, err, ga.token)
	}
	mk2, err := c.fence.GetMark(ctx, &coordinatorv1.GetMarkRequest{Resource: "db"})
	if err != nil || mk2.GetMark().GetToken() != ga.token {
		t.Fatalf("mark of db after an old token: %v, %v; want %d", mk2, err, ga.token)
	}
	if r, err := c.validate(ctx, last, "db"); err != nil || r.GetValid() || r.GetReason() == coordinatorv1.ValidateTokenResponse_REASON_CURRENT {
		t.Fatalf("the last token of a before the restore at db: %v, %v; want refused", r, err)
	}
}

// revision is etcd's current revision.
func (m *member) revision(t *testing.T, ctx context.Context) int64 {
	t.Helper()
	cli, err := clientv3.New(m.clientConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	r, err := cli.Get(ctx, "any")
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}
