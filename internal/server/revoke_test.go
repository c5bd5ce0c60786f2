package server_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/server"
)

// reasonOf is the ErrorInfo reason of a status error, "" if none.

// A revoked identity keeps none of its streams and none of its waits: once
// the store reloads the changed policy (or token file), its open Hold and
// Watch streams and its Acquires waiting in a queue end with
// PERMISSION_DENIED (policy) or UNAUTHENTICATED (token), reason
// IDENTITY_REVOKED, while another identity's streams go on.
func TestRevokedIdentityLosesItsStreams(t *testing.T) {
	const both = `{"identities": {"a": {"lock_prefixes": ["a/"]}, "b": {"lock_prefixes": ["b/"]}}}`
	for _, tc := range []struct {
		name   string
		revoke func(t *testing.T, dir string)
		want   codes.Code
		// silentEnds: a Hold stream that sent nothing yet ends as well (the
		// identity is gone, not only its right to one name).
		silentEnds bool
	}{
		{"removed from the policy", func(t *testing.T, dir string) {
			write(t, filepath.Join(dir, "policy.json"), `{"identities": {"b": {"lock_prefixes": ["b/"]}}}`)
		}, codes.PermissionDenied, true},
		{"prefix taken away", func(t *testing.T, dir string) {
			write(t, filepath.Join(dir, "policy.json"), `{"identities": {"a": {"lock_prefixes": ["other/"]}, "b": {"lock_prefixes": ["b/"]}}}`)
		}, codes.PermissionDenied, false},
		{"token removed", func(t *testing.T, dir string) {
			write(t, filepath.Join(dir, "tokens"), "b "+tokenHash("tok-b")+"\n")
		}, codes.Unauthenticated, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, pf := authStore(t, both, "a", "b")
			e := newEnvWith(t, []server.Option{authOption(store)})
			a := e.dialWith(plaintext(), grpc.WithPerRPCCredentials(bearer("tok-a")))
			b := e.dialWith(plaintext(), grpc.WithPerRPCCredentials(bearer("tok-b")))
			ctx := ctxT(t, 30*time.Second)

			hold := func(lc coordinatorv1.LockServiceClient, name string) coordinatorv1.LockService_HoldClient {
				st, err := lc.Hold(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := st.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Acquire{Acquire: &coordinatorv1.HoldAcquire{
					Request: &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(time.Minute)}}}}); err != nil {
					t.Fatal(err)
				}
				if r, err := st.Recv(); err != nil || r.GetGranted() == nil {
					t.Fatalf("Hold %s: %v, %v", name, r, err)
				}
				return st
			}
			watch := func(lc coordinatorv1.LockServiceClient, name string) coordinatorv1.LockService_WatchClient {
				st, err := lc.Watch(ctx, &coordinatorv1.WatchRequest{Name: name})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := st.Recv(); err != nil {
					t.Fatalf("Watch %s: %v", name, err)
				}
				return st
			}
			aHold, aWatch := hold(a, "a/held"), watch(a, "a/watched")
			// A Hold stream that has not sent its first message yet.
			aIdle, err := a.Hold(ctx)
			if err != nil {
				t.Fatal(err)
			}
			bHold, bWatch := hold(b, "b/held"), watch(b, "b/watched")
			// A unary Acquire waiting in the queue of a lock a holds.
			if _, err := a.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "a/queued", Ttl: dur(time.Minute)}); err != nil {
				t.Fatal(err)
			}
			aWaiting := make(chan error, 1)
			go func() {
				_, err := a.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "a/queued", Ttl: dur(time.Minute), Wait: dur(time.Minute)})
				aWaiting <- err
			}()
			waiters := func() int { return e.waiters("a/queued") }
			eventually(t, 10*time.Second, "the second Acquire waits", func() bool { return waiters() == 1 })

			tc.revoke(t, filepath.Dir(pf))
			if changed, err := store.Reload(); err != nil || !changed {
				t.Fatalf("reload: %v, %v", changed, err)
			}
			ended := map[string]func() error{
				"the Hold stream":  func() error { _, err := aHold.Recv(); return err },
				"the Watch stream": func() error { _, err := aWatch.Recv(); return err },
			}
			ended["a waiting Acquire"] = func() error { return <-aWaiting }
			if tc.silentEnds {
				ended["a silent Hold stream"] = func() error { _, err := aIdle.Recv(); return err }
			}
			for what, recv := range ended {
				if err := recv(); code(err) != tc.want || reasonOf(err) != "IDENTITY_REVOKED" {
					t.Errorf("%s of the revoked identity: %v (reason %q), want %v IDENTITY_REVOKED", what, err, reasonOf(err), tc.want)
				}
			}
			// The revoked waiter left the queue (its queue key was removed).
			eventually(t, 10*time.Second, "the revoked waiter leaves the queue", func() bool { return waiters() == 0 })
			// The other identity's streams go on: a heartbeat is answered.
			if err := bHold.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Heartbeat{Heartbeat: &coordinatorv1.HoldHeartbeat{}}}); err != nil {
				t.Fatal(err)
			}
			if r, err := bHold.Recv(); err != nil || r.GetRenewed() == nil {
				t.Fatalf("another identity's heartbeat after the reload: %v, %v", r, err)
			}
			if _, err := b.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "b/watched", Ttl: dur(time.Minute)}); err != nil {
				t.Fatal(err)
			}
			if r, err := bWatch.Recv(); err != nil || r.GetKind() != coordinatorv1.WatchResponse_KIND_ACQUIRED {
				t.Fatalf("another identity's Watch after the reload: %v, %v", r, err)
			}
		})
	}
}

func write(t *testing.T, file, content string) {
	t.Helper()
	// A new size or modification time is what a reload notices.
	if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
