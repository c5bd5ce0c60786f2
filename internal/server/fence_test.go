package server_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

const (
	current    = coordinatorv1.ValidateTokenResponse_REASON_CURRENT
	superseded = coordinatorv1.ValidateTokenResponse_REASON_SUPERSEDED
	notHeld    = coordinatorv1.ValidateTokenResponse_REASON_NOT_HELD
	fenced     = coordinatorv1.ValidateTokenResponse_REASON_FENCED
)

func (e *env) fc() coordinatorv1.FenceServiceClient {
	return coordinatorv1.NewFenceServiceClient(e.conn)
}

func (e *env) validateAt(name string, token int64, resource string) *coordinatorv1.ValidateTokenResponse {
	e.t.Helper()
	r, err := e.lc.ValidateToken(ctxT(e.t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: name, Token: token, Resource: resource})
	if err != nil {
		e.t.Fatalf("validate %q %d at %q: %v", name, token, resource, err)
	}
	return r
}

func (e *env) expectReason(name string, token int64, resource string, want coordinatorv1.ValidateTokenResponse_Reason) {
	e.t.Helper()
	r := e.validateAt(name, token, resource)
	if r.Reason != want || r.Valid != (want == current) {
		e.t.Fatalf("validate %q token %d at %q = %v valid=%v, want %v", name, token, resource, r.Reason, r.Valid, want)
	}
}

func (e *env) mark(resource string) int64 {
	e.t.Helper()
	r, err := e.fc().GetMark(ctxT(e.t, 10*time.Second), &coordinatorv1.GetMarkRequest{Resource: resource})
	if code(err) == codes.NotFound {
		return 0
	}
	if err != nil {
		e.t.Fatalf("GetMark %q: %v", resource, err)
	}
	return r.GetMark().GetToken()
}

// The "done" test: a token below the mark is refused after the lock
// has been released and re-acquired, and after a restart.
func TestTokenBelowMarkIsFencedForever(t *testing.T) {
	e := newEnv(t)
	const lock, res = "jobs/nightly", "bucket/reports"

	a := e.acquire(lock, 5*time.Second)
	e.expectReason(lock, a.Token, res, current)
	e.expectReason(lock, a.Token, res, current) // the same holder writes again
	if m := e.mark(res); m != a.Token {
		t.Fatalf("mark after A = %d, want %d", m, a.Token)
	}
	if !e.release(lock, a.Token, a.Handle) {
		t.Fatal("release A answered false")
	}

	b := e.acquire(lock, 5*time.Second)
	// B has not written yet: A is only superseded, not yet fenced.
	e.expectReason(lock, a.Token, res, superseded)
	e.expectReason(lock, b.Token, res, current)
	if m := e.mark(res); m != b.Token {
		t.Fatalf("mark after B = %d, want %d", m, b.Token)
	}
	e.expectReason(lock, a.Token, res, fenced)
	if !e.release(lock, b.Token, b.Handle) {
		t.Fatal("release B answered false")
	}
	// The lock is free: A is still fenced; B (at the mark) is merely not held.
	e.expectReason(lock, a.Token, res, fenced)
	e.expectReason(lock, b.Token, res, notHeld)

	c := e.acquire(lock, 5*time.Second)
	e.expectReason(lock, a.Token, res, fenced)
	e.expectReason(lock, b.Token, res, superseded)

	// Without a resource nothing is fenced: the lock-only answer.
	e.expectReason(lock, a.Token, "", superseded)
	// Marks are per resource: another resource never saw B.
	e.expectReason(lock, a.Token, "bucket/other", superseded)
	if m := e.mark("bucket/other"); m != 0 {
		t.Fatalf("a refused token set bucket/other's mark to %d", m)
	}

	// Marks survive a restart of etcd and the coordinator.
	e.restart()
	if m := e.mark(res); m != b.Token {
		t.Fatalf("mark after restart = %d, want %d", m, b.Token)
	}
	e.expectReason(lock, a.Token, res, fenced)
	e.expectReason(lock, c.Token, res, current)
	if m := e.mark(res); m != c.Token {
		t.Fatalf("mark after C = %d, want %d", m, c.Token)
	}
	e.expectReason(lock, b.Token, res, fenced)
}

// A refused token never moves a mark: a stale or unknown token above the
// mark is refused by the holder check, and the mark stays.
func TestRefusedTokenLeavesMark(t *testing.T) {
	e := newEnv(t)
	a := e.acquire("l", 5*time.Second)
	e.expectReason("l", a.Token, "r", current)
	e.expectReason("l", a.Token+1000, "r", notHeld)
	if m := e.mark("r"); m != a.Token {
		t.Fatalf("mark = %d after an unknown token, want %d", m, a.Token)
	}
	e.release("l", a.Token, a.Handle)
	e.expectReason("l", a.Token+1000, "r", notHeld)
	if m := e.mark("r"); m != a.Token {
		t.Fatalf("mark = %d after validating on a free lock, want %d", m, a.Token)
	}
}

// Linearizable marks: once a validation of token t returned valid, every
// validation that starts afterwards with a lower token is refused, while
// holders come and go concurrently.
func TestMarksNeverAcceptLowerTokenLater(t *testing.T) {
	e := newEnv(t)
	const lock, res = "churn", "shared"
	type call struct {
		start, end time.Time
		token      int64
		valid      bool
	}
	var (
		mu    sync.Mutex
		calls []call
		wg    sync.WaitGroup
	)
	validate := func(token int64) {
		start := time.Now()
		r, err := e.lc.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: lock, Token: token, Resource: res})
		if err != nil {
			t.Errorf("validate: %v", err)
			return
		}
		mu.Lock()
		calls = append(calls, call{start, time.Now(), token, r.Valid})
		mu.Unlock()
	}
	var tokens sync.Map // every token granted so far
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5 {
				r, err := e.lc.Acquire(ctxT(t, 30*time.Second), &coordinatorv1.AcquireRequest{Name: lock, Ttl: dur(10 * time.Second), Owner: fmt.Sprint(w, "-", i)})
				if err != nil {
					t.Errorf("acquire: %v", err)
					return
				}
				tokens.Store(r.Token, true)
				validate(r.Token)
				// Validate every earlier token too, as a stale writer would.
				tokens.Range(func(k, _ any) bool { validate(k.(int64)); return true })
				e.release(lock, r.Token, r.Handle)
			}
		}()
	}
	wg.Wait()
	accepted := 0
	for _, x := range calls {
		if !x.valid {
			continue
		}
		accepted++
		for _, y := range calls {
			if y.valid && y.start.After(x.end) && y.token < x.token {
				t.Fatalf("token %d accepted after token %d had been", y.token, x.token)
			}
		}
	}
	if accepted < 20 {
		t.Fatalf("only %d validations accepted; every holder should have been", accepted)
	}
}

func TestGetAndListMarks(t *testing.T) {
	e := newEnv(t)
	fc := e.fc()
	if _, err := fc.GetMark(ctxT(t, 10*time.Second), &coordinatorv1.GetMarkRequest{Resource: "none"}); code(err) != codes.NotFound {
		t.Fatalf("GetMark of a resource without mark: %v, want NOT_FOUND", err)
	}
	resources := []string{"db/a", "db/a/b", "db%2Fa", "db-a", "db", "other"}
	tokens := map[string]int64{}
	for _, r := range resources {
		g := e.acquire("lock-"+r, 5*time.Second)
		e.expectReason("lock-"+r, g.Token, r, current)
		tokens[r] = g.Token
	}
	before := time.Now()
	m, err := fc.GetMark(ctxT(t, 10*time.Second), &coordinatorv1.GetMarkRequest{Resource: "db/a"})
	if err != nil {
		t.Fatal(err)
	}
	if got := m.GetMark(); got.GetResource() != "db/a" || got.GetToken() != tokens["db/a"] || got.GetLock() != "lock-db/a" ||
		got.GetUpdatedAt().AsTime().After(before) || got.GetUpdatedAt().AsTime().IsZero() {
		t.Fatalf("GetMark(db/a) = %v", got)
	}

	list := func(prefix string, size int32) []string {
		var out []string
		tok := ""
		for {
			r, err := fc.ListMarks(ctxT(t, 10*time.Second), &coordinatorv1.ListMarksRequest{Prefix: prefix, PageSize: size, PageToken: tok})
			if err != nil {
				t.Fatalf("ListMarks(%q): %v", prefix, err)
			}
			for _, m := range r.Marks {
				if m.Token != tokens[m.Resource] {
					t.Fatalf("mark %q token %d, want %d", m.Resource, m.Token, tokens[m.Resource])
				}
				out = append(out, m.Resource)
			}
			if r.NextPageToken == "" {
				return out
			}
			if size > 0 && len(r.Marks) != int(size) {
				t.Fatalf("page of %d marks, want %d", len(r.Marks), size)
			}
			tok = r.NextPageToken
		}
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		// Escaped order: "db" < "db%252Fa" < "db%2Fa" < "db%2Fa%2Fb" < "db-a".
		{"", []string{"db", "db%2Fa", "db/a", "db/a/b", "db-a", "other"}},
		{"db/", []string{"db/a", "db/a/b"}},
		{"db/a", []string{"db/a", "db/a/b"}},
		{"db%", []string{"db%2Fa"}},
		{"x", nil},
	} {
		for _, size := range []int32{0, 1, 2} {
			if got := list(tc.prefix, size); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("ListMarks(%q, page %d) = %q, want %q", tc.prefix, size, got, tc.want)
			}
		}
	}
}

func TestFenceBadInputWritesNothing(t *testing.T) {
	e := newEnv(t)
	g := e.acquire("l", 5*time.Second)
	before := e.rev()
	for _, tc := range []struct {
		name  string
		call  func() error
		field string
	}{
		{"resource control char", func() error {
			_, err := e.lc.ValidateToken(ctxT(t, 5*time.Second), &coordinatorv1.ValidateTokenRequest{Name: "l", Token: g.Token, Resource: "a\nb"})
			return err
		}, "resource"},
		{"resource too long", func() error {
			_, err := e.lc.ValidateToken(ctxT(t, 5*time.Second), &coordinatorv1.ValidateTokenRequest{Name: "l", Token: g.Token, Resource: string(make([]byte, 513))})
			return err
		}, "resource"},
		{"GetMark empty", func() error {
			_, err := e.fc().GetMark(ctxT(t, 5*time.Second), &coordinatorv1.GetMarkRequest{})
			return err
		}, "resource"},
		{"ListMarks negative page", func() error {
			_, err := e.fc().ListMarks(ctxT(t, 5*time.Second), &coordinatorv1.ListMarksRequest{PageSize: -1})
			return err
		}, "page_size"},
		{"GetMark control char", func() error {
			_, err := e.fc().GetMark(ctxT(t, 5*time.Second), &coordinatorv1.GetMarkRequest{Resource: "a\x7fb"})
			return err
		}, "resource"},
		{"ListMarks prefix control char", func() error {
			_, err := e.fc().ListMarks(ctxT(t, 5*time.Second), &coordinatorv1.ListMarksRequest{Prefix: "a\tb"})
			return err
		}, "prefix"},
		{"DeleteMark empty", func() error {
			_, err := e.fc().DeleteMark(ctxT(t, 5*time.Second), &coordinatorv1.DeleteMarkRequest{})
			return err
		}, "resource"},
		{"DeleteMark control char", func() error {
			_, err := e.fc().DeleteMark(ctxT(t, 5*time.Second), &coordinatorv1.DeleteMarkRequest{Resource: "a\x00b"})
			return err
		}, "resource"},
		{"RebindMark resource control char", func() error {
			_, err := e.fc().RebindMark(ctxT(t, 5*time.Second), &coordinatorv1.RebindMarkRequest{Resource: "a\x1bb", Lock: "l"})
			return err
		}, "resource"},
		{"RebindMark lock control char", func() error {
			_, err := e.fc().RebindMark(ctxT(t, 5*time.Second), &coordinatorv1.RebindMarkRequest{Resource: "r", Lock: "l\r\n"})
			return err
		}, "lock"},
		{"RebindMark lock empty", func() error {
			_, err := e.fc().RebindMark(ctxT(t, 5*time.Second), &coordinatorv1.RebindMarkRequest{Resource: "r"})
			return err
		}, "lock"},
		{"RebindMark lock too long", func() error {
			_, err := e.fc().RebindMark(ctxT(t, 5*time.Second), &coordinatorv1.RebindMarkRequest{Resource: "r", Lock: string(make([]byte, 513))})
			return err
		}, "lock"},
		{"ListMarks bad token", func() error {
			_, err := e.fc().ListMarks(ctxT(t, 5*time.Second), &coordinatorv1.ListMarksRequest{PageToken: "!!"})
			return err
		}, "page_token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if code(err) != codes.InvalidArgument || fieldOf(err) != tc.field {
				t.Fatalf("%v (field %q), want INVALID_ARGUMENT on %q", err, fieldOf(err), tc.field)
			}
		})
	}
	if after := e.rev(); after != before {
		t.Fatalf("bad input wrote to etcd: revision %d -> %d", before, after)
	}
	r, err := e.cli.Get(ctxT(t, 5*time.Second), "/test/fence/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || r.Count != 0 {
		t.Fatalf("marks in etcd after bad input: %v, %v", r.Count, err)
	}
}
