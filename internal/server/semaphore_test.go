package server_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// semReq is an Acquire of a semaphore of limit n.
func semReq(name string, n int32, ttl time.Duration) *coordinatorv1.AcquireRequest {
	return &coordinatorv1.AcquireRequest{Name: name, Limit: n, Ttl: dur(ttl)}
}

// infoOf is the ErrorInfo of err (nil if none).
func infoOf(err error) *errdetails.ErrorInfo {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

// TestSemaphoreAdmitsExactlyN: 64 clients on two replicas contend for a
// semaphore of 3: a shared counter of holders inside never exceeds 3 (and
// reaches it), each grant's slot is in 0..2 and held by nobody else, tokens
// rise per slot, and no queue key is left behind.
func TestSemaphoreAdmitsExactlyN(t *testing.T) {
	e := newEnv(t)
	r := e.replica()
	const n, clients, rounds = 3, 64, 2
	var (
		mu       sync.Mutex
		inside   int
		most     int
		slots    [n]int64 // token of the slot's holder inside, 0: free
		last     [n]int64 // the slot's latest token
		failures []string
		wg       sync.WaitGroup
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	for c := range clients {
		lc := e.lc
		if c%2 == 1 {
			lc = r.lc
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				g, err := lc.Acquire(ctxT(t, 60*time.Second), semReq("pool", n, 10*time.Second))
				if err != nil {
					fail("acquire: %v", err)
					return
				}
				mu.Lock()
				inside++
				most = max(most, inside)
				s := g.GetSlot()
				switch {
				case inside > n:
					failures = append(failures, fmt.Sprintf("%d holders inside", inside))
				case s < 0 || s >= n:
					failures = append(failures, fmt.Sprintf("slot %d out of range", s))
				case slots[s] != 0:
					failures = append(failures, fmt.Sprintf("slot %d granted to %d while %d holds it", s, g.GetToken(), slots[s]))
				case g.GetToken() <= last[s]:
					failures = append(failures, fmt.Sprintf("slot %d: token %d not above its previous holder's %d", s, g.GetToken(), last[s]))
				default:
					slots[s], last[s] = g.GetToken(), g.GetToken()
				}
				mu.Unlock()
				time.Sleep(20 * time.Millisecond) // long enough for the next hand-offs to overlap it
				mu.Lock()
				inside--
				if s >= 0 && s < n && slots[s] == g.GetToken() {
					slots[s] = 0
				}
				mu.Unlock()
				if _, err := lc.Release(ctxT(t, 10*time.Second), &coordinatorv1.ReleaseRequest{Name: "pool", Token: g.GetToken(), Handle: g.GetHandle()}); err != nil {
					fail("release: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	for _, f := range failures {
		t.Error(f)
	}
	if most != n {
		t.Errorf("at most %d holders were inside at once, want %d", most, n)
	}
	if k := e.queueKeys("pool"); k != 0 {
		t.Errorf("%d queue keys left behind", k)
	}
}

// acquireInBackground starts an Acquire and returns its outcome channel,
// once the acquisition is queued (waiters reached want).
func (e *env) acquireInBackground(req *coordinatorv1.AcquireRequest, wantWaiters int) <-chan *coordinatorv1.AcquireResponse {
	e.t.Helper()
	ch := make(chan *coordinatorv1.AcquireResponse, 1)
	go func() {
		g, err := e.lc.Acquire(ctxT(e.t, 30*time.Second), req)
		if err != nil {
			e.t.Errorf("acquire %s: %v", req.GetOwner(), err)
			close(ch)
			return
		}
		ch <- g
	}()
	eventually(e.t, 10*time.Second, fmt.Sprintf("%s queued", req.GetOwner()), func() bool {
		return len(e.describe(req.GetName()).GetWaiters()) == wantWaiters
	})
	return ch
}

// TestSemaphoreFIFOAndHandOver: with both permits of 2 held, three waiters
// are granted in the order they queued, each within moments of a release
// (a timing bound outside the race detector only), the freed slot passing
// on with a greater token.
func TestSemaphoreFIFOAndHandOver(t *testing.T) {
	e := newEnv(t)
	a, err := e.lc.Acquire(ctxT(t, 10*time.Second), semReq("sem", 2, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.lc.Acquire(ctxT(t, 10*time.Second), semReq("sem", 2, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if a.GetSlot() == b.GetSlot() {
		t.Fatalf("both holders have slot %d", a.GetSlot())
	}
	var waiters []<-chan *coordinatorv1.AcquireResponse
	for i := range 3 {
		req := semReq("sem", 2, 30*time.Second)
		req.Owner = fmt.Sprint("w", i)
		waiters = append(waiters, e.acquireInBackground(req, i+1))
	}
	held := []*coordinatorv1.AcquireResponse{a, b}
	for i, w := range waiters {
		gone := held[0]
		held = held[1:]
		start := time.Now()
		if !e.release("sem", gone.GetToken(), gone.GetHandle()) {
			t.Fatal("release answered false")
		}
		var g *coordinatorv1.AcquireResponse
		select {
		case g = <-w:
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter %d not granted after a release", i)
		}
		if g == nil {
			t.FailNow()
		}
		took := time.Since(start)
		if !raceEnabled && took > time.Second {
			t.Errorf("waiter %d granted %v after the release", i, took)
		}
		t.Logf("waiter %d granted %v after the release call began", i, took)
		if g.GetSlot() != gone.GetSlot() || g.GetToken() <= gone.GetToken() {
			t.Errorf("waiter %d got slot %d token %d; the freed slot was %d with token %d", i, g.GetSlot(), g.GetToken(), gone.GetSlot(), gone.GetToken())
		}
		for j, later := range waiters[i+1:] {
			select {
			case g := <-later:
				t.Fatalf("waiter %d granted (token %d) before waiter %d", i+1+j, g.GetToken(), i)
			default:
			}
		}
		held = append(held, g)
	}
}

// TestSemaphoreExpiryHandsOver: a permit whose lease ends (nobody renews
// it) passes to the waiter, its slot with it; the other permit is untouched.
func TestSemaphoreExpiryHandsOver(t *testing.T) {
	e := newEnv(t)
	short, err := e.lc.Acquire(ctxT(t, 10*time.Second), semReq("sem", 2, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	long, err := e.lc.Acquire(ctxT(t, 10*time.Second), semReq("sem", 2, 60*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	w := e.acquireInBackground(semReq("sem", 2, 30*time.Second), 1)
	var g *coordinatorv1.AcquireResponse
	select {
	case g = <-w:
	case <-time.After(15 * time.Second):
		t.Fatal("the waiter was not granted after a permit expired")
	}
	if g == nil {
		t.FailNow()
	}
	if g.GetSlot() != short.GetSlot() || g.GetToken() <= short.GetToken() {
		t.Errorf("granted slot %d token %d; the expired permit was slot %d token %d", g.GetSlot(), g.GetToken(), short.GetSlot(), short.GetToken())
	}
	for _, c := range []struct {
		tok   int64
		valid bool
	}{{short.GetToken(), false}, {long.GetToken(), true}, {g.GetToken(), true}} {
		if v := e.validate("sem", c.tok); v.GetValid() != c.valid {
			t.Errorf("token %d: valid = %v (%v), want %v", c.tok, v.GetValid(), v.GetReason(), c.valid)
		}
	}
}

// TestSemaphoreLimitMismatch: every acquisition of a name must ask for
// the queue's limit; another is refused FAILED_PRECONDITION naming the
// limit in force, and its entry is withdrawn.
func TestSemaphoreLimitMismatch(t *testing.T) {
	e := newEnv(t)
	if _, err := e.lc.Acquire(ctxT(t, 10*time.Second), semReq("sem3", 3, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.lc.Acquire(ctxT(t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: "mutex", Ttl: dur(30 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		req     *coordinatorv1.AcquireRequest
		inForce string
	}{
		{"other limit", semReq("sem3", 2, 10*time.Second), "3"},
		{"a mutex", &coordinatorv1.AcquireRequest{Name: "sem3", Ttl: dur(10 * time.Second)}, "3"},
		{"limit 1", semReq("sem3", 1, 10*time.Second), "3"},
		{"a reader", &coordinatorv1.AcquireRequest{Name: "sem3", Ttl: dur(10 * time.Second), Mode: coordinatorv1.LockMode_LOCK_MODE_SHARED}, "3"},
		{"a semaphore on a mutex", semReq("mutex", 3, 10*time.Second), "1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := e.queueKeys(c.req.GetName())
			_, err := e.lc.Acquire(ctxT(t, 10*time.Second), c.req)
			info := infoOf(err)
			if code(err) != codes.FailedPrecondition || info.GetReason() != "LIMIT_MISMATCH" || info.GetMetadata()["limitInForce"] != c.inForce {
				t.Fatalf("err = %v (%v), want FAILED_PRECONDITION LIMIT_MISMATCH with limitInForce %s", err, info, c.inForce)
			}
			if after := e.queueKeys(c.req.GetName()); after != before {
				t.Errorf("queue keys %d -> %d: the refused entry stayed", before, after)
			}
		})
	}
}

// TestSemaphoreBadInput: limits and modes no queue has are refused,
// naming the field, with nothing written.
func TestSemaphoreBadInput(t *testing.T) {
	e := newEnv(t)
	shared := coordinatorv1.LockMode_LOCK_MODE_SHARED
	for _, c := range []struct {
		name  string
		req   *coordinatorv1.AcquireRequest
		field string
	}{
		{"negative limit", &coordinatorv1.AcquireRequest{Name: "x", Limit: -1}, "limit"},
		{"limit too large", &coordinatorv1.AcquireRequest{Name: "x", Limit: 1001}, "limit"},
		{"limit with shared", &coordinatorv1.AcquireRequest{Name: "x", Limit: 3, Mode: shared}, "mode"},
		{"limit with exclusive", &coordinatorv1.AcquireRequest{Name: "x", Limit: 3, Mode: coordinatorv1.LockMode_LOCK_MODE_EXCLUSIVE}, "mode"},
		{"unknown mode", &coordinatorv1.AcquireRequest{Name: "x", Mode: 7}, "mode"},
		{"shared with lock delay", &coordinatorv1.AcquireRequest{Name: "x", Mode: shared, LockDelay: dur(time.Second)}, "lock_delay"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.lc.Acquire(ctxT(t, 10*time.Second), c.req)
			if code(err) != codes.InvalidArgument || fieldOf(err) != c.field {
				t.Fatalf("err = %v (field %q), want INVALID_ARGUMENT naming %q", err, fieldOf(err), c.field)
			}
			if k := e.queueKeys("x"); k != 0 {
				t.Fatalf("%d queue keys written", k)
			}
		})
	}
}

// TestSemaphoreSlotMarks: every permit's token is valid and a released
// one is not; validated with a resource, each raises the mark of its own
// slot, and a paused former holder of slot k (its lease ended, slot k
// passed on and its new holder validated) is refused while the holder of
// the other slot still passes.
func TestSemaphoreSlotMarks(t *testing.T) {
	e := newEnv(t)
	paused, err := e.lc.Acquire(ctxT(t, 10*time.Second), semReq("sem", 2, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	other, err := e.lc.Acquire(ctxT(t, 10*time.Second), semReq("sem", 2, 60*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	withResource := func(tok int64) (*coordinatorv1.ValidateTokenResponse, error) {
		return e.lc.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: "sem", Token: tok, Resource: "db"})
	}
	for _, g := range []*coordinatorv1.AcquireResponse{paused, other} {
		if v, err := withResource(g.GetToken()); err != nil || !v.GetValid() {
			t.Fatalf("holder of slot %d (token %d): %v, %v", g.GetSlot(), g.GetToken(), v, err)
		}
	}
	// The paused holder stops renewing: its slot passes on.
	next, err := e.lc.Acquire(ctxT(t, 20*time.Second), semReq("sem", 2, 60*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if next.GetSlot() != paused.GetSlot() || next.GetToken() <= paused.GetToken() {
		t.Fatalf("next holder has slot %d token %d; the paused one had slot %d token %d", next.GetSlot(), next.GetToken(), paused.GetSlot(), paused.GetToken())
	}
	if v, err := withResource(next.GetToken()); err != nil || !v.GetValid() {
		t.Fatalf("the slot's new holder: %v, %v", v, err)
	}
	if v, err := withResource(paused.GetToken()); err != nil || v.GetValid() {
		t.Fatalf("the paused former holder of slot %d: %v, %v; want refused", paused.GetSlot(), v, err)
	}
	if v, err := withResource(other.GetToken()); err != nil || !v.GetValid() {
		t.Fatalf("the other slot's holder, below the new holder's token: %v, %v; want valid (its slot's mark is its own)", v, err)
	}
	if !e.release("sem", other.GetToken(), other.GetHandle()) {
		t.Fatal("release answered false")
	}
	if v := e.validate("sem", other.GetToken()); v.GetValid() {
		t.Fatalf("a released permit's token is valid: %v", v)
	}
	if v := e.validate("sem", next.GetToken()); !v.GetValid() {
		t.Fatalf("a live permit's token is not valid: %v", v)
	}
	slots := e.mgr.Keyspace().Marks() + "db/"
	if e.sharded() {
		slots = "/test/shards/marks/db/slot/"
	}
	if n := e.countKeys(slots); n != 2 {
		t.Errorf("%d slot marks of the resource, want 2", n)
	}
}

// TestSemaphoreSlotMarksAreReachable: the marks a semaphore's holders raise,
// one per (resource, slot), are listed under their resource with their slot
// (they used to be listed as resources "db/0" and "db/1" that GetMark could
// not find), and GetMark, RebindMark and DeleteMark reach each by its slot,
// apart from the resource's own mark.
func TestSemaphoreSlotMarksAreReachable(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 30*time.Second)
	tokens := map[int32]int64{}
	for range 2 {
		g, err := e.lc.Acquire(ctx, semReq("sem", 2, time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		tokens[g.GetSlot()] = g.GetToken()
		if v := e.validateAt("sem", g.GetToken(), "db"); !v.GetValid() {
			t.Fatalf("slot %d: %v", g.GetSlot(), v)
		}
	}
	mutex := e.acquire("mutex", time.Minute)
	// The queue core lets a mutex own db's plain mark beside the
	// semaphore's slot marks; the shard core keeps one owner per resource
	// across its plain and slot marks (issue 26, item 3) and refuses it.
	plain := !e.sharded()
	if plain {
		if v := e.validateAt("mutex", mutex.GetToken(), "db"); !v.GetValid() {
			t.Fatalf("the mutex's token against db: %v", v)
		}
	} else if v, err := e.lc.ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: "mutex", Token: mutex.GetToken(), Resource: "db"}); reasonOf(err) != "MARK_OWNED_BY_OTHER_LOCK" {
		t.Fatalf("the mutex's token against the semaphore's db: %v, %v; want MARK_OWNED_BY_OTHER_LOCK", v, err)
	}
	slot := wrapperspb.Int32

	list, err := e.fc().ListMarks(ctx, &coordinatorv1.ListMarksRequest{Prefix: "db"})
	if err != nil {
		t.Fatal(err)
	}
	type listed struct {
		resource, lock string
		slot           int32 // -1: the resource's own mark
		token          int64
	}
	var got []listed
	for _, m := range list.GetMarks() {
		l := listed{m.GetResource(), m.GetLock(), -1, m.GetToken()}
		if m.Slot != nil {
			l.slot = m.GetSlot().GetValue()
		}
		got = append(got, l)
	}
	want := []listed{{"db", "sem", 0, tokens[0]}, {"db", "sem", 1, tokens[1]}}
	if plain {
		want = append([]listed{{"db", "mutex", -1, mutex.GetToken()}}, want...)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("ListMarks: %v, want %v", got, want)
	}

	for k := range int32(2) {
		m, err := e.fc().GetMark(ctx, &coordinatorv1.GetMarkRequest{Resource: "db", Slot: slot(k)})
		if err != nil || m.GetMark().GetToken() != tokens[k] || m.GetMark().GetSlot().GetValue() != k || m.GetMark().GetLock() != "sem" {
			t.Fatalf("GetMark db slot %d: %v, %v; want token %d", k, m, err, tokens[k])
		}
	}
	if m, err := e.fc().GetMark(ctx, &coordinatorv1.GetMarkRequest{Resource: "db"}); plain && (err != nil || m.GetMark().GetToken() != mutex.GetToken() || m.GetMark().Slot != nil) {
		t.Fatalf("GetMark db: %v, %v; want the mutex's mark", m, err)
	} else if !plain && code(err) != codes.NotFound {
		t.Fatalf("GetMark db: %v, %v; want NOT_FOUND (the semaphore's binding is no mark)", m, err)
	}
	if _, err := e.fc().GetMark(ctx, &coordinatorv1.GetMarkRequest{Resource: "db", Slot: slot(2)}); code(err) != codes.NotFound {
		t.Fatalf("GetMark of a slot without a mark: %v, want NOT_FOUND", err)
	}
	rev := e.rev()
	for _, call := range []func() error{
		func() error {
			_, err := e.fc().GetMark(ctx, &coordinatorv1.GetMarkRequest{Resource: "db", Slot: slot(-1)})
			return err
		},
		func() error {
			_, err := e.fc().DeleteMark(ctx, &coordinatorv1.DeleteMarkRequest{Resource: "db", Slot: slot(-1)})
			return err
		},
		func() error {
			_, err := e.fc().RebindMark(ctx, &coordinatorv1.RebindMarkRequest{Resource: "db", Lock: "x", Slot: slot(-1)})
			return err
		},
	} {
		if err := call(); code(err) != codes.InvalidArgument || fieldOf(err) != "slot" {
			t.Fatalf("a negative slot: %v (field %q), want INVALID_ARGUMENT on slot", err, fieldOf(err))
		}
	}
	if e.rev() != rev {
		t.Fatal("a refused call wrote to etcd")
	}

	// Rebinding slot 1's mark moves that mark only.
	if r, err := e.fc().RebindMark(ctx, &coordinatorv1.RebindMarkRequest{Resource: "db", Lock: "other", Slot: slot(1)}); err != nil || r.GetMark().GetLock() != "other" || r.GetMark().GetSlot().GetValue() != 1 {
		t.Fatalf("RebindMark db slot 1: %v, %v", r, err)
	}
	if v, err := e.lc.ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: "sem", Token: tokens[1], Resource: "db"}); reasonOf(err) != "MARK_OWNED_BY_OTHER_LOCK" {
		t.Fatalf("slot 1's holder after its mark was rebound: %v, %v; want MARK_OWNED_BY_OTHER_LOCK", v, err)
	}
	if v := e.validateAt("sem", tokens[0], "db"); !v.GetValid() {
		t.Fatalf("slot 0's holder after slot 1's rebind: %v", v)
	}
	// Deleting slot 0's mark deletes that mark only.
	if r, err := e.fc().DeleteMark(ctx, &coordinatorv1.DeleteMarkRequest{Resource: "db", Slot: slot(0)}); err != nil || r.GetMark().GetToken() != tokens[0] || r.GetMark().GetSlot().GetValue() != 0 {
		t.Fatalf("DeleteMark db slot 0: %v, %v", r, err)
	}
	if _, err := e.fc().GetMark(ctx, &coordinatorv1.GetMarkRequest{Resource: "db", Slot: slot(0)}); code(err) != codes.NotFound {
		t.Fatalf("GetMark of the deleted slot mark: %v, want NOT_FOUND", err)
	}
	left := []*coordinatorv1.GetMarkRequest{{Resource: "db", Slot: slot(1)}}
	if plain {
		left = append(left, &coordinatorv1.GetMarkRequest{Resource: "db"})
	}
	for _, r := range left {
		if _, err := e.fc().GetMark(ctx, r); err != nil {
			t.Fatalf("GetMark %v after slot 0's deletion: %v", r, err)
		}
	}
}
