package client_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordinatord/coordinatord/client"
)

func TestGrantByRef(t *testing.T) {
	c := dial(t)
	ctx := ctxT(t, 10*time.Second)
	g, err := c.AcquireGrant(ctx, "t/byref", client.WithTTL(5*time.Second), client.WithOwner("o"))
	if err != nil {
		t.Fatal(err)
	}
	if g.Token <= 0 || g.Handle == "" || g.TTL != 5*time.Second || g.ExpiresAt.IsZero() || g.SafeUntil.IsZero() || g.AcquiredAt.IsZero() {
		t.Fatalf("grant %+v", g)
	}
	for _, shown := range []string{fmt.Sprint(g), fmt.Sprintf("%+v", g), fmt.Sprint(g.GrantRef), fmt.Sprintf("%v", &g)} {
		if strings.Contains(shown, g.Handle) {
			t.Fatalf("a printed grant shows its handle: %s", shown)
		}
	}
	_, err = c.AcquireGrant(ctx, "t/byref", client.WithWait(0))
	var held *client.HeldError
	if !errors.As(err, &held) || held.HolderToken != g.Token {
		t.Fatalf("AcquireGrant of a held lock: %v, want a HeldError with holder %d", err, g.Token)
	}
	other, err := c.AcquireGrant(ctx, "t/byref-other", client.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = c.Release(ctxT(t, 5*time.Second), other.GrantRef) })
	wrong := g.GrantRef
	wrong.Handle = other.Handle // well-formed, but another grant's
	for _, tc := range []struct {
		name string
		ref  client.GrantRef
		code codes.Code
	}{
		{"wrong handle", wrong, codes.NotFound},
		{"the grant", g.GrantRef, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := c.KeepAlive(ctx, tc.ref); status.Code(err) != tc.code {
				t.Fatalf("KeepAlive: %v, want %v", err, tc.code)
			}
			released, err := c.Release(ctx, tc.ref)
			if err != nil || released != (tc.code == codes.OK) {
				t.Fatalf("Release: %v, %v", released, err)
			}
		})
	}
	if _, err := c.KeepAlive(ctx, g.GrantRef); status.Code(err) != codes.NotFound {
		t.Fatalf("KeepAlive after Release: %v, want NOT_FOUND", err)
	}
	if _, err := c.KeepAlive(ctx, client.GrantRef{Name: "t/byref", Token: -1, Handle: "h"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("KeepAlive with a bad token: %v, want INVALID_ARGUMENT (not retried)", err)
	}
}

func TestPagerPages(t *testing.T) {
	c := dial(t)
	ctx := ctxT(t, 10*time.Second)
	for i := range 5 {
		l, err := c.Acquire(ctx, fmt.Sprintf("t/pages/%d", i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Release(ctxT(t, 5*time.Second)) })
	}
	p := c.Pages("t/pages/", client.WithPageSize(2))
	var sizes []int
	for p.More() {
		page, err := p.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(page))
	}
	if fmt.Sprint(sizes) != "[2 2 1]" {
		t.Fatalf("page sizes %v, want [2 2 1]", sizes)
	}
	n := 0
	for _, err := range c.List(ctx, "t/pages/", client.WithPageSize(-1)) {
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("List with a negative page size: %v, want INVALID_ARGUMENT", err)
		}
		n++
	}
	if n != 1 {
		t.Fatalf("List yielded %d errors, want 1", n)
	}
}

func TestWatchFromRevision(t *testing.T) {
	c := dial(t)
	ctx := ctxT(t, 10*time.Second)
	w, err := c.Watch(ctx, "t/watchrev")
	if err != nil {
		t.Fatal(err)
	}
	cur, err := w.Next()
	w.Close()
	if err != nil || cur.Kind != client.EventCurrent {
		t.Fatalf("first event %+v, %v", cur, err)
	}
	g, err := c.AcquireGrant(ctx, "t/watchrev")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, g.GrantRef); err != nil {
		t.Fatal(err)
	}
	w, err = c.Watch(ctx, "t/watchrev", client.WithStartRevision(cur.Revision+1))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var got []string
	for range 2 {
		ev, err := w.Next()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%v %d", ev.Kind, ev.Holder.Token))
	}
	if want := fmt.Sprintf("[acquired %d released %d]", g.Token, g.Token); fmt.Sprint(got) != want {
		t.Fatalf("events %v, want %v", got, want)
	}
}

func TestSessionAcquiresOnce(t *testing.T) {
	c := dial(t)
	ctx := ctxT(t, 10*time.Second)
	s, err := c.OpenSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g, err := s.Acquire(ctx, "t/session", client.WithTTL(time.Minute), client.WithRequestID("ignored-in-a-session"))
	if err != nil || g.Handle != s.Handle {
		t.Fatalf("Acquire through a session: %+v, %v; want the session's handle", g, err)
	}
	if _, err := s.Acquire(ctx, "t/session"); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("second Acquire of one name in a session: %v, want FAILED_PRECONDITION", err)
	}
	if shown := fmt.Sprintf("%v %+v", s, s); strings.Contains(shown, s.Handle) {
		t.Fatalf("a printed session shows its handle: %s", shown)
	}
	if closed, released, err := s.Close(ctx); !closed || len(released) != 1 || err != nil {
		t.Fatalf("Close: %v %v %v", closed, released, err)
	}
	// What a retry of Close after a lost answer sees: false, no error.
	if closed, released, err := s.Close(ctx); closed || len(released) != 0 || err != nil {
		t.Fatalf("Close of a closed session: %v %v %v, want false and no error", closed, released, err)
	}
	if _, _, err := s.KeepAlive(ctx); status.Code(err) != codes.NotFound {
		t.Fatalf("KeepAlive of a closed session: %v, want NOT_FOUND", err)
	}
}
