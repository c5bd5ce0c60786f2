package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
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
