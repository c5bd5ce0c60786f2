package server_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/fence"
	"github.com/coordinatord/coordinatord/internal/server"
)

// errorInfo returns the ErrorInfo detail of err, or nil.
func errorInfo(err error) *errdetails.ErrorInfo {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

// The cross-lock attack (issue 13, row 6): the holder of another lock
// validates its own, newer token against a resource that a lock it does
// not hold protects. Before, that raised the resource's mark and the real
// holder's next write answered REASON_FENCED; now the mark belongs to the
// first lock that raised it, the intruder is refused and nothing changes.
func TestMarkBelongsToTheFirstLockThatRaisedIt(t *testing.T) {
	e := newEnv(t)
	const res = "db/orders"
	owner := e.acquire("orders-writer", time.Minute)
	e.expectReason("orders-writer", owner.Token, res, current)

	intruder := e.acquire("other-job", time.Minute) // a newer, greater token
	_, err := e.lc.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: "other-job", Token: intruder.Token, Resource: res})
	if code(err) != codes.FailedPrecondition {
		t.Fatalf("another lock's token against an owned resource: %v, want FAILED_PRECONDITION", err)
	}
	if info := errorInfo(err); info.GetReason() != "MARK_OWNED_BY_OTHER_LOCK" || info.GetMetadata()["lock"] != "orders-writer" {
		t.Fatalf("ErrorInfo = %v, want MARK_OWNED_BY_OTHER_LOCK naming lock orders-writer", info)
	}
	if m := e.mark(res); m != owner.Token {
		t.Fatalf("mark = %d after the refused intruder, want %d", m, owner.Token)
	}
	// The real holder is not fenced.
	e.expectReason("orders-writer", owner.Token, res, current)
	// Without a resource, or on a resource of its own, the intruder's token
	// is just a valid token.
	e.expectReason("other-job", intruder.Token, "", current)
	e.expectReason("other-job", intruder.Token, "db/other", current)
	// The owner's later holders keep the mark going up.
	e.release("orders-writer", owner.Token, owner.Handle)
	next := e.acquire("orders-writer", time.Minute)
	e.expectReason("orders-writer", next.Token, res, current)
	e.expectReason("orders-writer", owner.Token, res, fenced)
}

// fenceAs is a FenceService client that authenticates as id (bearer
// "tok-<id>", see authStore).
func (e *env) fenceAs(id string) coordinatorv1.FenceServiceClient {
	e.t.Helper()
	conn, err := grpc.NewClient(e.addr, plaintext(), grpc.WithPerRPCCredentials(bearer("tok-"+id)))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.Close() })
	return coordinatorv1.NewFenceServiceClient(conn)
}

// A policy of two identities whose lock prefixes and resource prefixes
// cross: B's lock prefix is A's resource prefix.
const marksPolicy = `{
  "admins": ["ops"],
  "identities": {
    "team-a": {"lock_prefixes": ["a/"], "resource_prefixes": ["res-a/", "shared/"]},
    "team-b": {"lock_prefixes": ["res-a/", "b/"], "resource_prefixes": ["res-b/", "shared/"]}
  }
}`

// Issue 13, row 7: GetMark and ListMarks are checked against the caller's
// resource_prefixes. Before, ListMarks was checked against lock_prefixes:
// B listed A's resource (with A's lock name and live token) and could not
// list its own.
func TestMarksAreVisibleByResourcePrefix(t *testing.T) {
	store, _ := authStore(t, marksPolicy, "ops", "team-a", "team-b")
	e := newEnvWith(t, []server.Option{authOption(store)})
	as := func(id string) coordinatorv1.LockServiceClient {
		return e.dialWith(plaintext(), grpc.WithPerRPCCredentials(bearer("tok-"+id)))
	}
	ctx := func() context.Context { return ctxT(t, 10*time.Second) }
	for _, w := range []struct{ id, lock, res string }{{"team-a", "a/w", "res-a/db"}, {"team-b", "b/w", "res-b/db"}} {
		lc := as(w.id)
		g, err := lc.Acquire(ctx(), &coordinatorv1.AcquireRequest{Name: w.lock, Ttl: dur(time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := lc.ValidateToken(ctx(), &coordinatorv1.ValidateTokenRequest{Name: w.lock, Token: g.Token, Resource: w.res}); err != nil || !r.Valid {
			t.Fatalf("%s validates its own resource: %v, %v", w.id, r, err)
		}
	}
	b, a, ops := e.fenceAs("team-b"), e.fenceAs("team-a"), e.fenceAs("ops")
	list := func(fc coordinatorv1.FenceServiceClient, prefix string) ([]string, error) {
		r, err := fc.ListMarks(ctx(), &coordinatorv1.ListMarksRequest{Prefix: prefix})
		var out []string
		for _, m := range r.GetMarks() {
			out = append(out, m.Resource)
		}
		return out, err
	}
	for _, tc := range []struct {
		who    string
		fc     coordinatorv1.FenceServiceClient
		prefix string
		want   codes.Code
		marks  int
	}{
		{"b lists its own resources", b, "res-b/", codes.OK, 1},
		{"b lists inside its own resources", b, "res-b/d", codes.OK, 1},
		{"b lists a's resources (its lock prefix)", b, "res-a/", codes.PermissionDenied, 0},
		{"b lists everything", b, "", codes.PermissionDenied, 0},
		{"b lists a prefix wider than its own", b, "res-", codes.PermissionDenied, 0},
		{"a lists its own resources", a, "res-a/", codes.OK, 1},
		{"a lists b's resources", a, "res-b/", codes.PermissionDenied, 0},
		{"a lists the shared prefix", a, "shared/", codes.OK, 0},
		{"the admin lists everything", ops, "", codes.OK, 2},
	} {
		t.Run(tc.who, func(t *testing.T) {
			got, err := list(tc.fc, tc.prefix)
			if code(err) != tc.want || len(got) != tc.marks {
				t.Fatalf("ListMarks(%q) = %q, %v; want %v with %d marks", tc.prefix, got, err, tc.want, tc.marks)
			}
		})
	}
	for _, tc := range []struct {
		who  string
		fc   coordinatorv1.FenceServiceClient
		res  string
		want codes.Code
	}{
		{"b gets its own", b, "res-b/db", codes.OK},
		{"b gets a's", b, "res-a/db", codes.PermissionDenied},
		{"a gets b's", a, "res-b/db", codes.PermissionDenied},
		{"a gets its own", a, "res-a/db", codes.OK},
	} {
		t.Run(tc.who, func(t *testing.T) {
			if _, err := tc.fc.GetMark(ctx(), &coordinatorv1.GetMarkRequest{Resource: tc.res}); code(err) != tc.want {
				t.Fatalf("GetMark(%q) = %v, want %v", tc.res, err, tc.want)
			}
		})
	}
}

// newFenceEnv is newEnv whose validators (and its replicas') have opts.
func newFenceEnv(t *testing.T, opts ...fence.Option) *env {
	t.Helper()
	e := &env{t: t, dataDir: t.TempDir(), fenceOpts: opts}
	e.start()
	t.Cleanup(e.stop)
	return e
}

// The per-identity cap on marks is exact under a burst across two
// replicas: of 60 concurrent first validations of distinct resources by one
// identity, exactly the cap create a mark; the others answer
// RESOURCE_EXHAUSTED (TOO_MANY_MARKS) and write nothing. Validations of
// existing marks go on; a deleted mark frees a place.
func TestMarkCapIsExactAcrossReplicas(t *testing.T) {
	const limit, burst = 5, 60
	e := newFenceEnv(t, fence.WithMarkLimit(limit))
	r := e.replica()
	g := e.acquire("writer", time.Minute)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		got  = map[codes.Code]int{}
		made []string
	)
	for i := range burst {
		lc := e.lc
		if i%2 == 1 {
			lc = r.lc
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := fmt.Sprintf("bucket/%02d", i)
			v, err := lc.ValidateToken(ctxT(t, 30*time.Second), &coordinatorv1.ValidateTokenRequest{Name: "writer", Token: g.Token, Resource: res})
			mu.Lock()
			defer mu.Unlock()
			got[code(err)]++
			switch {
			case err == nil && v.Valid:
				made = append(made, res)
			case code(err) == codes.ResourceExhausted:
				if info := errorInfo(err); info.GetReason() != "TOO_MANY_MARKS" || info.GetMetadata()["limit"] != fmt.Sprint(limit) {
					t.Errorf("ErrorInfo = %v, want TOO_MANY_MARKS with limit %d", info, limit)
				}
			default:
				t.Errorf("validate %s: %v, %v", res, v, err)
			}
		}()
	}
	wg.Wait()
	if len(made) != limit || got[codes.ResourceExhausted] != burst-limit {
		t.Fatalf("burst of %d against a cap of %d: %v (created %q)", burst, limit, got, made)
	}
	if n := e.markKeys(); n != limit {
		t.Fatalf("%d marks in etcd, want %d", n, limit)
	}
	// At the cap: existing marks still validate (and advance), new ones do not.
	e.expectReason("writer", g.Token, made[0], current)
	if _, err := r.lc.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: "writer", Token: g.Token, Resource: "bucket/new"}); code(err) != codes.ResourceExhausted {
		t.Fatalf("a new mark at the cap: %v, want RESOURCE_EXHAUSTED", err)
	}
	if _, err := e.fc().DeleteMark(ctxT(t, 10*time.Second), &coordinatorv1.DeleteMarkRequest{Resource: made[0]}); err != nil {
		t.Fatal(err)
	}
	e.expectReason("writer", g.Token, "bucket/new", current)
	if n := e.markKeys(); n != limit {
		t.Fatalf("%d marks in etcd after delete and create, want %d", n, limit)
	}
}

// markKeys counts the mark keys in etcd (the shard core's: marks and
// semaphores' bindings).
func (e *env) markKeys() int64 {
	e.t.Helper()
	prefix := "/test/fence/"
	if e.sharded() {
		prefix = "/test/shards/marks/"
	}
	r, err := e.cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Count
}

// The cross-identity attack of row 6, with authorization: two identities
// that may both use a shared resource. A's lock owns it once A validated
// against it; B, holding its own lock with a newer token, is refused and
// cannot fence A. Only an admin rebinds or deletes the mark.
func TestAnotherIdentityCannotTakeAMarkOnlyAnAdminMovesIt(t *testing.T) {
	store, _ := authStore(t, marksPolicy, "ops", "team-a", "team-b")
	e := newEnvWith(t, []server.Option{authOption(store)})
	as := func(id string) coordinatorv1.LockServiceClient {
		return e.dialWith(plaintext(), grpc.WithPerRPCCredentials(bearer("tok-"+id)))
	}
	ctx := func() context.Context { return ctxT(t, 10*time.Second) }
	la, lb := as("team-a"), as("team-b")
	fa, fops := e.fenceAs("team-a"), e.fenceAs("ops")
	const res = "shared/db"
	acquire := func(lc coordinatorv1.LockServiceClient, name string) *coordinatorv1.AcquireResponse {
		g, err := lc.Acquire(ctx(), &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(time.Minute)})
		if err != nil {
			t.Fatalf("acquire %s: %v", name, err)
		}
		return g
	}
	validate := func(lc coordinatorv1.LockServiceClient, name string, token int64) (*coordinatorv1.ValidateTokenResponse, error) {
		return lc.ValidateToken(ctx(), &coordinatorv1.ValidateTokenRequest{Name: name, Token: token, Resource: res})
	}
	ga := acquire(la, "a/writer")
	if v, err := validate(la, "a/writer", ga.Token); err != nil || !v.Valid {
		t.Fatalf("A validates: %v, %v", v, err)
	}
	gb := acquire(lb, "b/writer")
	_, err := validate(lb, "b/writer", gb.Token)
	if code(err) != codes.FailedPrecondition || errorInfo(err).GetReason() != "MARK_OWNED_BY_OTHER_LOCK" || errorInfo(err).GetMetadata()["lock"] != "a/writer" {
		t.Fatalf("B against A's resource: %v (%v), want FAILED_PRECONDITION MARK_OWNED_BY_OTHER_LOCK naming a/writer", err, errorInfo(err))
	}
	if v, err := validate(la, "a/writer", ga.Token); err != nil || !v.Valid {
		t.Fatalf("A after B's attempt: %v, %v; want still valid (not fenced)", v, err)
	}

	// Only admins delete or rebind.
	for _, who := range []struct {
		name string
		fc   coordinatorv1.FenceServiceClient
	}{{"team-a", fa}, {"team-b", e.fenceAs("team-b")}} {
		if _, err := who.fc.RebindMark(ctx(), &coordinatorv1.RebindMarkRequest{Resource: res, Lock: "b/writer"}); code(err) != codes.PermissionDenied {
			t.Fatalf("RebindMark by %s: %v, want PERMISSION_DENIED", who.name, err)
		}
		if _, err := who.fc.DeleteMark(ctx(), &coordinatorv1.DeleteMarkRequest{Resource: res}); code(err) != codes.PermissionDenied {
			t.Fatalf("DeleteMark by %s: %v, want PERMISSION_DENIED", who.name, err)
		}
	}
	// Rebind: the token stays, B's lock owns the mark, A's is refused.
	rb, err := fops.RebindMark(ctx(), &coordinatorv1.RebindMarkRequest{Resource: res, Lock: "b/writer"})
	if err != nil || rb.GetMark().GetLock() != "b/writer" || rb.GetMark().GetToken() != ga.Token {
		t.Fatalf("RebindMark by the admin: %v, %v", rb, err)
	}
	if v, err := validate(lb, "b/writer", gb.Token); err != nil || !v.Valid {
		t.Fatalf("B after the rebind: %v, %v", v, err)
	}
	if _, err := validate(la, "a/writer", ga.Token); code(err) != codes.FailedPrecondition {
		t.Fatalf("A after the rebind: %v, want FAILED_PRECONDITION", err)
	}
	// Delete: the mark is gone; the next current token owns the resource.
	d, err := fops.DeleteMark(ctx(), &coordinatorv1.DeleteMarkRequest{Resource: res})
	if err != nil || d.GetMark().GetToken() != gb.Token || d.GetMark().GetLock() != "b/writer" {
		t.Fatalf("DeleteMark by the admin: %v, %v", d, err)
	}
	if _, err := fops.GetMark(ctx(), &coordinatorv1.GetMarkRequest{Resource: res}); code(err) != codes.NotFound {
		t.Fatalf("GetMark after delete: %v, want NOT_FOUND", err)
	}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"DeleteMark", func() error {
			_, err := fops.DeleteMark(ctx(), &coordinatorv1.DeleteMarkRequest{Resource: res})
			return err
		}},
		{"RebindMark", func() error {
			_, err := fops.RebindMark(ctx(), &coordinatorv1.RebindMarkRequest{Resource: res, Lock: "a/writer"})
			return err
		}},
	} {
		if err := tc.call(); code(err) != codes.NotFound {
			t.Fatalf("%s without a mark: %v, want NOT_FOUND", tc.name, err)
		}
	}
	if v, err := validate(la, "a/writer", ga.Token); err != nil || !v.Valid {
		t.Fatalf("A after the delete: %v, %v", v, err)
	}
	if g, err := fa.GetMark(ctx(), &coordinatorv1.GetMarkRequest{Resource: res}); err != nil || g.GetMark().GetLock() != "a/writer" {
		t.Fatalf("the new mark: %v, %v", g, err)
	}
}
