package server_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/server"
)

// reasonOf extracts the ErrorInfo reason of an error, "" if none.
func reasonOf(err error) string {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// twoIdentities is a server with the test policy and bearer tokens for
// identity a (spiffe://test/team-a), b (b.example) and the admin ops.
func twoIdentities(t *testing.T) (e *env, a, b, ops coordinatorv1.LockServiceClient, reload func(policy string)) {
	t.Helper()
	store, pf := authStore(t, testPolicy, "spiffe://test/team-a", "b.example", "ops")
	e = newEnvWith(t, []server.Option{authOption(store)})
	as := func(id string) coordinatorv1.LockServiceClient {
		return e.dialWith(plaintext(), grpc.WithPerRPCCredentials(bearer("tok-"+id)))
	}
	reload = func(policy string) {
		t.Helper()
		writeFile(t, pf, policy)
		if _, err := store.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	return e, as("spiffe://test/team-a"), as("b.example"), as("ops"), reload
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Finding 2: identity b sending a's request_id got a's token and handle
// (resumed) and could release a's lock or take a's queue place. A request
// id is now looked up under the caller's identity: b's use of the same id
// is another acquisition.
func TestRequestIDIsBoundToTheCallersIdentity(t *testing.T) {
	e, a, b, ops, _ := twoIdentities(t)
	ctx := func() context.Context { return ctxT(t, 10*time.Second) }
	const rid = "0123456789abcdef-held"

	// A granted acquisition: b with a's id is a try-lock of a held lock.
	g, err := a.Acquire(ctx(), &coordinatorv1.AcquireRequest{Name: "shared/job", Ttl: dur(time.Minute), RequestId: rid})
	if err != nil {
		t.Fatal(err)
	}
	r, err := b.Acquire(ctx(), &coordinatorv1.AcquireRequest{Name: "shared/job", Ttl: dur(time.Minute), RequestId: rid, Wait: dur(0)})
	if code(err) != codes.Aborted {
		t.Fatalf("b with a's request_id = %v, %v; want ABORTED (a holds the lock), never a's grant", r, err)
	}
	if got := holderToken(t, err); got != g.Token {
		t.Fatalf("holder token %d, want a's %d", got, g.Token)
	}
	// a's own retry still resumes a's grant.
	if r, err := a.Acquire(ctx(), &coordinatorv1.AcquireRequest{Name: "shared/job", Ttl: dur(time.Minute), RequestId: rid}); err != nil || !r.Resumed || r.Handle != g.Handle {
		t.Fatalf("a's retry = %v, %v; want a's grant, resumed", r, err)
	}

	// A waiting acquisition: b with a's id does not take a's queue place.
	h, err := ops.Acquire(ctx(), &coordinatorv1.AcquireRequest{Name: "shared/queue", Ttl: dur(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	const waitID = "0123456789abcdef-wait"
	waiting := make(chan error, 1)
	go func() {
		_, err := a.Acquire(ctxT(t, 30*time.Second), &coordinatorv1.AcquireRequest{Name: "shared/queue", Ttl: dur(time.Minute), RequestId: waitID})
		waiting <- err
	}()
	eventually(t, 10*time.Second, "a waits", func() bool { return e.queueKeys("shared/queue") == 2 })
	if r, err := b.Acquire(ctx(), &coordinatorv1.AcquireRequest{Name: "shared/queue", Ttl: dur(time.Minute), RequestId: waitID, Wait: dur(0)}); code(err) != codes.Aborted {
		t.Fatalf("b with a waiter's request_id = %v, %v; want ABORTED", r, err)
	}
	if n := e.queueKeys("shared/queue"); n != 2 {
		t.Fatalf("queue has %d keys after b's try, want 2 (holder, a)", n)
	}
	if _, err := ops.Release(ctx(), &coordinatorv1.ReleaseRequest{Name: "shared/queue", Token: h.Token, Handle: h.Handle}); err != nil {
		t.Fatal(err)
	}
	if err := <-waiting; err != nil {
		t.Fatalf("a's wait: %v", err)
	}

	// Once a's grant is released, b's use of the id is simply b's own.
	if _, err := a.Release(ctx(), &coordinatorv1.ReleaseRequest{Name: "shared/job", Token: g.Token, Handle: g.Handle}); err != nil {
		t.Fatal(err)
	}
	bg, err := b.Acquire(ctx(), &coordinatorv1.AcquireRequest{Name: "shared/job", Ttl: dur(time.Minute), RequestId: rid})
	if err != nil || bg.Resumed || bg.Handle == g.Handle {
		t.Fatalf("b's acquisition with the id = %v, %v; want a fresh grant", bg, err)
	}
	// And a's retry with it is not b's grant either (a new acquisition that
	// queues behind b).
	if r, err := a.Acquire(ctx(), &coordinatorv1.AcquireRequest{Name: "shared/job", Ttl: dur(time.Minute), RequestId: rid, Wait: dur(0)}); code(err) != codes.Aborted {
		t.Fatalf("a's retry after b took the id = %v, %v; want ABORTED", r, err)
	}
}

// Finding 3: the same request_id with other grant parameters silently
// returned the first grant. It now answers FAILED_PRECONDITION
// (REQUEST_ID_REUSED); the same parameters (whatever the wait) resume.
func TestRequestIDReusedWithOtherParameters(t *testing.T) {
	e := newEnv(t)
	ctx := func() context.Context { return ctxT(t, 10*time.Second) }
	base := func(id string) *coordinatorv1.AcquireRequest {
		return &coordinatorv1.AcquireRequest{Name: "reuse/" + id, RequestId: "0123456789abcdef-" + id, Ttl: dur(20 * time.Second),
			MaxHold: dur(time.Minute), LockDelay: dur(time.Second), Owner: "worker-1"}
	}
	for i, tc := range []struct {
		name   string
		change func(*coordinatorv1.AcquireRequest)
		want   codes.Code
	}{
		{"ttl", func(r *coordinatorv1.AcquireRequest) { r.Ttl = dur(30 * time.Second) }, codes.FailedPrecondition},
		{"ttl unset", func(r *coordinatorv1.AcquireRequest) { r.Ttl = nil }, codes.FailedPrecondition},
		{"max_hold", func(r *coordinatorv1.AcquireRequest) { r.MaxHold = dur(2 * time.Minute) }, codes.FailedPrecondition},
		{"lock_delay", func(r *coordinatorv1.AcquireRequest) { r.LockDelay = dur(2 * time.Second) }, codes.FailedPrecondition},
		{"lock_delay unset", func(r *coordinatorv1.AcquireRequest) { r.LockDelay = nil }, codes.FailedPrecondition},
		{"owner", func(r *coordinatorv1.AcquireRequest) { r.Owner = "worker-2" }, codes.FailedPrecondition},
		{"same parameters", func(*coordinatorv1.AcquireRequest) {}, codes.OK},
		{"another wait", func(r *coordinatorv1.AcquireRequest) { r.Wait = dur(0) }, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := strconv.Itoa(i)
			first, err := e.lc.Acquire(ctx(), base(id))
			if err != nil {
				t.Fatal(err)
			}
			retry := base(id)
			tc.change(retry)
			before := e.rev()
			r, err := e.lc.Acquire(ctx(), retry)
			if code(err) != tc.want {
				t.Fatalf("retry with another %s = %v, %v; want %v", tc.name, r, err, tc.want)
			}
			if tc.want != codes.OK {
				if got := reasonOf(err); got != "REQUEST_ID_REUSED" {
					t.Fatalf("reason %q, want REQUEST_ID_REUSED", got)
				}
				if after := e.rev(); after != before {
					t.Fatalf("a refused retry wrote to etcd (revision %d -> %d)", before, after)
				}
			} else if !r.Resumed || r.Token != first.Token || r.Handle != first.Handle {
				t.Fatalf("retry with the same parameters = %v; want the first grant, resumed", r)
			}
			// The first grant is untouched either way.
			if v := e.validate(retry.Name, first.Token); !v.Valid {
				t.Fatalf("the first grant is gone: %v", v)
			}
		})
	}
}

// Finding 16: the proto said request_id is 1 to 128 bytes; the server
// requires 16. The proto now states the server's rule, and the bounds hold.
func TestRequestIDLengthRuleMatchesTheProto(t *testing.T) {
	proto, err := os.ReadFile("../../api/coordinator/v1/lock.proto")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(strings.ReplaceAll(string(proto), "//", "")), " ")
	rule := fmt.Sprintf("%d to %d bytes of printable ASCII", lease.MinRequestIDLen, lease.MaxRequestIDLen)
	if !strings.Contains(text, rule) {
		t.Fatalf("lock.proto does not state the request_id rule %q", rule)
	}
	e := newEnv(t)
	for i, tc := range []struct {
		n    int
		want codes.Code
	}{{lease.MinRequestIDLen - 1, codes.InvalidArgument}, {lease.MinRequestIDLen, codes.OK}, {lease.MaxRequestIDLen, codes.OK}, {lease.MaxRequestIDLen + 1, codes.InvalidArgument}} {
		id := strings.Repeat("r", tc.n)
		_, err := e.lc.Acquire(ctxT(t, 5*time.Second), &coordinatorv1.AcquireRequest{Name: "len/" + strconv.Itoa(i), RequestId: id})
		if code(err) != tc.want || err != nil && fieldOf(err) != "request_id" {
			t.Fatalf("request_id of %d bytes = %v (field %q), want %v", tc.n, err, fieldOf(err), tc.want)
		}
	}
}
