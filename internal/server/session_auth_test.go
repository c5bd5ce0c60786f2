package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// Finding 13: a session handle let any identity list and release the
// session's locks, outside its own prefixes. A session belongs to the
// identity that opened it: every use of its handle by another identity is
// PERMISSION_DENIED, and changes nothing.
func TestSessionBelongsToTheIdentityThatOpenedIt(t *testing.T) {
	_, a, b, _, _ := twoIdentities(t)
	ctx := func() context.Context { return ctxT(t, 10*time.Second) }
	s, err := a.OpenSession(ctx(), &coordinatorv1.OpenSessionRequest{Ttl: dur(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	g, err := a.Acquire(ctx(), &coordinatorv1.AcquireRequest{Name: "shared/s", SessionHandle: s.Handle})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		call func(lc coordinatorv1.LockServiceClient) error
	}{
		{"Acquire through the session", func(lc coordinatorv1.LockServiceClient) error {
			_, err := lc.Acquire(ctx(), &coordinatorv1.AcquireRequest{Name: "shared/t", SessionHandle: s.Handle, Wait: dur(0)})
			return err
		}},
		{"KeepAliveSession", func(lc coordinatorv1.LockServiceClient) error {
			_, err := lc.KeepAliveSession(ctx(), &coordinatorv1.KeepAliveSessionRequest{Handle: s.Handle})
			return err
		}},
		{"CloseSession", func(lc coordinatorv1.LockServiceClient) error {
			_, err := lc.CloseSession(ctx(), &coordinatorv1.CloseSessionRequest{Handle: s.Handle})
			return err
		}},
		{"Release a lock of the session", func(lc coordinatorv1.LockServiceClient) error {
			_, err := lc.Release(ctx(), &coordinatorv1.ReleaseRequest{Name: "shared/s", Token: g.Token, Handle: g.Handle})
			return err
		}},
		{"KeepAlive a lock of the session", func(lc coordinatorv1.LockServiceClient) error {
			_, err := lc.KeepAlive(ctx(), &coordinatorv1.KeepAliveRequest{Name: "shared/s", Token: g.Token, Handle: g.Handle})
			return err
		}},
		{"Hold resume of a lock of the session", func(lc coordinatorv1.LockServiceClient) error {
			st, err := lc.Hold(ctx())
			if err != nil {
				return err
			}
			if err := st.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Resume{Resume: &coordinatorv1.HoldResume{Name: "shared/s", Token: g.Token, Handle: g.Handle}}}); err != nil {
				return err
			}
			_, err = st.Recv()
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(b); code(err) != codes.PermissionDenied {
				t.Fatalf("%s by another identity = %v, want PERMISSION_DENIED", tc.name, err)
			}
			if got := reasonOf(tc.call(b)); got != "SESSION_OF_ANOTHER_IDENTITY" {
				t.Fatalf("reason %q, want SESSION_OF_ANOTHER_IDENTITY", got)
			}
		})
	}
	// Nothing b did changed the session or its lock; its opener still can.
	if v, err := a.ValidateToken(ctx(), &coordinatorv1.ValidateTokenRequest{Name: "shared/s", Token: g.Token}); err != nil || !v.Valid {
		t.Fatalf("the session's lock is gone: %v, %v", v, err)
	}
	if _, err := a.Acquire(ctx(), &coordinatorv1.AcquireRequest{Name: "shared/t", SessionHandle: s.Handle, Wait: dur(0)}); err != nil {
		t.Fatalf("Acquire through its own session: %v", err)
	}
	r, err := a.KeepAliveSession(ctx(), &coordinatorv1.KeepAliveSessionRequest{Handle: s.Handle})
	if err != nil || len(r.Holders) != 2 {
		t.Fatalf("KeepAliveSession by its opener = %v, %v; want 2 holders", r, err)
	}
	c, err := a.CloseSession(ctx(), &coordinatorv1.CloseSessionRequest{Handle: s.Handle})
	if err != nil || !c.Closed || len(c.Released) != 2 {
		t.Fatalf("CloseSession by its opener = %v, %v", c, err)
	}
}

// What a session lists or releases by name is checked against the caller's
// lock prefixes now: after a policy change, a lock the session took under
// the old policy is neither shown nor released by name (it ends with the
// session).
func TestSessionListsAndReleasesOnlyWithinTheCallersPrefixes(t *testing.T) {
	_, a, _, _, reload := twoIdentities(t)
	ctx := func() context.Context { return ctxT(t, 10*time.Second) }
	s, err := a.OpenSession(ctx(), &coordinatorv1.OpenSessionRequest{Ttl: dur(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a/1", "shared/1"} {
		if _, err := a.Acquire(ctx(), &coordinatorv1.AcquireRequest{Name: n, SessionHandle: s.Handle}); err != nil {
			t.Fatal(err)
		}
	}
	reload(`{"admins": ["ops"], "identities": {"spiffe://test/team-a": {"lock_prefixes": ["a/"]}, "b.example": {"lock_prefixes": ["b/"]}}}`)
	names := func(hs []*coordinatorv1.Holder) []string {
		var ns []string
		for _, h := range hs {
			ns = append(ns, h.Name)
		}
		return ns
	}
	r, err := a.KeepAliveSession(ctx(), &coordinatorv1.KeepAliveSessionRequest{Handle: s.Handle})
	if err != nil || len(r.Holders) != 1 || r.Holders[0].Name != "a/1" {
		t.Fatalf("KeepAliveSession after the policy change = %v (holders %v), %v; want only a/1", r, names(r.GetHolders()), err)
	}
	c, err := a.CloseSession(ctx(), &coordinatorv1.CloseSessionRequest{Handle: s.Handle})
	if err != nil || !c.Closed || len(c.Released) != 1 || c.Released[0].Name != "a/1" {
		t.Fatalf("CloseSession after the policy change = %v (released %v), %v; want only a/1", c, names(c.GetReleased()), err)
	}
}
