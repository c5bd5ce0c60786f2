package shard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/fence"
	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/locktable"
)

// The marks' admin calls on the shard-owner core (markadmin.go).

// plain and slot name a resource's own mark and one of its slot marks.
func plain(res string) fence.MarkID { return fence.MarkID{Resource: res} }

func slotOf(res string, slot int32) fence.MarkID {
	return fence.MarkID{Resource: res, PerSlot: true, Slot: slot}
}

// markCount is the identity id's mark count in etcd ("" if none).
func markCount(t *testing.T, cli *clientv3.Client, id string) string {
	t.Helper()
	r, err := cli.Get(ctxT(t), "/t/shards/markcounts/"+keyspace.IdentityHash(id))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) == 0 {
		return ""
	}
	return string(r.Kvs[0].Value)
}

// namesIn are n lock names of the shard.
func namesIn(o *Owner, shard uint32, n int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		if name := fmt.Sprintf("n%d", i); o.ShardOf(name) == shard {
			out = append(out, name)
		}
	}
	return out
}

// acquireOn acquires name (a mutex) and fails the test on an error.
func acquireOn(t *testing.T, o *Owner, name string) *locktable.Grant {
	t.Helper()
	g, err := o.Acquire(ctxT(t), acq(name, 30*time.Second, 0))
	if err != nil {
		t.Fatalf("acquire %q: %v", name, err)
	}
	return g
}

// GetMark and ListMarks read etcd: a mark's token, lock and time, a slot's
// mark by its slot, no binding; the queue core's order and exact pages.
func TestMarkAdminReads(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	tokens := map[string]int64{}
	before := time.Now()
	for _, res := range []string{"db/a", "db/a/b", "db%2Fa", "db-a", "db", "other"} {
		g := acquireOn(t, o, "lock-"+res)
		expectMark(t, o, check("lock-"+res, g.Token, res, ""), fence.Current, g.Token)
		tokens[res] = g.Token
	}
	sem := semHolders(t, o, "sem", 2)
	for _, g := range sem {
		expectMark(t, o, check("sem", g.Token, "sem-res", ""), fence.Current, g.Token)
	}
	m, err := o.GetMark(ctx, plain("db/a"))
	if err != nil || m.Token != tokens["db/a"] || m.Lock != "lock-db/a" || m.PerSlot || m.UpdatedAt.Before(before.Add(-time.Second)) {
		t.Fatalf("GetMark(db/a) = %+v, %v", m, err)
	}
	if m, err := o.GetMark(ctx, slotOf("sem-res", sem[1].Slot)); err != nil || m.Token != sem[1].Token || m.Lock != "sem" || !m.PerSlot || m.Slot != sem[1].Slot {
		t.Fatalf("GetMark of slot %d = %+v, %v", sem[1].Slot, m, err)
	}
	for _, id := range []fence.MarkID{plain("none"), plain("sem-res"), slotOf("sem-res", 2), slotOf("db", 0)} {
		if _, err := o.GetMark(ctx, id); !errors.Is(err, fence.ErrNoMark) {
			t.Fatalf("GetMark(%+v) = %v, want ErrNoMark (a binding is no mark)", id, err)
		}
	}

	list := func(prefix string, size int) []string {
		var out []string
		for tok := ""; ; {
			ms, next, err := o.ListMarks(ctx, prefix, size, tok)
			if err != nil {
				t.Fatalf("ListMarks(%q, %d): %v", prefix, size, err)
			}
			for _, m := range ms {
				name := m.Resource
				if m.PerSlot {
					name = fmt.Sprintf("%s#%d", m.Resource, m.Slot)
				}
				out = append(out, name)
			}
			if next == "" {
				return out
			}
			if len(ms) != size {
				t.Fatalf("a page of %d marks before the last, want %d", len(ms), size)
			}
			tok = next
		}
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		// Escaped order, as the queue core's: "db" < "db%252Fa" < "db%2Fa" < "db%2Fa%2Fb" < "db-a".
		{"", []string{"db", "db%2Fa", "db/a", "db/a/b", "db-a", "other", "sem-res#0", "sem-res#1"}},
		{"db/", []string{"db/a", "db/a/b"}},
		{"db%", []string{"db%2Fa"}},
		{"sem", []string{"sem-res#0", "sem-res#1"}},
		{"x", nil},
	} {
		for _, size := range []int{0, 1, 2, 3} {
			if got := list(tc.prefix, size); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("ListMarks(%q, page %d) = %q, want %q", tc.prefix, size, got, tc.want)
			}
		}
	}

	for _, tc := range []struct {
		name  string
		call  func() error
		field string
	}{
		{"GetMark without a resource", func() error { _, err := o.GetMark(ctx, plain("")); return err }, "resource"},
		{"GetMark of a negative slot", func() error { _, err := o.GetMark(ctx, slotOf("r", -1)); return err }, "slot"},
		{"ListMarks negative page", func() error { _, _, err := o.ListMarks(ctx, "", -1, ""); return err }, "page_size"},
		{"ListMarks bad token", func() error { _, _, err := o.ListMarks(ctx, "", 0, "!!"); return err }, "page_token"},
		{"ListMarks control char", func() error { _, _, err := o.ListMarks(ctx, "a\tb", 0, ""); return err }, "prefix"},
		{"DeleteMark of a negative slot", func() error { _, err := o.DeleteMark(ctx, slotOf("r", -1)); return err }, "slot"},
		{"RebindMark to no lock", func() error { _, err := o.RebindMark(ctx, plain("db"), ""); return err }, "lock"},
	} {
		var fe *keyspace.FieldError
		if err := tc.call(); !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: %v, want a field error on %q", tc.name, err, tc.field)
		}
	}
}

// A deleted mark frees its place in the cap and the owner's cache: the
// lower token of another lock then owns the resource (a new mark, which
// the cap of 1 admits only because the delete lowered the count), and
// the deleted mark's own lock is refused as any other lock.
func TestMarkAdminDeleteFreesTheCapAndTheCache(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli, WithMarkLimit(1))
	ctx := ctxT(t)
	names := namesIn(o, 0, 2) // one owner caches the mark for both
	la, lb := names[0], names[1]
	a, b := acquireOn(t, o, la), acquireOn(t, o, lb)
	expectMark(t, o, check(lb, b.Token, "r", "id"), fence.Current, b.Token)
	var mo *fence.MarkOwnedError
	if _, err := o.ValidateResource(ctx, check(la, a.Token, "r", "id")); !errors.As(err, &mo) {
		t.Fatalf("the other lock before the delete: %v, want MarkOwnedError", err)
	}
	var tm *fence.TooManyMarksError
	if _, err := o.ValidateResource(ctx, check(lb, b.Token, "r2", "id")); !errors.As(err, &tm) {
		t.Fatalf("a second mark at the cap: %v, want TooManyMarksError", err)
	}

	m, err := o.DeleteMark(ctx, plain("r"))
	if err != nil || m.Token != b.Token || m.Lock != lb {
		t.Fatalf("DeleteMark = %+v, %v; want the mark as it was", m, err)
	}
	if _, ok := storedMark(t, cli, markPrefix+"r"); ok || markCount(t, cli, "id") != "0" {
		t.Fatalf("after the delete: mark stored %v, count %q; want none and 0", ok, markCount(t, cli, "id"))
	}
	if _, err := o.GetMark(ctx, plain("r")); !errors.Is(err, fence.ErrNoMark) {
		t.Fatalf("GetMark after the delete: %v", err)
	}
	if _, err := o.DeleteMark(ctx, plain("r")); !errors.Is(err, fence.ErrNoMark) {
		t.Fatalf("DeleteMark again: %v, want ErrNoMark", err)
	}
	// A's token is below the deleted mark: it validates, and owns r now.
	expectMark(t, o, check(la, a.Token, "r", "id"), fence.Current, a.Token)
	if s, ok := storedMark(t, cli, markPrefix+"r"); !ok || s.Lock != la || s.Token != a.Token || markCount(t, cli, "id") != "1" {
		t.Fatalf("the new mark = %+v (%v), count %q; want %q at %d, count 1", s, ok, markCount(t, cli, "id"), la, a.Token)
	}
	if _, err := o.ValidateResource(ctx, check(lb, b.Token, "r", "id")); !errors.As(err, &mo) || mo.Owner != la {
		t.Fatalf("the deleted mark's lock afterwards: %v, want MarkOwnedError naming %q", err, la)
	}
}

// A rebound mark keeps its token; from then on only the new lock raises
// it, on its own shard's owner: the former lock is refused at once (its
// owner's cache learnt it), the new lock's token below the mark is fenced,
// above it raises. Rebinding to the lock it has writes nothing.
func TestMarkAdminRebindMovesTheMark(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	inZero := namesIn(o, 0, 2)
	x, z, other := inZero[0], inZero[1], shardName(o, 1)
	tokens := map[string]int64{}
	for _, n := range []string{other, x, z} { // tokens rise in this order
		tokens[n] = acquireOn(t, o, n).Token
	}
	expectMark(t, o, check(x, tokens[x], "r", ""), fence.Current, tokens[x])
	for _, tc := range []struct {
		from, to string
		reason   fence.Reason // of the new lock's token
	}{
		{x, other, fence.Fenced},  // to another shard: x's owner forgets the mark
		{other, z, fence.Current}, // to x's shard again: z raises it
		{z, x, fence.Fenced},      // x's token is below z's now
	} {
		m, err := o.RebindMark(ctx, plain("r"), tc.to)
		if err != nil || m.Lock != tc.to {
			t.Fatalf("RebindMark to %q = %+v, %v", tc.to, m, err)
		}
		if s, _ := storedMark(t, cli, markPrefix+"r"); s.Lock != tc.to || s.Token != m.Token {
			t.Fatalf("stored after the rebind to %q: %+v, want %+v", tc.to, s, m)
		}
		var mo *fence.MarkOwnedError
		if _, err := o.ValidateResource(ctx, check(tc.from, tokens[tc.from], "r", "")); !errors.As(err, &mo) || mo.Owner != tc.to {
			t.Fatalf("the former lock %q after the rebind: %v, want MarkOwnedError naming %q", tc.from, err, tc.to)
		}
		if v := validateRes(t, o, check(tc.to, tokens[tc.to], "r", "")); v.Reason != tc.reason {
			t.Fatalf("the new lock %q's token %d: %+v, want %v", tc.to, tokens[tc.to], v, tc.reason)
		}
	}
	rev := etcdRev(t, cli)
	if m, err := o.RebindMark(ctx, plain("r"), x); err != nil || m.Lock != x || m.Token != tokens[z] {
		t.Fatalf("RebindMark to its own lock = %+v, %v", m, err)
	}
	if etcdRev(t, cli) != rev {
		t.Fatal("a rebind to the lock the mark has wrote")
	}
	if _, err := o.RebindMark(ctx, plain("none"), x); !errors.Is(err, fence.ErrNoMark) {
		t.Fatalf("RebindMark of no mark: %v", err)
	}
}

// A semaphore's slot marks are deleted one by one, each lowering the cap's
// count; the last one takes the binding with it, and the resource is free:
// another lock's mutex then owns it.
func TestMarkAdminDeleteLastSlotMarkDropsTheBinding(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	sem := semHolders(t, o, "sem", 2)
	for _, g := range sem {
		expectMark(t, o, check("sem", g.Token, "r", "id"), fence.Current, g.Token)
	}
	if n, c := countKeys(t, cli, markPrefix+"r"), markCount(t, cli, "id"); n != 3 || c != "2" {
		t.Fatalf("%d keys under r, count %q; want a binding and 2 slot marks, count 2", n, c)
	}
	for i, want := range []struct {
		keys  int64
		count string
	}{{2, "1"}, {0, "0"}} {
		if m, err := o.DeleteMark(ctx, slotOf("r", sem[i].Slot)); err != nil || m.Token != sem[i].Token || !m.PerSlot {
			t.Fatalf("DeleteMark of slot %d = %+v, %v", sem[i].Slot, m, err)
		}
		if n, c := countKeys(t, cli, markPrefix+"r"), markCount(t, cli, "id"); n != want.keys || c != want.count {
			t.Fatalf("after deleting slot %d: %d keys under r, count %q; want %d, %s", sem[i].Slot, n, c, want.keys, want.count)
		}
	}
	g := acquireOn(t, o, "mutex")
	expectMark(t, o, check("mutex", g.Token, "r", "other"), fence.Current, g.Token)
	// The semaphore's holders are refused now, and recreate nothing.
	var mo *fence.MarkOwnedError
	if _, err := o.ValidateResource(ctx, check("sem", sem[1].Token, "r", "id")); !errors.As(err, &mo) || mo.Owner != "mutex" {
		t.Fatalf("the semaphore after its marks were deleted: %v, want MarkOwnedError naming mutex", err)
	}
}

// A member that does not own the mark's lock's shard changes nothing and
// names the owner; the owner does it.
func TestMarkAdminChangesOnlyOnTheOwner(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli, WithMember("m1", "a1"))
	rctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	relay, err := NewOwner(rctx, cli, "/t/", WithShards(8), WithLeaseTTL(2*time.Second), WithMember("r", "ar"), AsRelay())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		relay.Close(cctx)
	})
	ctx := ctxT(t)
	g := acquireOn(t, o, "l")
	expectMark(t, o, check("l", g.Token, "r", ""), fence.Current, g.Token)
	if m, err := relay.GetMark(ctx, plain("r")); err != nil || m.Token != g.Token {
		t.Fatalf("GetMark on the relay = %+v, %v", m, err)
	}
	rev := etcdRev(t, cli)
	for name, call := range map[string]func() error{
		"DeleteMark": func() error { _, err := relay.DeleteMark(ctx, plain("r")); return err },
		"RebindMark": func() error { _, err := relay.RebindMark(ctx, plain("r"), "k"); return err },
	} {
		var ns *NotServingError
		if err := call(); !errors.As(err, &ns) || ns.Owner != "m1" || ns.Addr != "a1" || ns.Shard != o.ShardOf("l") {
			t.Fatalf("%s on the relay: %v, want a NotServingError naming m1", name, err)
		}
	}
	if etcdRev(t, cli) != rev {
		t.Fatal("a refused change wrote")
	}
	if _, err := o.DeleteMark(ctx, plain("r")); err != nil {
		t.Fatalf("DeleteMark on the owner: %v", err)
	}
}

// A hold waits for the raises of its keys in flight, and validations wait
// for the hold: the change never races a raise of the mark it changes.
func TestMarkAdminHoldWaitsForRaisesAndValidationsWaitForIt(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	g := acquireOn(t, o, "l")
	expectMark(t, o, check("l", g.Token, "r", ""), fence.Current, g.Token)
	s, key := o.shards[o.ShardOf("l")], o.markKey(markID{resource: "r"})

	s.mu.Lock()
	s.raiseStarted(key) // as a raise in flight
	s.mu.Unlock()
	deleted := make(chan error, 1)
	go func() {
		_, err := o.DeleteMark(ctx, plain("r"))
		deleted <- err
	}()
	select {
	case err := <-deleted:
		t.Fatalf("the delete did not wait for the raise in flight: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if _, ok := storedMark(t, cli, markPrefix+"r"); !ok {
		t.Fatal("the mark was deleted with a raise in flight")
	}
	s.mu.Lock()
	s.raiseEnded(key)
	s.mu.Unlock()
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}

	expectMark(t, o, check("l", g.Token, "r", ""), fence.Current, g.Token) // created again
	h, err := o.holdMarks(ctx, s, key)
	if err != nil {
		t.Fatal(err)
	}
	validated := make(chan error, 1)
	go func() {
		_, err := o.ValidateResource(ctx, check("l", g.Token, "r", ""))
		validated <- err
	}()
	select {
	case err := <-validated:
		t.Fatalf("a validation answered during a hold of its mark: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	o.releaseMarks(h, nil)
	if err := <-validated; err != nil {
		t.Fatal(err)
	}
}

// A read of a mark older than its delete here is not believed: the
// decision reads again.
func TestMarkAdminStaleReadIsNotBelieved(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli)
	ctx := ctxT(t)
	g := acquireOn(t, o, "l")
	expectMark(t, o, check("l", g.Token, "r", ""), fence.Current, g.Token)
	s, key := o.shards[o.ShardOf("l")], o.markKey(markID{resource: "r"})
	s.mu.Lock()
	gen := s.gen
	s.mu.Unlock()
	old, err := o.readMarks(ctx, gen, []string{key})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.DeleteMark(ctx, plain("r")); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	_, _, known := o.markAt(s, key, &old)
	s.mu.Unlock()
	if known {
		t.Fatal("a read from before the delete was believed")
	}
	fresh, err := o.readMarks(ctx, gen, []string{key})
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	_, exists, known := o.markAt(s, key, &fresh)
	s.mu.Unlock()
	if !known || exists {
		t.Fatalf("a read after the delete: exists %v, known %v; want known absent", exists, known)
	}
}

// Deletes race a holder that keeps raising the mark (new holders, each
// validating): whatever the interleaving, a mark in etcd is always counted
// (no raise put a deleted mark back behind its delete) and is its lock's.
func TestMarkAdminDeletesRacingRaisesKeepTheCount(t *testing.T) {
	_, cli := ownerEtcd(t)
	o := startOwner(t, cli, WithMarkLimit(0))
	ctx := ctxT(t)
	stop := time.Now().Add(1500 * time.Millisecond)
	var wg sync.WaitGroup
	wg.Go(func() {
		for time.Now().Before(stop) {
			g, err := o.Acquire(ctx, acq("l", 30*time.Second, 0))
			if err != nil {
				t.Errorf("acquire: %v", err)
				return
			}
			for range 3 {
				if _, err := o.ValidateResource(ctx, check("l", g.Token, "r", "id")); err != nil {
					t.Errorf("validate: %v", err)
					return
				}
			}
			if _, err := o.Release(ctx, "l", g.Token, g.Handle, "alice"); err != nil {
				t.Errorf("release: %v", err)
				return
			}
		}
	})
	deletes := 0
	wg.Go(func() {
		for time.Now().Before(stop) {
			if _, err := o.DeleteMark(ctx, plain("r")); err == nil {
				deletes++
			} else if !errors.Is(err, fence.ErrNoMark) {
				t.Errorf("delete: %v", err)
				return
			}
		}
	})
	wg.Wait()
	m, exists := storedMark(t, cli, markPrefix+"r")
	want := map[bool]string{true: "1", false: "0"}[exists]
	if c := markCount(t, cli, "id"); c != want || (exists && m.Lock != "l") {
		t.Fatalf("after %d deletes: mark %+v (stored %v), count %q; want count %s", deletes, m, exists, c, want)
	}
	if deletes == 0 {
		t.Fatal("no delete succeeded: the race was not run")
	}
}
