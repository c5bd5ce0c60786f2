package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// Relaying a Hold stream to its shard's owner (forwardhold.go): members
// and a relay of one shard-core cluster (forward_test.go's helpers).

// holdOpen opens a Hold through lc with first and returns the stream and
// its grant, or the error the stream ended with instead.
func holdOpen(ctx context.Context, lc coordinatorv1.LockServiceClient, first *coordinatorv1.HoldRequest) (holdStream, *coordinatorv1.AcquireResponse, error) {
	st, err := lc.Hold(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := st.Send(first); err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, err
	}
	r, err := st.Recv()
	if err != nil {
		return nil, nil, err
	}
	if r.GetGranted() == nil {
		return nil, nil, fmt.Errorf("the first event is %v, want granted", r)
	}
	return st, r.GetGranted(), nil
}

func holdResume(name string, g *coordinatorv1.AcquireResponse) *coordinatorv1.HoldRequest {
	return &coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Resume{Resume: &coordinatorv1.HoldResume{
		Name: name, Token: g.GetToken(), Handle: g.GetHandle()}}}
}

// retryDelay is the RetryInfo delay of err, 0 if none.
func retryDelay(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// A Hold opened on a replica that does not own the name's shard (a member,
// a relay) is relayed to the owner: granted there, renewed by the client's
// heartbeats past several TTLs, released by the client's release; a
// half-close ends the stream and keeps the grant; a client gone releases
// the grant if it asked to.
func TestForwardHoldGrantsRenewsAndReleasesOnTheOwner(t *testing.T) {
	e := startEtcdForShards(t)
	a := startReplica(t, e, "/t/", "a", false)
	b := startReplica(t, e, "/t/", "b", false)
	relay := startReplica(t, e, "/t/", "relay", true)
	waitSplit(t, []*fwdReplica{a, b}, relay)

	for _, tc := range []struct {
		what string
		via  *fwdReplica
	}{
		{"through a member", a},
		{"through a relay", relay},
	} {
		t.Run(tc.what, func(t *testing.T) {
			names := namesOn(t, b, "jobs/"+tc.via.id+"/", 3)
			const ttl = 2 * time.Second
			st, g, err := holdOpen(ctxT(t, 30*time.Second), tc.via.lc, holdAcquire(names[0], ttl, false))
			if err != nil {
				t.Fatalf("Hold of %s through %s: %v", names[0], tc.via.id, err)
			}
			if g.GetToken() <= 0 || g.GetHandle() == "" || g.GetResumed() {
				t.Fatalf("granted %v", g)
			}
			if d, err := b.lc.Describe(ctxT(t, 5*time.Second), &coordinatorv1.DescribeRequest{Name: names[0]}); err != nil || d.GetHolder().GetToken() != g.GetToken() {
				t.Fatalf("describe on the owner = %v, %v; want the relayed stream's grant %d", d, err, g.GetToken())
			}
			for range 12 { // 4.8s: more than twice the TTL
				time.Sleep(ttl / 5)
				if err := st.Send(heartbeat); err != nil {
					t.Fatal(err)
				}
				if r, err := st.Recv(); err != nil || r.GetRenewed() == nil {
					t.Fatalf("heartbeat answered %v, %v; want renewed", r, err)
				}
			}
			if v, err := b.lc.ValidateToken(ctxT(t, 5*time.Second), &coordinatorv1.ValidateTokenRequest{Name: names[0], Token: g.GetToken()}); err != nil || !v.GetValid() {
				t.Fatalf("validate after two TTLs of heartbeats = %v, %v; want valid", v, err)
			}
			if err := st.Send(holdRelease); err != nil {
				t.Fatal(err)
			}
			if r, err := st.Recv(); err != nil || !r.GetReleased().GetReleased() {
				t.Fatalf("release answered %v, %v; want released", r, err)
			}
			if _, err := st.Recv(); !errors.Is(err, io.EOF) {
				t.Fatalf("after the release the stream ended with %v, want a clean end", err)
			}
			if d, err := b.lc.Describe(ctxT(t, 5*time.Second), &coordinatorv1.DescribeRequest{Name: names[0]}); err != nil || len(d.GetHolders()) != 0 {
				t.Fatalf("describe on the owner after the release = %v, %v; want no holder", d, err)
			}

			// A half-close ends the stream cleanly; the grant stays.
			st, g, err = holdOpen(ctxT(t, 10*time.Second), tc.via.lc, holdAcquire(names[1], 10*time.Second, false))
			if err != nil {
				t.Fatal(err)
			}
			if err := st.CloseSend(); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Recv(); !errors.Is(err, io.EOF) {
				t.Fatalf("after a half-close the stream ended with %v, want a clean end", err)
			}
			if v, err := b.lc.ValidateToken(ctxT(t, 5*time.Second), &coordinatorv1.ValidateTokenRequest{Name: names[1], Token: g.GetToken()}); err != nil || !v.GetValid() {
				t.Fatalf("validate after a half-close = %v, %v; want valid (no release asked)", v, err)
			}

			// A client gone, with release_on_disconnect: the owner releases.
			ctx, cancel := context.WithCancel(ctxT(t, 10*time.Second))
			if _, _, err = holdOpen(ctx, tc.via.lc, holdAcquire(names[2], 10*time.Second, true)); err != nil {
				t.Fatal(err)
			}
			cancel()
			eventually(t, 10*time.Second, "the owner releases the grant of a client gone", func() bool {
				d, err := b.lc.Describe(ctxT(t, 5*time.Second), &coordinatorv1.DescribeRequest{Name: names[2]})
				return err == nil && len(d.GetHolders()) == 0
			})
		})
	}
}

// With authentication and the member secret, the relayed Hold is the
// caller's on the owner: alice's grant is visible there, she can renew it,
// and bob can neither renew nor resume it (through either member).
func TestForwardHoldCarriesTheCallersIdentity(t *testing.T) {
	e := startEtcdForShards(t)
	a := startReplica(t, e, "/t/", "a", false, authFor(t, fwdSecret)...)
	b := startReplica(t, e, "/t/", "b", false, authFor(t, fwdSecret)...)
	waitSplit(t, []*fwdReplica{a, b})
	ctx := ctxT(t, 30*time.Second)
	name := namesOn(t, b, "jobs/", 1)[0]

	st, g, err := holdOpen(as(ctx, "alice"), a.lc, holdAcquire(name, 10*time.Second, false))
	if err != nil {
		t.Fatalf("alice's Hold of %s through A: %v", name, err)
	}
	for _, r := range []*fwdReplica{a, b} {
		if d, err := r.lc.Describe(as(ctx, "alice"), &coordinatorv1.DescribeRequest{Name: name}); err != nil || d.GetHolder().GetToken() != g.GetToken() {
			t.Fatalf("describe through %s = %v, %v; want alice's grant %d", r.id, d, err, g.GetToken())
		}
		_, err := r.lc.KeepAlive(as(ctx, "bob"), &coordinatorv1.KeepAliveRequest{Name: name, Token: g.GetToken(), Handle: g.GetHandle()})
		if code(err) != codes.NotFound || reasonOf(err) != "NOT_HELD" {
			t.Fatalf("bob renews alice's grant through %s = %v, want NOT_FOUND NOT_HELD", r.id, err)
		}
		_, _, err = holdOpen(as(ctx, "bob"), r.lc, holdResume(name, g))
		if code(err) != codes.NotFound || reasonOf(err) != "NOT_HELD" {
			t.Fatalf("bob resumes alice's grant through %s = %v, want NOT_FOUND NOT_HELD", r.id, err)
		}
	}
	if _, err := b.lc.KeepAlive(as(ctx, "alice"), &coordinatorv1.KeepAliveRequest{Name: name, Token: g.GetToken(), Handle: g.GetHandle()}); err != nil {
		t.Fatalf("alice renews her grant on the owner: %v", err)
	}
	if err := st.Send(holdRelease); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Recv(); err != nil || !r.GetReleased().GetReleased() {
		t.Fatalf("alice's release answered %v, %v; want released", r, err)
	}
}

// Without a member secret the identity of an authenticated caller cannot
// cross the hop: its Hold on another member's shard is not relayed, and
// answers SHARD_NOT_SERVED naming the owner, as a unary call does.
func TestForwardHoldWithoutMemberSecretIsNotRelayed(t *testing.T) {
	e := startEtcdForShards(t)
	a := startReplica(t, e, "/t/", "a", false, authFor(t, nil)...)
	b := startReplica(t, e, "/t/", "b", false, authFor(t, nil)...)
	waitSplit(t, []*fwdReplica{a, b})
	name := namesOn(t, b, "jobs/", 1)[0]
	_, _, err := holdOpen(as(ctxT(t, 10*time.Second), "alice"), a.lc, holdAcquire(name, 10*time.Second, false))
	if code(err) != codes.Unavailable || reasonOf(err) != "SHARD_NOT_SERVED" || infoOf(err).GetMetadata()["owner"] != "b" {
		t.Fatalf("alice's Hold on B's shard through A = %v, want UNAVAILABLE SHARD_NOT_SERVED naming b", err)
	}
}

// A Hold the owner refuses is refused alike through another member: the
// same code, reason and ErrorInfo metadata as on the owner, whether the
// refusal answers the first message or a later one.
func TestForwardHoldRefusalsAreTheOwners(t *testing.T) {
	e := startEtcdForShards(t)
	a := startReplica(t, e, "/t/", "a", false)
	b := startReplica(t, e, "/t/", "b", false)
	waitSplit(t, []*fwdReplica{a, b})
	ctx := ctxT(t, 60*time.Second)
	names := namesOn(t, b, "jobs/", 3)
	held := names[0]
	free := map[string]string{"b": names[1], "a": names[2]} // a name of its own for each way
	g, err := b.lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: held, Ttl: dur(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	acquire := func(r *coordinatorv1.AcquireRequest) func(string) *coordinatorv1.HoldRequest {
		return func(string) *coordinatorv1.HoldRequest {
			return &coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Acquire{Acquire: &coordinatorv1.HoldAcquire{Request: r}}}
		}
	}
	always := func(m *coordinatorv1.HoldRequest) func(string) *coordinatorv1.HoldRequest {
		return func(string) *coordinatorv1.HoldRequest { return m }
	}
	for _, tc := range []struct {
		what   string
		first  func(via string) *coordinatorv1.HoldRequest
		then   *coordinatorv1.HoldRequest // sent after the grant, if set
		code   codes.Code
		reason string
	}{
		{"try-lock while another holds", acquire(&coordinatorv1.AcquireRequest{Name: held, Ttl: dur(10 * time.Second), Wait: dur(0)}), nil,
			codes.Aborted, "LOCK_HELD"},
		{"a semaphore's limit on a held mutex", acquire(&coordinatorv1.AcquireRequest{Name: held, Limit: 2, Ttl: dur(10 * time.Second), Wait: dur(0)}), nil,
			codes.FailedPrecondition, "LIMIT_MISMATCH"},
		{"resume with a wrong handle", always(holdResume(held, &coordinatorv1.AcquireResponse{Token: g.GetToken(), Handle: "x" + g.GetHandle()})), nil,
			codes.NotFound, "NOT_HELD"},
		{"resume of a token never granted", always(holdResume(held, &coordinatorv1.AcquireResponse{Token: g.GetToken() + 1000, Handle: g.GetHandle()})), nil,
			codes.NotFound, "NOT_HELD"},
		{"a heartbeat first", always(heartbeat), nil, codes.InvalidArgument, "INVALID_FIELD"},
		{"an acquire after the grant", func(via string) *coordinatorv1.HoldRequest { return holdAcquire(free[via], 10*time.Second, false) },
			holdAcquire(held, 10*time.Second, false), codes.InvalidArgument, "INVALID_FIELD"},
	} {
		t.Run(tc.what, func(t *testing.T) {
			errs := map[string]error{}
			for _, r := range []*fwdReplica{b, a} { // on the owner, then through A
				st, _, err := holdOpen(ctxT(t, 10*time.Second), r.lc, tc.first(r.id))
				if tc.then != nil {
					if err != nil {
						t.Fatalf("through %s: %v", r.id, err)
					}
					if err := st.Send(tc.then); err != nil && !errors.Is(err, io.EOF) {
						t.Fatal(err)
					}
					_, err = st.Recv()
				}
				if code(err) != tc.code || reasonOf(err) != tc.reason {
					t.Fatalf("through %s: %v, want %v %s", r.id, err, tc.code, tc.reason)
				}
				errs[r.id] = err
			}
			owner, relayed := infoOf(errs["b"]).GetMetadata(), infoOf(errs["a"]).GetMetadata()
			if !maps.Equal(owner, relayed) {
				t.Fatalf("ErrorInfo metadata through A %v, on the owner %v", relayed, owner)
			}
			if tc.reason == "LOCK_HELD" && relayed["holderToken"] != fmt.Sprint(g.GetToken()) {
				t.Fatalf("LOCK_HELD through A names the holder token %q, want %d", relayed["holderToken"], g.GetToken())
			}
		})
	}
}

// A relayed Hold is never relayed again: a member that does not own the
// name's shard answers it SHARD_NOT_SERVED at once, naming the owner.
func TestForwardedHoldIsNotForwardedAgain(t *testing.T) {
	e := startEtcdForShards(t)
	a := startReplica(t, e, "/t/", "a", false)
	b := startReplica(t, e, "/t/", "b", false)
	waitSplit(t, []*fwdReplica{a, b})
	name := namesOn(t, a, "jobs/", 1)[0]
	ctx := metadata.AppendToOutgoingContext(ctxT(t, 10*time.Second), "coordinatord-forwarded", "1")
	start := time.Now()
	_, _, err := holdOpen(ctx, b.lc, holdAcquire(name, 10*time.Second, false))
	if code(err) != codes.Unavailable || reasonOf(err) != "SHARD_NOT_SERVED" || infoOf(err).GetMetadata()["owner"] != "a" {
		t.Fatalf("a forwarded Hold on A's shard to B = %v, want UNAVAILABLE SHARD_NOT_SERVED naming a", err)
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Fatalf("a forwarded Hold took %v: retried or relayed again", d)
	}
	if d, err := a.lc.Describe(ctxT(t, 5*time.Second), &coordinatorv1.DescribeRequest{Name: name}); err != nil || len(d.GetHolders()) != 0 {
		t.Fatalf("describe on A = %v, %v; want nothing granted", d, err)
	}
}

// The owner goes away while a Hold is relayed to it (a graceful stop, a
// crash): the stream ends UNAVAILABLE with a retry hint, and the client
// resumes its grant with its handle on the replica it is connected to,
// once that replica serves the shard; the grant is the same.
func TestForwardHoldOwnerGoneMidStreamEndsUnavailableAndResumes(t *testing.T) {
	for _, tc := range []struct {
		what string
		stop func(r *fwdReplica)
	}{
		{"a graceful stop", func(r *fwdReplica) { r.coord.Close() }},
		{"a crash", func(r *fwdReplica) { r.coord.Crash() }},
	} {
		t.Run(tc.what, func(t *testing.T) {
			e := startEtcdForShards(t)
			a := startReplica(t, e, "/t/", "a", false)
			b := startReplica(t, e, "/t/", "b", false)
			waitSplit(t, []*fwdReplica{a, b})
			name := namesOn(t, b, "jobs/", 1)[0]
			st, g, err := holdOpen(ctxT(t, 30*time.Second), a.lc, holdAcquire(name, 10*time.Second, false))
			if err != nil {
				t.Fatal(err)
			}
			tc.stop(b)
			_, err = st.Recv()
			if code(err) != codes.Unavailable || reasonOf(err) != "SHARD_NOT_SERVED" || retryDelay(err) <= 0 {
				t.Fatalf("the relayed stream ended with %v (retry %v), want UNAVAILABLE SHARD_NOT_SERVED with a retry delay", err, retryDelay(err))
			}

			var (
				resumed *coordinatorv1.AcquireResponse
				last    error
			)
			eventually(t, 20*time.Second, "the grant resumes through A", func() bool {
				st, resumed, last = holdOpen(ctxT(t, 10*time.Second), a.lc, holdResume(name, g))
				if last != nil && code(last) != codes.Unavailable {
					t.Fatalf("resume through A: %v, want a grant or UNAVAILABLE", last)
				}
				return last == nil
			})
			if !resumed.GetResumed() || resumed.GetToken() != g.GetToken() {
				t.Fatalf("resumed %v, want the grant %d resumed", resumed, g.GetToken())
			}
			if err := st.Send(heartbeat); err != nil {
				t.Fatal(err)
			}
			if r, err := st.Recv(); err != nil || r.GetRenewed() == nil {
				t.Fatalf("heartbeat after the resume answered %v, %v; want renewed", r, err)
			}
			if err := st.Send(holdRelease); err != nil {
				t.Fatal(err)
			}
			if r, err := st.Recv(); err != nil || !r.GetReleased().GetReleased() {
				t.Fatalf("release after the resume answered %v, %v; want released", r, err)
			}
		})
	}
}

// Holds opened through A on B's shards while B stops gracefully: the
// relay's retries absorb the hand-over before the owner answers, so every
// Hold is granted (a stream granted by B may still end UNAVAILABLE when B
// goes, and its client resumes); afterwards every Hold is granted at once.
func TestForwardHoldAbsorbsAGracefulHandOver(t *testing.T) {
	e := startEtcdForShards(t)
	a := startReplica(t, e, "/t/", "a", false)
	b := startReplica(t, e, "/t/", "b", false)
	waitSplit(t, []*fwdReplica{a, b})
	names := namesOn(t, b, "jobs/", 4)

	// release releases the grant on its stream.
	release := func(st holdStream, name string) error {
		if err := st.Send(holdRelease); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		r, err := st.Recv()
		if err == nil && r.GetReleased() == nil {
			err = fmt.Errorf("%s: %v, want released", name, r)
		}
		return err
	}
	// round holds a name and releases it. A stream that ends UNAVAILABLE
	// with a retry hint after its grant (cut: the owner went) is allowed;
	// its client resumes with the handle and releases, as clients do.
	round := func(ctx context.Context, i int) (cut bool, err error) {
		name := names[i%len(names)]
		first := &coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Acquire{Acquire: &coordinatorv1.HoldAcquire{
			Request: &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(10 * time.Second), Wait: dur(2 * time.Second),
				RequestId: fmt.Sprintf("hold-round-%06d-0123456789", i)}}}}
		st, g, err := holdOpen(ctx, a.lc, first)
		if err != nil {
			return false, fmt.Errorf("hold %s: %w", name, err)
		}
		err = release(st, name)
		for code(err) == codes.Unavailable && retryDelay(err) > 0 && ctx.Err() == nil {
			cut = true
			time.Sleep(retryDelay(err))
			if st, _, err = holdOpen(ctx, a.lc, holdResume(name, g)); err == nil {
				err = release(st, name)
			}
		}
		if cut && code(err) == codes.NotFound { // released before its owner went
			err = nil
		}
		if err != nil {
			return cut, fmt.Errorf("release %s: %w", name, err)
		}
		return cut, nil
	}

	var (
		mu           sync.Mutex
		during       []string
		rounds, cuts int
		stop         = make(chan struct{})
		done         = make(chan struct{})
	)
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			cut, err := round(ctx, i)
			cancel()
			mu.Lock()
			rounds++
			if cut {
				cuts++
			}
			if err != nil {
				during = append(during, err.Error())
			}
			mu.Unlock()
		}
	}()
	time.Sleep(200 * time.Millisecond)
	b.coord.Close()
	eventually(t, 15*time.Second, "A owns every shard", func() bool {
		for s := range uint32(fwdShards) {
			if _, ok := a.own().Owned(s); !ok {
				return false
			}
		}
		return true
	})
	time.Sleep(300 * time.Millisecond)
	close(stop)
	<-done
	mu.Lock()
	t.Logf("%d rounds during the hand-over, %d cut after their grant, %d failed", rounds, cuts, len(during))
	if len(during) > 0 {
		t.Errorf("%d of %d Holds failed during the hand-over; the relay's retries should absorb a graceful one: %s",
			len(during), rounds, strings.Join(during, "; "))
	}
	mu.Unlock()
	for i := range 20 {
		if cut, err := round(ctxT(t, 5*time.Second), 1000000+i); err != nil || cut {
			t.Fatalf("after the hand-over: cut %v, %v", cut, err)
		}
	}
}
