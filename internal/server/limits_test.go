package server_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/server"
)

func TestMaxMessageSize(t *testing.T) {
	e := newEnvWith(t, []server.Option{server.WithServerOptions(grpc.MaxRecvMsgSize(1024))})
	_, err := e.lc.Describe(ctxT(t, 10*time.Second), &coordinatorv1.DescribeRequest{Name: strings.Repeat("n", 2000)})
	if code(err) != codes.ResourceExhausted {
		t.Fatalf("a 2 KB request to a 1 KB limit: %v, want RESOURCE_EXHAUSTED", err)
	}
	// The same connection and others keep working.
	e.acquire("small", 5*time.Second)
	if _, err := e.dialWith(plaintext()).Describe(ctxT(t, 10*time.Second), &coordinatorv1.DescribeRequest{Name: "small"}); err != nil {
		t.Fatal(err)
	}
}

func TestMaxConcurrentStreams(t *testing.T) {
	e := newEnvWith(t, []server.Option{server.WithServerOptions(grpc.MaxConcurrentStreams(2))})
	e.acquire("busy", time.Minute)
	crowded := e.dialWith(plaintext())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := crowded.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "busy"})
			done <- err
		}()
	}
	eventually(t, 10*time.Second, "two waiters", func() bool { return len(e.describe("busy").Waiters) == 2 })
	// A third call on the crowded connection is held back by HTTP/2 flow
	// control until a stream ends: it cannot start before its deadline.
	short, cancelShort := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancelShort()
	if _, err := crowded.ValidateToken(short, &coordinatorv1.ValidateTokenRequest{Name: "busy", Token: 1}); code(err) != codes.DeadlineExceeded {
		t.Fatalf("a third stream on a connection limited to 2: %v, want DEADLINE_EXCEEDED", err)
	}
	// Other connections are served.
	if _, err := e.lc.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: "busy", Token: 1}); err != nil {
		t.Fatalf("another connection: %v", err)
	}
	cancel()
	for range 2 {
		if err := <-done; code(err) != codes.Canceled {
			t.Fatalf("waiter: %v", err)
		}
	}
}

func TestKeepaliveEnforcement(t *testing.T) {
	e := newEnvWith(t, []server.Option{server.WithServerOptions(grpc.KeepaliveEnforcementPolicy(
		keepalive.EnforcementPolicy{MinTime: time.Minute, PermitWithoutStream: true}))})
	conn, err := net.DialTimeout("tcp", e.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 { // far more often than once a minute
		if err := fr.WritePing(false, [8]byte{byte(i)}); err != nil {
			break // the server may already have hung up
		}
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no GOAWAY before the connection ended: %v", err)
		}
		if ga, ok := f.(*http2.GoAwayFrame); ok {
			if ga.ErrCode != http2.ErrCodeEnhanceYourCalm || string(ga.DebugData()) != "too_many_pings" {
				t.Fatalf("GOAWAY %v %q, want ENHANCE_YOUR_CALM too_many_pings", ga.ErrCode, ga.DebugData())
			}
			break
		}
	}
	// Well-behaved clients are unaffected.
	e.acquire("calm", 5*time.Second)
}

func TestRateLimitPerIdentity(t *testing.T) {
	store, _ := authStore(t, `{"identities": {"a": {"lock_prefixes": [""]}, "b": {"lock_prefixes": [""]}}}`, "a", "b")
	au, as := server.AuthInterceptors(store)
	ru, rs := server.RateLimit(0.01, 3)
	e := newEnvWith(t, []server.Option{server.WithInnerInterceptors(
		[]grpc.UnaryServerInterceptor{au, ru}, []grpc.StreamServerInterceptor{as, rs})})
	a := e.dialWith(plaintext(), grpc.WithPerRPCCredentials(bearer("tok-a")))
	a2 := e.dialWith(plaintext(), grpc.WithPerRPCCredentials(bearer("tok-a"))) // same identity, another connection
	b := e.dialWith(plaintext(), grpc.WithPerRPCCredentials(bearer("tok-b")))
	validate := func(lc coordinatorv1.LockServiceClient) error {
		_, err := lc.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: "x", Token: 1})
		return err
	}
	for i := range 3 {
		if err := validate(a); err != nil {
			t.Fatalf("call %d within the burst: %v", i, err)
		}
	}
	if err := validate(a); code(err) != codes.ResourceExhausted {
		t.Fatalf("4th call of a burst of 3: %v, want RESOURCE_EXHAUSTED", err)
	}
	if err := validate(a2); code(err) != codes.ResourceExhausted {
		t.Fatalf("the same identity on another connection: %v, want RESOURCE_EXHAUSTED", err)
	}
	for i := range 3 {
		if err := validate(b); err != nil {
			t.Fatalf("another identity, call %d: %v", i, err)
		}
	}
}

func TestRateLimitPerAddressWithoutAuthorization(t *testing.T) {
	ru, rs := server.RateLimit(0.01, 2)
	e := newEnvWith(t, []server.Option{server.WithInnerInterceptors([]grpc.UnaryServerInterceptor{ru}, []grpc.StreamServerInterceptor{rs})})
	for i := range 2 {
		if _, err := e.lc.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: "x", Token: 1}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	_, err := e.lc.ValidateToken(ctxT(t, 10*time.Second), &coordinatorv1.ValidateTokenRequest{Name: "x", Token: 1})
	if code(err) != codes.ResourceExhausted || reasonOf(err) != "RATE_LIMITED" {
		t.Fatalf("3rd call: %v, want RESOURCE_EXHAUSTED, reason RATE_LIMITED", err)
	}
	// Issue 19.4: its RetryInfo is when the bucket holds a token again: at
	// most 1/rps (100s) away, and not yet.
	var delay time.Duration
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			delay = ri.GetRetryDelay().AsDuration()
		}
	}
	if delay <= 0 || delay > 100*time.Second {
		t.Fatalf("RetryInfo delay %v, want within (0, 100s]", delay)
	}
}

// limitReason checks that err is RESOURCE_EXHAUSTED with an ErrorInfo of
// reason, naming the limit (the flag) and its maximum.
func limitReason(t *testing.T, err error, reason, limit string, maximum int64) {
	t.Helper()
	if code(err) != codes.ResourceExhausted {
		t.Fatalf("%v, want RESOURCE_EXHAUSTED", err)
	}
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			if info.GetReason() != reason || info.GetMetadata()["limit"] != limit || info.GetMetadata()["maximum"] != strconv.FormatInt(maximum, 10) {
				t.Fatalf("ErrorInfo %v, want reason %s, limit %s, maximum %d", info, reason, limit, maximum)
			}
			return
		}
	}
	t.Fatalf("no ErrorInfo in %v", err)
}

func TestMaxWaitersAndMaxWait(t *testing.T) {
	e := newEnvWith(t, nil, lease.WithMaxWaitersPerLock(2), lease.WithMaxWait(2*time.Second))
	e.acquire("crowd", time.Minute)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := e.lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "crowd", Wait: dur(time.Second)})
			done <- err
		}()
	}
	eventually(t, 10*time.Second, "two waiters", func() bool { return len(e.describe("crowd").Waiters) == 2 })
	rev := e.rev()
	_, err := e.lc.Acquire(ctxT(t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: "crowd", Wait: dur(time.Second)})
	limitReason(t, err, "TOO_MANY_WAITERS", "max-waiters-per-lock", 2)
	if _, err := e.tryAcquire("crowd"); code(err) != codes.Aborted {
		t.Fatalf("a try-lock on a full queue: %v, want ABORTED", err)
	}
	if got := e.rev(); got != rev {
		t.Errorf("refused acquisitions wrote to etcd: revision %d -> %d", rev, got)
	}
	e.acquire("elsewhere", 5*time.Second) // other locks are unaffected
	for range 2 {
		if err := <-done; code(err) != codes.Aborted {
			t.Fatalf("waiter with wait 1s: %v, want ABORTED", err)
		}
	}

	// Max wait: more than allowed is refused; no wait means the max.
	_, err = e.lc.Acquire(ctxT(t, 10*time.Second), &coordinatorv1.AcquireRequest{Name: "crowd", Wait: dur(time.Hour)})
	if code(err) != codes.InvalidArgument || fieldOf(err) != "wait" {
		t.Fatalf("wait 1h with max 2s: %v, want INVALID_ARGUMENT on wait", err)
	}
	// The first message of a Hold stream is an Acquire like any other.
	st, err := e.lc.Hold(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Acquire{Acquire: &coordinatorv1.HoldAcquire{
		Request: &coordinatorv1.AcquireRequest{Name: "crowd", Wait: dur(time.Hour)}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); code(err) != codes.InvalidArgument || fieldOf(err) != "wait" {
		t.Fatalf("Hold with wait 1h, max 2s: %v, want INVALID_ARGUMENT on wait", err)
	}
	_, err = e.lc.Acquire(ctxT(t, 20*time.Second), &coordinatorv1.AcquireRequest{Name: "crowd"})
	if code(err) != codes.Aborted {
		t.Fatalf("no wait, max 2s, lock held: %v, want ABORTED", err)
	}
	if n := e.queueKeys("crowd"); n != 1 {
		t.Fatalf("%d queue keys after the waits, want 1 (the holder)", n)
	}
}

func TestMaxWaitersOnHoldStreams(t *testing.T) {
	e := newEnvWith(t, nil, lease.WithMaxWaitersPerLock(1))
	e.acquire("h", time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _, _ = e.lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "h"}) }()
	eventually(t, 10*time.Second, "one waiter", func() bool { return len(e.describe("h").Waiters) == 1 })
	st, err := e.lc.Hold(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Acquire{Acquire: &coordinatorv1.HoldAcquire{
		Request: &coordinatorv1.AcquireRequest{Name: "h"}}}}); err != nil {
		t.Fatal(err)
	}
	_, err = st.Recv()
	limitReason(t, err, "TOO_MANY_WAITERS", "max-waiters-per-lock", 1)
}

// The per-identity limit counts holders and waiters of one identity across
// unary Acquire, Hold streams and sessions; beyond it, RESOURCE_EXHAUSTED
// with nothing written, while another identity keeps working; a release
// frees a slot.
func TestMaxLocksPerIdentity(t *testing.T) {
	store, _ := authStore(t, `{"identities": {"a": {"lock_prefixes": [""]}, "b": {"lock_prefixes": [""]}}}`, "a", "b")
	au, as := server.AuthInterceptors(store)
	e := newEnvWith(t, []server.Option{server.WithInnerInterceptors(
		[]grpc.UnaryServerInterceptor{au}, []grpc.StreamServerInterceptor{as})}, lease.WithMaxLocksPerIdentity(2))
	a := e.dialWith(plaintext(), grpc.WithPerRPCCredentials(bearer("tok-a")))
	b := e.dialWith(plaintext(), grpc.WithPerRPCCredentials(bearer("tok-b")))
	session, err := a.OpenSession(ctxT(t, 10*time.Second), &coordinatorv1.OpenSessionRequest{Ttl: dur(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	acquireIn := func(lc coordinatorv1.LockServiceClient, name, sessionHandle string) (*coordinatorv1.AcquireResponse, error) {
		req := &coordinatorv1.AcquireRequest{Name: name, Wait: dur(0), SessionHandle: sessionHandle}
		if sessionHandle == "" {
			req.Ttl = dur(time.Minute)
		}
		return lc.Acquire(ctxT(t, 10*time.Second), req)
	}
	acquire := func(lc coordinatorv1.LockServiceClient, name string) (*coordinatorv1.AcquireResponse, error) {
		return acquireIn(lc, name, "")
	}
	hold := func(lc coordinatorv1.LockServiceClient, name string) error {
		st, err := lc.Hold(ctxT(t, 10*time.Second))
		if err != nil {
			return err
		}
		if err := st.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Acquire{Acquire: &coordinatorv1.HoldAcquire{
			Request: &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(time.Minute)}}}}); err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	}

	// A lock held through a session counts.
	held, err := acquireIn(a, "a/1", session.GetHandle())
	if err != nil {
		t.Fatal(err)
	}
	// A waiter counts like a holder.
	if _, err := acquire(b, "shared"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiting := make(chan error, 1)
	go func() {
		_, err := a.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "shared", Ttl: dur(time.Minute)})
		waiting <- err
	}()
	eventually(t, 10*time.Second, "a waits", func() bool { return e.waiters("shared") == 1 })

	rev := e.rev()
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"Acquire beyond the limit", func() error { _, err := acquire(a, "a/2"); return err }},
		{"Hold beyond the limit", func() error { return hold(a, "a/3") }},
		{"Acquire through a session beyond the limit", func() error { _, err := acquireIn(a, "a/5", session.GetHandle()); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			limitReason(t, tc.call(), "TOO_MANY_LOCKS", "max-locks-per-identity", 2)
		})
	}
	if got := e.rev(); got != rev {
		t.Errorf("refused acquisitions wrote to etcd: revision %d -> %d", rev, got)
	}
	if _, err := acquire(b, "b/1"); err != nil {
		t.Fatalf("another identity: %v", err)
	}
	if r, err := a.Release(ctxT(t, 10*time.Second), &coordinatorv1.ReleaseRequest{Name: "a/1", Token: held.GetToken(), Handle: held.GetHandle()}); err != nil || !r.GetReleased() {
		t.Fatalf("release: %v %v", r, err)
	}
	if err := hold(a, "a/4"); err != nil {
		t.Fatalf("Hold after a release freed a slot: %v", err)
	}
	cancel()
	if err := <-waiting; code(err) != codes.Canceled {
		t.Fatalf("waiter: %v", err)
	}
}

// Without an identity (no authorization policy) the limit does not apply.
func TestMaxLocksPerIdentityNeedsAnIdentity(t *testing.T) {
	e := newEnvWith(t, nil, lease.WithMaxLocksPerIdentity(1))
	for _, name := range []string{"anon/1", "anon/2", "anon/3"} {
		e.acquire(name, time.Minute)
	}
}
