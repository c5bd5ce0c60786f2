package server_test

import (
	"context"
	"testing"
	"time"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

func TestWatch(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := e.lc.Watch(ctx, &coordinatorv1.WatchRequest{Name: "w"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := w.Recv()
	if err != nil || first.Kind != coordinatorv1.WatchResponse_KIND_CURRENT || first.Holder != nil {
		t.Fatalf("first event %v, %v; want current/free", first, err)
	}
	a := e.acquire("w", 30*time.Second)
	e.release("w", a.Token, a.Handle)
	b := e.acquire("w", time.Second) // expires
	eventually(t, 5*time.Second, "b expired", func() bool { return !e.validate("w", b.Token).Valid })
	c := e.acquire("w", 30*time.Second)
	if _, err := e.lc.ForceRelease(ctxT(t, 5*time.Second), &coordinatorv1.ForceReleaseRequest{Name: "w", Token: c.Token}); err != nil {
		t.Fatal(err)
	}
	type ev struct {
		kind  coordinatorv1.WatchResponse_Kind
		token int64
	}
	want := []ev{
		{coordinatorv1.WatchResponse_KIND_ACQUIRED, a.Token}, {coordinatorv1.WatchResponse_KIND_RELEASED, a.Token},
		{coordinatorv1.WatchResponse_KIND_ACQUIRED, b.Token}, {coordinatorv1.WatchResponse_KIND_EXPIRED, b.Token},
		{coordinatorv1.WatchResponse_KIND_ACQUIRED, c.Token}, {coordinatorv1.WatchResponse_KIND_FORCE_RELEASED, c.Token},
	}
	var got []*coordinatorv1.WatchResponse
	last := first.Revision
	for range want {
		r, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if r.Revision < last || (r.Revision == last && r.Kind != coordinatorv1.WatchResponse_KIND_ACQUIRED) {
			t.Fatalf("revision %d after %d", r.Revision, last)
		}
		last = r.Revision
		got = append(got, r)
	}
	for i, w := range want {
		if got[i].Kind != w.kind || got[i].Holder.GetToken() != w.token {
			t.Fatalf("event %d = %v %d, want %v %d", i, got[i].Kind, got[i].Holder.GetToken(), w.kind, w.token)
		}
	}
	// Resume after event 2: events 3.. again, no gaps, no duplicates.
	w2, err := e.lc.Watch(ctx, &coordinatorv1.WatchRequest{Name: "w", StartRevision: got[2].Revision + 1})
	if err != nil {
		t.Fatal(err)
	}
	for i := 3; i < len(got); i++ {
		r, err := w2.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if r.Kind != got[i].Kind || r.Revision != got[i].Revision || r.Holder.GetToken() != got[i].Holder.GetToken() {
			t.Fatalf("resumed event %d = %v, want %v", i, r, got[i])
		}
	}
}
