package server_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

func TestSessions(t *testing.T) {
	e := newEnv(t)
	const ttl = 2 * time.Second
	s, err := e.lc.OpenSession(ctxT(t, 5*time.Second), &coordinatorv1.OpenSessionRequest{Ttl: dur(ttl), Owner: "batch"})
	if err != nil {
		t.Fatal(err)
	}
	tokens := map[string]int64{}
	for i := range 10 {
		name := fmt.Sprintf("s/%d", i)
		g, err := e.lc.Acquire(ctxT(t, 5*time.Second), &coordinatorv1.AcquireRequest{Name: name, SessionHandle: s.Handle, Wait: dur(0)})
		if err != nil {
			t.Fatalf("acquire %s in session: %v", name, err)
		}
		tokens[name] = g.Token
		// Keep the session alive however slow the machine is.
		if _, err := e.lc.KeepAliveSession(ctxT(t, 5*time.Second), &coordinatorv1.KeepAliveSessionRequest{Handle: s.Handle}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.lc.Acquire(ctxT(t, 5*time.Second), &coordinatorv1.AcquireRequest{Name: "s/0", SessionHandle: s.Handle, Wait: dur(0)}); code(err) != codes.FailedPrecondition {
		t.Fatalf("second acquire of s/0 in the same session: %v, want FAILED_PRECONDITION", err)
	}
	// One heartbeat keeps all ten, for more than twice the TTL.
	for i := range 12 {
		if i > 0 {
			time.Sleep(ttl / 4)
		}
		r, err := e.lc.KeepAliveSession(ctxT(t, 5*time.Second), &coordinatorv1.KeepAliveSessionRequest{Handle: s.Handle})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Holders) != 10 {
			t.Fatalf("session lists %d held locks, want 10", len(r.Holders))
		}
	}
	for name, tok := range tokens {
		if v := e.validate(name, tok); !v.Valid {
			t.Fatalf("%s lost despite session heartbeats: %v", name, v)
		}
	}
	// Release one lock alone; the others stay.
	if !e.release("s/9", tokens["s/9"], s.Handle) {
		t.Fatal("release of one session lock answered false")
	}
	if v := e.validate("s/8", tokens["s/8"]); !v.Valid {
		t.Fatal("releasing one session lock ended another")
	}
	// Closing frees all at once.
	c, err := e.lc.CloseSession(ctxT(t, 5*time.Second), &coordinatorv1.CloseSessionRequest{Handle: s.Handle})
	if err != nil || !c.Closed || len(c.Released) != 9 {
		t.Fatalf("CloseSession = %v, %v; want closed with 9 released", c, err)
	}
	for name := range tokens {
		if _, err := e.tryAcquire(name); err != nil {
			t.Fatalf("%s still blocked after CloseSession: %v", name, err)
		}
	}
	if _, err := e.lc.KeepAliveSession(ctxT(t, 5*time.Second), &coordinatorv1.KeepAliveSessionRequest{Handle: s.Handle}); code(err) != codes.NotFound {
		t.Fatalf("KeepAliveSession after close: %v, want NOT_FOUND", err)
	}
	// A retried close (its first answer lost) is no error: closed=false.
	if c, err := e.lc.CloseSession(ctxT(t, 5*time.Second), &coordinatorv1.CloseSessionRequest{Handle: s.Handle}); err != nil || c.Closed || len(c.Released) != 0 {
		t.Fatalf("CloseSession again = %v, %v; want closed=false", c, err)
	}

	t.Run("losing the session loses every lock", func(t *testing.T) {
		s2, err := e.lc.OpenSession(ctxT(t, 5*time.Second), &coordinatorv1.OpenSessionRequest{Ttl: dur(time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		var gs []*coordinatorv1.AcquireResponse
		for i := range 3 {
			g, err := e.lc.Acquire(ctxT(t, 5*time.Second), &coordinatorv1.AcquireRequest{Name: fmt.Sprint("lost/", i), SessionHandle: s2.Handle})
			if err != nil {
				t.Fatal(err)
			}
			gs = append(gs, g)
		}
		eventually(t, 5*time.Second, "all locks of the silent session free", func() bool {
			for i, g := range gs {
				if e.validate(fmt.Sprint("lost/", i), g.Token).Valid {
					return false
				}
			}
			return true
		})
	})
}
