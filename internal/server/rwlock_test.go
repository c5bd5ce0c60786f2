package server_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// rwReq is an Acquire of name as a reader (shared) or a writer.
func rwReq(name string, shared bool, wait time.Duration) *coordinatorv1.AcquireRequest {
	req := &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(30 * time.Second), Mode: coordinatorv1.LockMode_LOCK_MODE_EXCLUSIVE}
	if shared {
		req.Mode = coordinatorv1.LockMode_LOCK_MODE_SHARED
	}
	if wait >= 0 {
		req.Wait = dur(wait)
	}
	return req
}

// TestRWLockAdmission: readers overlap; a writer excludes readers and
// writers; a reader behind a waiting writer waits although only readers
// hold; a mutex acquisition of the name is a writer.
func TestRWLockAdmission(t *testing.T) {
	e := newEnv(t)
	r1, err := e.lc.Acquire(ctxT(t, 10*time.Second), rwReq("rw", true, 0))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := e.lc.Acquire(ctxT(t, 10*time.Second), rwReq("rw", true, 0))
	if err != nil {
		t.Fatalf("a second reader beside a reader: %v", err)
	}
	if r1.GetMode() != coordinatorv1.LockMode_LOCK_MODE_SHARED || r2.GetToken() <= r1.GetToken() {
		t.Fatalf("readers: %v, %v", r1, r2)
	}
	for _, tok := range []int64{r1.GetToken(), r2.GetToken()} {
		if v := e.validate("rw", tok); !v.GetValid() {
			t.Fatalf("reader token %d: %v", tok, v)
		}
	}
	if _, err := e.lc.Acquire(ctxT(t, 10*time.Second), rwReq("rw", false, 0)); code(err) != codes.Aborted {
		t.Fatalf("a writer beside readers: %v, want ABORTED", err)
	}
	if _, err := e.lc.Acquire(ctxT(t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: "rw", Wait: dur(0)}); code(err) != codes.Aborted {
		t.Fatalf("a mutex acquisition beside readers: %v, want ABORTED", err)
	}
	w := e.acquireInBackground(rwReq("rw", false, -1), 1)
	// Only readers hold, but a writer waits: a new reader waits behind it.
	if _, err := e.lc.Acquire(ctxT(t, 10*time.Second), rwReq("rw", true, 300*time.Millisecond)); code(err) != codes.Aborted {
		t.Fatalf("a reader behind a waiting writer: %v, want ABORTED", err)
	}
	e.release("rw", r1.GetToken(), r1.GetHandle())
	select {
	case g := <-w:
		t.Fatalf("the writer was granted (token %d) while a reader held", g.GetToken())
	case <-time.After(200 * time.Millisecond):
	}
	e.release("rw", r2.GetToken(), r2.GetHandle())
	var wg *coordinatorv1.AcquireResponse
	select {
	case wg = <-w:
	case <-time.After(10 * time.Second):
		t.Fatal("the writer was not granted once the readers left")
	}
	if wg == nil {
		t.FailNow()
	}
	if _, err := e.lc.Acquire(ctxT(t, 10*time.Second), rwReq("rw", true, 0)); code(err) != codes.Aborted {
		t.Fatalf("a reader beside a writer: %v, want ABORTED", err)
	}
	if d := e.describe("rw"); len(d.GetHolders()) != 1 || d.GetHolders()[0].GetToken() != wg.GetToken() {
		t.Fatalf("describe: %v", d)
	}
}

// TestRWLockWriterNotStarved: readers that keep overlapping (each holds
// 30 ms, a new one arrives every few ms) cannot starve a writer: it is
// granted within a bounded wait, with no reader inside while it holds.
func TestRWLockWriterNotStarved(t *testing.T) {
	e := newEnv(t)
	var (
		readers atomic.Int32
		stop    atomic.Bool
		wg      sync.WaitGroup
	)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				g, err := e.lc.Acquire(ctxT(t, 30*time.Second), rwReq("rw", true, -1))
				if err != nil {
					t.Errorf("reader: %v", err)
					return
				}
				readers.Add(1)
				time.Sleep(30 * time.Millisecond)
				readers.Add(-1)
				if _, err := e.lc.Release(ctxT(t, 10*time.Second), &coordinatorv1.ReleaseRequest{Name: "rw", Token: g.GetToken(), Handle: g.GetHandle()}); err != nil {
					t.Errorf("reader release: %v", err)
					return
				}
			}
		}()
	}
	eventually(t, 10*time.Second, "readers overlap", func() bool { return readers.Load() >= 2 })
	g, err := e.lc.Acquire(ctxT(t, 30*time.Second), rwReq("rw", false, 10*time.Second))
	if err != nil {
		stop.Store(true)
		wg.Wait()
		t.Fatalf("the writer was starved: %v", err)
	}
	if n := readers.Load(); n != 0 {
		t.Errorf("%d readers inside while the writer holds", n)
	}
	time.Sleep(50 * time.Millisecond)
	if n := readers.Load(); n != 0 {
		t.Errorf("%d readers inside while the writer holds", n)
	}
	e.release("rw", g.GetToken(), g.GetHandle())
	stop.Store(true)
	wg.Wait()
}

// TestRWLockMarks: a writer's token raises a resource's mark; a reader's
// is refused FAILED_PRECONDITION (SHARED_HOLDER_CANNOT_FENCE), changing
// nothing, though it is valid without a resource.
func TestRWLockMarks(t *testing.T) {
	e := newEnv(t)
	w, err := e.lc.Acquire(ctxT(t, 10*time.Second), rwReq("rw", false, 0))
	if err != nil {
		t.Fatal(err)
	}
	v, err := e.lc.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: "rw", Token: w.GetToken(), Resource: "db"})
	if err != nil || !v.GetValid() {
		t.Fatalf("writer with a resource: %v, %v", v, err)
	}
	e.release("rw", w.GetToken(), w.GetHandle())
	r, err := e.lc.Acquire(ctxT(t, 10*time.Second), rwReq("rw", true, 0))
	if err != nil {
		t.Fatal(err)
	}
	if v := e.validate("rw", r.GetToken()); !v.GetValid() {
		t.Fatalf("reader without a resource: %v", v)
	}
	_, err = e.lc.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: "rw", Token: r.GetToken(), Resource: "db"})
	if code(err) != codes.FailedPrecondition || infoOf(err).GetReason() != "SHARED_HOLDER_CANNOT_FENCE" {
		t.Fatalf("reader with a resource: %v, want FAILED_PRECONDITION SHARED_HOLDER_CANNOT_FENCE", err)
	}
	m, err := coordinatorv1.NewFenceServiceClient(e.conn).GetMark(ctxT(t, 10*time.Second), &coordinatorv1.GetMarkRequest{Resource: "db"})
	if err != nil || m.GetMark().GetToken() != w.GetToken() {
		t.Fatalf("mark = %v, %v; want the writer's %d", m, err, w.GetToken())
	}
}
