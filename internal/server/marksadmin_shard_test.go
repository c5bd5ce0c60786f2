package server_test

import (
	"cmp"
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/wrapperspb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/server"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// The FenceService's mark calls on the shard-owner core (fence.go,
// marksshard.go, internal/shard/markadmin.go), with the queue core's
// contract (fence_test.go, marks_test.go, semaphore_test.go).

// markWant is what a test expects of one FenceService call: its code and
// ErrorInfo reason, or (OK) the mark's lock, token and slot (-1: the
// resource's own).
type markWant struct {
	code   codes.Code
	reason string
	lock   string
	token  int64
	slot   int32
}

// check asserts a call's answer against w.
func (w markWant) check(t *testing.T, what string, m *coordinatorv1.Mark, err error) {
	t.Helper()
	if w.code != codes.OK {
		expectRefusal(t, what, err, w.code, w.reason)
		return
	}
	slot := int32(-1)
	if m.GetSlot() != nil {
		slot = m.GetSlot().GetValue()
	}
	if err != nil || m.GetLock() != w.lock || m.GetToken() != w.token || slot != w.slot {
		t.Fatalf("%s = %v, %v; want lock %q token %d slot %d", what, m, err, w.lock, w.token, w.slot)
	}
}

// shardMarkCount is the shard core's count of the marks identity id made.
func (e *env) shardMarkCount(id string) string {
	e.t.Helper()
	r, err := e.cli.Get(context.Background(), "/test/shards/markcounts/"+keyspace.IdentityHash(id))
	if err != nil {
		e.t.Fatal(err)
	}
	if len(r.Kvs) == 0 {
		return ""
	}
	return string(r.Kvs[0].Value)
}

// GetMark and ListMarks read the shard core's marks: a mark's token and
// lock, a slot's mark by its slot, a semaphore's binding as no mark; the
// queue core's order and exact pages; bad input refused naming the field.
func TestShardMarkAdminReads(t *testing.T) {
	e := newShardMarkEnv(t, nil)
	fc, ctx := e.fc(), func() context.Context { return ctxT(t, 10*time.Second) }
	tokens := map[string]int64{}
	for _, res := range []string{"db/a", "db/a/b", "db%2Fa", "db-a", "db", "other"} {
		g := e.acquire("lock-"+res, time.Minute)
		e.expectReason("lock-"+res, g.Token, res, current)
		tokens[res] = g.Token
	}
	s0, s1 := e.acquireSem("sem", 2), e.acquireSem("sem", 2)
	for _, g := range []*coordinatorv1.AcquireResponse{s0, s1} {
		e.expectReason("sem", g.Token, "semres", current)
	}
	slot := wrapperspb.Int32
	for _, tc := range []struct {
		name string
		req  *coordinatorv1.GetMarkRequest
		want markWant
	}{
		{"a mark", &coordinatorv1.GetMarkRequest{Resource: "db/a"}, markWant{lock: "lock-db/a", token: tokens["db/a"], slot: -1}},
		{"an escaped name", &coordinatorv1.GetMarkRequest{Resource: "db%2Fa"}, markWant{lock: "lock-db%2Fa", token: tokens["db%2Fa"], slot: -1}},
		{"a slot's mark", &coordinatorv1.GetMarkRequest{Resource: "semres", Slot: slot(s1.Slot)}, markWant{lock: "sem", token: s1.Token, slot: s1.Slot}},
		{"no mark", &coordinatorv1.GetMarkRequest{Resource: "none"}, markWant{code: codes.NotFound, reason: "NO_MARK"}},
		{"a binding is no mark", &coordinatorv1.GetMarkRequest{Resource: "semres"}, markWant{code: codes.NotFound, reason: "NO_MARK"}},
		{"a slot without a mark", &coordinatorv1.GetMarkRequest{Resource: "semres", Slot: slot(2)}, markWant{code: codes.NotFound, reason: "NO_MARK"}},
		{"a negative slot", &coordinatorv1.GetMarkRequest{Resource: "db", Slot: slot(-1)}, markWant{code: codes.InvalidArgument, reason: "INVALID_FIELD"}},
		{"no resource", &coordinatorv1.GetMarkRequest{}, markWant{code: codes.InvalidArgument, reason: "INVALID_FIELD"}},
	} {
		t.Run("GetMark "+tc.name, func(t *testing.T) {
			r, err := fc.GetMark(ctx(), tc.req)
			tc.want.check(t, "GetMark", r.GetMark(), err)
		})
	}
	if m, err := fc.GetMark(ctx(), &coordinatorv1.GetMarkRequest{Resource: "db"}); err != nil || m.GetMark().GetUpdatedAt().AsTime().IsZero() {
		t.Fatalf("GetMark(db) has no updated_at: %v, %v", m, err)
	}

	list := func(t *testing.T, prefix string, size int32) []string {
		var out []string
		for tok := ""; ; {
			r, err := fc.ListMarks(ctx(), &coordinatorv1.ListMarksRequest{Prefix: prefix, PageSize: size, PageToken: tok})
			if err != nil {
				t.Fatalf("ListMarks(%q): %v", prefix, err)
			}
			for _, m := range r.GetMarks() {
				name := m.GetResource()
				if m.GetSlot() != nil {
					name = fmt.Sprintf("%s#%d", name, m.GetSlot().GetValue())
				}
				out = append(out, name)
			}
			if r.GetNextPageToken() == "" {
				return out
			}
			if size > 0 && len(r.GetMarks()) != int(size) {
				t.Fatalf("a page of %d marks before the last, want %d", len(r.GetMarks()), size)
			}
			tok = r.GetNextPageToken()
		}
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		// Escaped order: "db" < "db%252Fa" < "db%2Fa" < "db%2Fa%2Fb" < "db-a".
		{"", []string{"db", "db%2Fa", "db/a", "db/a/b", "db-a", "other", "semres#0", "semres#1"}},
		{"db/", []string{"db/a", "db/a/b"}},
		{"db/a", []string{"db/a", "db/a/b"}},
		{"db%", []string{"db%2Fa"}},
		{"sem", []string{"semres#0", "semres#1"}},
		{"x", nil},
	} {
		for _, size := range []int32{0, 1, 2} {
			t.Run(fmt.Sprintf("ListMarks %q page %d", tc.prefix, size), func(t *testing.T) {
				if got := list(t, tc.prefix, size); fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Fatalf("ListMarks(%q, page %d) = %q, want %q", tc.prefix, size, got, tc.want)
				}
			})
		}
	}
	for _, tc := range []struct {
		name  string
		req   *coordinatorv1.ListMarksRequest
		field string
	}{
		{"negative page", &coordinatorv1.ListMarksRequest{PageSize: -1}, "page_size"},
		{"foreign token", &coordinatorv1.ListMarksRequest{PageToken: "!!"}, "page_token"},
		{"control char", &coordinatorv1.ListMarksRequest{Prefix: "a\tb"}, "prefix"},
	} {
		t.Run("ListMarks "+tc.name, func(t *testing.T) {
			_, err := fc.ListMarks(ctx(), tc.req)
			expectRefusal(t, "ListMarks", err, codes.InvalidArgument, "INVALID_FIELD")
			if fieldOf(err) != tc.field {
				t.Fatalf("field %q, want %q", fieldOf(err), tc.field)
			}
		})
	}
}

// markAdminPolicy: ops is an admin; alice and bob use jobs/ locks and
// res/ resources.
const markAdminPolicy = `{
  "admins": ["ops"],
  "identities": {
    "alice": {"lock_prefixes": ["jobs/"], "resource_prefixes": ["res/"]},
    "bob":   {"lock_prefixes": ["jobs/"], "resource_prefixes": ["res/"]}
  }
}`

// Only an admin deletes or rebinds a mark: anyone else is refused
// PERMISSION_DENIED (ADMIN_ONLY) and changes nothing; NOT_FOUND and
// INVALID_ARGUMENT as on the queue core.
func TestShardMarkAdminChangesAreForAdmins(t *testing.T) {
	store, _ := authStore(t, markAdminPolicy, "ops", "alice", "bob")
	e := newShardMarkEnv(t, []server.Option{authOption(store)})
	alice := e.dialWith(plaintext(), grpc.WithPerRPCCredentials(bearer("tok-alice")))
	g := acquireAs(t, alice, &coordinatorv1.AcquireRequest{Name: "jobs/a", Ttl: dur(time.Minute)})
	if v, err := validateAs(t, alice, "jobs/a", g.Token, "res/db"); err != nil || !v.Valid {
		t.Fatalf("alice fences res/db: %v, %v", v, err)
	}
	ops, ctx := e.fenceAs("ops"), func() context.Context { return ctxT(t, 10*time.Second) }
	rev := e.rev()
	for _, tc := range []struct {
		name string
		call func() error
		code codes.Code
		why  string
	}{
		{"DeleteMark by alice", func() error {
			_, err := e.fenceAs("alice").DeleteMark(ctx(), &coordinatorv1.DeleteMarkRequest{Resource: "res/db"})
			return err
		}, codes.PermissionDenied, "ADMIN_ONLY"},
		{"RebindMark by bob", func() error {
			_, err := e.fenceAs("bob").RebindMark(ctx(), &coordinatorv1.RebindMarkRequest{Resource: "res/db", Lock: "jobs/b"})
			return err
		}, codes.PermissionDenied, "ADMIN_ONLY"},
		{"DeleteMark of no mark", func() error {
			_, err := ops.DeleteMark(ctx(), &coordinatorv1.DeleteMarkRequest{Resource: "res/none"})
			return err
		}, codes.NotFound, "NO_MARK"},
		{"RebindMark of no mark", func() error {
			_, err := ops.RebindMark(ctx(), &coordinatorv1.RebindMarkRequest{Resource: "res/none", Lock: "jobs/b"})
			return err
		}, codes.NotFound, "NO_MARK"},
		{"DeleteMark of a negative slot", func() error {
			_, err := ops.DeleteMark(ctx(), &coordinatorv1.DeleteMarkRequest{Resource: "res/db", Slot: wrapperspb.Int32(-1)})
			return err
		}, codes.InvalidArgument, "INVALID_FIELD"},
		{"RebindMark to no lock", func() error {
			_, err := ops.RebindMark(ctx(), &coordinatorv1.RebindMarkRequest{Resource: "res/db"})
			return err
		}, codes.InvalidArgument, "INVALID_FIELD"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectRefusal(t, tc.name, tc.call(), tc.code, tc.why)
		})
	}
	if r := e.rev(); r != rev {
		t.Fatalf("refused calls wrote: revision %d -> %d", rev, r)
	}
	if m, l := e.shardMark("res%2Fdb"); m != g.Token || l != "jobs/a" {
		t.Fatalf("mark %d of %q after the refused calls, want %d of jobs/a", m, l, g.Token)
	}
	if d, err := ops.DeleteMark(ctx(), &coordinatorv1.DeleteMarkRequest{Resource: "res/db"}); err != nil || d.GetMark().GetToken() != g.Token {
		t.Fatalf("DeleteMark by the admin: %v, %v", d, err)
	}
}

// An admin's delete frees the mark and its place in the cap: with a cap
// of one mark, the lower token of another lock then validates on the
// resource (a new mark, which only the lowered count admits), and owns it.
func TestShardMarkAdminDeleteFreesTheMarkAndTheCap(t *testing.T) {
	e := newShardMarkEnv(t, nil, shard.WithMarkLimit(1))
	fc, ctx := e.fc(), func() context.Context { return ctxT(t, 10*time.Second) }
	low := e.acquire("low", time.Minute)
	high := e.acquire("high", time.Minute)
	e.expectReason("high", high.Token, "res", current)
	for _, tc := range []struct {
		name, lock string
		token      int64
		resource   string
		code       codes.Code
		reason     string
	}{
		{"another lock's lower token", "low", low.Token, "res", codes.FailedPrecondition, "MARK_OWNED_BY_OTHER_LOCK"},
		{"a second mark at the cap", "high", high.Token, "res2", codes.ResourceExhausted, "TOO_MANY_MARKS"},
	} {
		_, err := e.lc.ValidateToken(ctx(), &coordinatorv1.ValidateTokenRequest{Name: tc.lock, Token: tc.token, Resource: tc.resource})
		expectRefusal(t, tc.name+" before the delete", err, tc.code, tc.reason)
	}
	d, err := fc.DeleteMark(ctx(), &coordinatorv1.DeleteMarkRequest{Resource: "res"})
	markWant{lock: "high", token: high.Token, slot: -1}.check(t, "DeleteMark", d.GetMark(), err)
	_, err = fc.GetMark(ctx(), &coordinatorv1.GetMarkRequest{Resource: "res"})
	expectRefusal(t, "GetMark after the delete", err, codes.NotFound, "NO_MARK")
	if c := e.shardMarkCount(""); c != "0" {
		t.Fatalf("the mark count after the delete = %q, want 0", c)
	}
	e.expectReason("low", low.Token, "res", current) // below the deleted mark: the mark is gone
	g, err := fc.GetMark(ctx(), &coordinatorv1.GetMarkRequest{Resource: "res"})
	markWant{lock: "low", token: low.Token, slot: -1}.check(t, "the new mark", g.GetMark(), err)
	if c := e.shardMarkCount(""); c != "1" {
		t.Fatalf("the mark count after the new mark = %q, want 1", c)
	}
	_, err = e.lc.ValidateToken(ctx(), &coordinatorv1.ValidateTokenRequest{Name: "high", Token: high.Token, Resource: "res"})
	expectRefusal(t, "the deleted mark's lock", err, codes.FailedPrecondition, "MARK_OWNED_BY_OTHER_LOCK")
}

// An admin's rebind moves a mark, its token kept: the former lock's tokens
// are refused MARK_OWNED_BY_OTHER_LOCK naming the new lock, whose tokens
// below the mark are fenced and above it raise it; a slot's mark moves
// alone, its semaphore's other slot still validating (the queue core's
// TestSemaphoreSlotMarksAreReachable).
func TestShardMarkAdminRebindMovesTheMark(t *testing.T) {
	e := newShardMarkEnv(t, nil)
	fc, ctx := e.fc(), func() context.Context { return ctxT(t, 10*time.Second) }
	// A lock of another shard, and one of the same shard as "a".
	other, same := "", ""
	for i := 0; other == "" || same == ""; i++ {
		n := fmt.Sprintf("b-%d", i)
		if shard.ShardOf(n, shardMarkShards) == shard.ShardOf("a", shardMarkShards) {
			same = cmp.Or(same, n)
		} else {
			other = cmp.Or(other, n)
		}
	}
	tokens := map[string]int64{}
	for _, n := range []string{other, "a", same} { // tokens rise in this order
		tokens[n] = e.acquire(n, time.Minute).Token
	}
	e.expectReason("a", tokens["a"], "res", current)
	sem := []*coordinatorv1.AcquireResponse{e.acquireSem("sem", 2), e.acquireSem("sem", 2)}
	for _, g := range sem {
		e.expectReason("sem", g.Token, "semres", current)
	}
	for _, tc := range []struct {
		name     string
		req      *coordinatorv1.RebindMarkRequest
		want     markWant
		from     string
		fromTok  int64
		to       coordinatorv1.ValidateTokenResponse_Reason
		toTok    int64
		stillOwn []*coordinatorv1.AcquireResponse // semaphore holders still valid
	}{
		{"to a lock of another shard", &coordinatorv1.RebindMarkRequest{Resource: "res", Lock: other},
			markWant{lock: other, token: tokens["a"], slot: -1}, "a", tokens["a"], fenced, tokens[other], nil},
		{"to a lock of the first one's shard", &coordinatorv1.RebindMarkRequest{Resource: "res", Lock: same},
			markWant{lock: same, token: tokens["a"], slot: -1}, other, tokens[other], current, tokens[same], nil},
		{"a slot's mark", &coordinatorv1.RebindMarkRequest{Resource: "semres", Lock: "elsewhere", Slot: wrapperspb.Int32(sem[1].Slot)},
			markWant{lock: "elsewhere", token: sem[1].Token, slot: sem[1].Slot}, "sem", sem[1].Token, 0, 0, sem[:1]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := fc.RebindMark(ctx(), tc.req)
			tc.want.check(t, "RebindMark", r.GetMark(), err)
			_, err = e.lc.ValidateToken(ctx(), &coordinatorv1.ValidateTokenRequest{Name: tc.from, Token: tc.fromTok, Resource: tc.req.GetResource()})
			expectRefusal(t, "the former lock "+tc.from, err, codes.FailedPrecondition, "MARK_OWNED_BY_OTHER_LOCK")
			if l := errorInfo(err).GetMetadata()["lock"]; l != tc.req.GetLock() {
				t.Fatalf("the refusal names lock %q, want %q", l, tc.req.GetLock())
			}
			if tc.toTok != 0 {
				e.expectReason(tc.req.GetLock(), tc.toTok, tc.req.GetResource(), tc.to)
			}
			for _, g := range tc.stillOwn {
				e.expectReason("sem", g.Token, tc.req.GetResource(), current)
			}
		})
	}
	if m, l := e.shardMark("res"); m != tokens[same] || l != same {
		t.Fatalf("mark %d of %q, want %d of %q (raised by the new lock)", m, l, tokens[same], same)
	}
}

// With two members, an admin's delete and rebind through the member that
// does not own the mark's lock's shard are forwarded to the owner (the
// admin's identity crossing the hop with the member secret) and change
// its cache: validated on the owner afterwards, a lower token of another
// lock owns the deleted mark's resource, and after a rebind the former
// lock is refused.
func TestShardMarkAdminThroughAnotherMember(t *testing.T) {
	store, _ := authStore(t, markAdminPolicy, "ops", "alice")
	opts := []server.Option{authOption(store), server.WithMemberSecret(fwdSecret)}
	etcd := startEtcdForShards(t)
	a := startReplica(t, etcd, "/t/", "a", false, opts...)
	b := startReplica(t, etcd, "/t/", "b", false, opts...)
	waitSplit(t, []*fwdReplica{a, b})
	names := namesOn(t, b, "jobs/", 2)
	eventually(t, 15*time.Second, "b serves the names' shards", func() bool {
		_, err0 := b.coord.Shards().Validate(names[0], 1)
		_, err1 := b.coord.Shards().Validate(names[1], 1)
		return err0 == nil && err1 == nil
	})
	ctx := func() context.Context { return ctxT(t, 20*time.Second) }
	grant := func(name string) int64 {
		g, err := b.lc.Acquire(as(ctx(), "alice"), &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(time.Minute)})
		if err != nil {
			t.Fatalf("acquire %s: %v", name, err)
		}
		return g.GetToken()
	}
	validateOnB := func(name string, token int64) (*coordinatorv1.ValidateTokenResponse, error) {
		return b.lc.ValidateToken(as(ctx(), "alice"), &coordinatorv1.ValidateTokenRequest{Name: name, Token: token, Resource: "res/x"})
	}
	low, high := grant(names[0]), grant(names[1])
	if v, err := validateOnB(names[1], high); err != nil || !v.GetValid() {
		t.Fatalf("the higher token fences res/x on its owner: %v, %v", v, err)
	}
	conn, err := grpc.NewClient(a.addr, plaintext())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	viaA := coordinatorv1.NewFenceServiceClient(conn)

	for _, step := range []struct {
		name   string
		change func() (*coordinatorv1.Mark, error)
		want   markWant
		then   func(t *testing.T)
	}{
		{"delete", func() (*coordinatorv1.Mark, error) {
			r, err := viaA.DeleteMark(as(ctx(), "ops"), &coordinatorv1.DeleteMarkRequest{Resource: "res/x"})
			return r.GetMark(), err
		}, markWant{lock: names[1], token: high, slot: -1}, func(t *testing.T) {
			if v, err := validateOnB(names[0], low); err != nil || !v.GetValid() {
				t.Fatalf("the lower token of the other lock on the owner after the delete: %v, %v; want valid (a new mark)", v, err)
			}
		}},
		{"rebind", func() (*coordinatorv1.Mark, error) {
			r, err := viaA.RebindMark(as(ctx(), "ops"), &coordinatorv1.RebindMarkRequest{Resource: "res/x", Lock: names[1]})
			return r.GetMark(), err
		}, markWant{lock: names[1], token: low, slot: -1}, func(t *testing.T) {
			_, err := validateOnB(names[0], low)
			expectRefusal(t, "the former lock on the owner after the rebind", err, codes.FailedPrecondition, "MARK_OWNED_BY_OTHER_LOCK")
			if v, err := validateOnB(names[1], high); err != nil || !v.GetValid() {
				t.Fatalf("the new lock on the owner after the rebind: %v, %v", v, err)
			}
		}},
	} {
		t.Run(step.name, func(t *testing.T) {
			m, err := step.change()
			step.want.check(t, step.name+" through a", m, err)
			step.then(t)
		})
	}
	_, err = viaA.DeleteMark(as(ctx(), "alice"), &coordinatorv1.DeleteMarkRequest{Resource: "res/x"})
	expectRefusal(t, "a non-admin's delete through a", err, codes.PermissionDenied, "ADMIN_ONLY")
	r, err := viaA.GetMark(as(ctx(), "alice"), &coordinatorv1.GetMarkRequest{Resource: "res/x"})
	markWant{lock: names[1], token: high, slot: -1}.check(t, "GetMark through a", r.GetMark(), err)
}
