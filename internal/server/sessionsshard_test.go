package server_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// A session on the shard core spans members: its locks live on the owners
// of their names' shards, one keep-alive renews them all through any
// replica, and the session and its locks survive a crash of the member
// that owns its home shard (its record and its grants are committed
// before they are answered; the next owner honours each for a full TTL).
func TestShardSessionSpansMembersAndSurvivesItsHomesCrash(t *testing.T) {
	e, r := newShardPair(t)
	const ttl = 3 * time.Second
	// Opened through r: its home is a shard r serves.
	s, err := r.lc.OpenSession(ctxT(t, 10*time.Second), &coordinatorv1.OpenSessionRequest{Ttl: dur(ttl)})
	if err != nil {
		t.Fatal(err)
	}
	names := []string{nameOwnedBy(t, e, "on-e/"), nameOwnedBy(t, e, "on-e2/")}
	for i := range 1000 { // and two names on r's shards
		n := fmt.Sprintf("on-r/%d", i)
		if _, ok := e.coord.Shards().Ownership().Owned(e.coord.Shards().ShardOf(n)); !ok {
			names = append(names, n)
		}
		if len(names) == 4 {
			break
		}
	}
	tokens := map[string]int64{}
	for _, n := range names {
		g, err := e.lc.Acquire(ctxT(t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: n, SessionHandle: s.Handle, Wait: dur(0)})
		if err != nil {
			t.Fatalf("acquire %s through the session: %v", n, err)
		}
		if g.Handle != s.Handle {
			t.Fatalf("a lock held through the session answered handle %q, not the session's", g.Handle)
		}
		tokens[n] = g.Token
	}
	keepAlive := func(lc coordinatorv1.LockServiceClient) (*coordinatorv1.KeepAliveSessionResponse, error) {
		return lc.KeepAliveSession(ctxT(t, 10*time.Second), &coordinatorv1.KeepAliveSessionRequest{Handle: s.Handle})
	}
	// Through the member that is not the session's home, for longer than
	// the TTL: every lock on both members stays.
	for range 8 {
		k, err := keepAlive(e.lc)
		if err != nil {
			t.Fatal(err)
		}
		if len(k.Holders) != len(names) {
			t.Fatalf("the session lists %d locks, want %d: %v", len(k.Holders), len(names), k.Holders)
		}
		time.Sleep(ttl / 4)
	}
	for n, tok := range tokens {
		if v := e.validate(n, tok); !v.Valid {
			t.Fatalf("%s lost despite the session's keep-alives: %v", n, v)
		}
	}
	r.crash()
	// e takes r's shards over once r's member lease ends (2 s), and with
	// them the session: keep-alives go on through e.
	var last string
	eventually(t, 20*time.Second, "the session renewed through the surviving member", func() bool {
		k, err := keepAlive(e.lc)
		last = fmt.Sprint(k, err)
		if err == nil && len(k.Holders) == len(names) {
			return true
		}
		t.Logf("keep-alive after the crash: %s", last)
		return false
	})
	for n, tok := range tokens {
		if v := e.validate(n, tok); !v.Valid {
			t.Fatalf("%s lost across the crash of the session's home: %v", n, v)
		}
	}
	c, err := e.lc.CloseSession(ctxT(t, 10*time.Second), &coordinatorv1.CloseSessionRequest{Handle: s.Handle})
	if err != nil || !c.Closed || len(c.Released) != len(names) {
		t.Fatalf("CloseSession = %v, %v; want closed with %d released", c, err, len(names))
	}
	for _, n := range names {
		if _, err := e.tryAcquire(n); err != nil {
			t.Fatalf("%s still held after CloseSession: %v", n, err)
		}
	}
	if _, err := keepAlive(e.lc); code(err) != codes.NotFound {
		t.Fatalf("KeepAliveSession after close: %v, want NOT_FOUND", err)
	}
}
