package server_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/server"
)

// openWatch opens a Watch stream and waits for its first event (so the
// server counts it); it returns the stream's cancel.
func openWatch(t *testing.T, lc coordinatorv1.LockServiceClient, name string) (context.CancelFunc, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	st, err := lc.Watch(ctx, &coordinatorv1.WatchRequest{Name: name})
	if err == nil {
		_, err = st.Recv()
	}
	return cancel, err
}

// openHold opens a Hold stream holding name; it returns the stream's cancel.
func openHold(t *testing.T, lc coordinatorv1.LockServiceClient, name string) (coordinatorv1.LockService_HoldClient, context.CancelFunc, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	st, err := lc.Hold(ctx)
	if err != nil {
		return nil, cancel, err
	}
	if err := st.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Acquire{Acquire: &coordinatorv1.HoldAcquire{
		Request: &coordinatorv1.AcquireRequest{Name: name, Ttl: dur(time.Minute)}}}}); err != nil {
		return nil, cancel, err
	}
	_, err = st.Recv()
	return st, cancel, err
}

// Each caller may have at most the capped number of Watch and Hold streams
// open; one more is RESOURCE_EXHAUSTED (TOO_MANY_STREAMS), another caller is
// unaffected, and closing a stream frees its slot.
func TestStreamCapsPerCaller(t *testing.T) {
	store, _ := authStore(t, `{"identities": {"a": {"lock_prefixes": [""]}, "b": {"lock_prefixes": [""]}}}`, "a", "b")
	au, as := server.AuthInterceptors(store)
	caps := server.StreamCaps{MaxWatch: 3, MaxHold: 2}
	e := newEnvWith(t, []server.Option{server.WithInnerInterceptors(
		[]grpc.UnaryServerInterceptor{au}, []grpc.StreamServerInterceptor{as, caps.Interceptor()})})
	a := e.dialWith(plaintext(), grpc.WithPerRPCCredentials(bearer("tok-a")))
	a2 := e.dialWith(plaintext(), grpc.WithPerRPCCredentials(bearer("tok-a"))) // same identity, another connection
	b := e.dialWith(plaintext(), grpc.WithPerRPCCredentials(bearer("tok-b")))

	t.Run("Watch", func(t *testing.T) {
		var first context.CancelFunc
		for i := range 3 {
			cancel, err := openWatch(t, a, "w")
			if err != nil {
				t.Fatalf("Watch %d within the cap: %v", i, err)
			}
			if i == 0 {
				first = cancel
			}
		}
		for _, lc := range []coordinatorv1.LockServiceClient{a, a2} {
			if _, err := openWatch(t, lc, "w"); code(err) != codes.ResourceExhausted || reasonOf(err) != "TOO_MANY_STREAMS" {
				t.Fatalf("Watch beyond the cap: %v (reason %q), want RESOURCE_EXHAUSTED TOO_MANY_STREAMS", err, reasonOf(err))
			}
		}
		if _, err := openWatch(t, b, "w"); err != nil {
			t.Fatalf("another identity's Watch: %v", err)
		}
		first()
		eventually(t, 10*time.Second, "a closed Watch frees its slot", func() bool { _, err := openWatch(t, a, "w"); return err == nil })
	})
	t.Run("Hold", func(t *testing.T) {
		var first context.CancelFunc
		for i, name := range []string{"h/1", "h/2"} {
			_, cancel, err := openHold(t, a, name)
			if err != nil {
				t.Fatalf("Hold %d within the cap: %v", i, err)
			}
			if i == 0 {
				first = cancel
			}
		}
		if _, _, err := openHold(t, a2, "h/3"); code(err) != codes.ResourceExhausted || reasonOf(err) != "TOO_MANY_STREAMS" {
			t.Fatalf("Hold beyond the cap: %v (reason %q), want RESOURCE_EXHAUSTED TOO_MANY_STREAMS", err, reasonOf(err))
		}
		if _, _, err := openHold(t, b, "h/b"); err != nil {
			t.Fatalf("another identity's Hold: %v", err)
		}
		first()
		eventually(t, 10*time.Second, "a closed Hold frees its slot", func() bool { _, _, err := openHold(t, a, "h/4"); return err == nil })
	})
}

// Without authorization the caller is the client's IP address: every
// connection from it shares the cap.
func TestStreamCapsPerAddressWithoutAuthorization(t *testing.T) {
	caps := server.StreamCaps{MaxWatch: 2}
	e := newEnvWith(t, []server.Option{server.WithInnerInterceptors(nil, []grpc.StreamServerInterceptor{caps.Interceptor()})})
	for _, lc := range []coordinatorv1.LockServiceClient{e.lc, e.dialWith(plaintext())} {
		if _, err := openWatch(t, lc, "w"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := openWatch(t, e.dialWith(plaintext()), "w"); code(err) != codes.ResourceExhausted || reasonOf(err) != "TOO_MANY_STREAMS" {
		t.Fatalf("a third Watch from the same address: %v, want RESOURCE_EXHAUSTED TOO_MANY_STREAMS", err)
	}
}

// Every Hold message counts against the rate limit like a call: heartbeats
// beyond it end the stream with RESOURCE_EXHAUSTED (RATE_LIMITED) instead
// of renewing the lease in etcd as fast as the client sends.
func TestHoldHeartbeatsCountAgainstTheRateLimit(t *testing.T) {
	ru, rs := server.RateLimit(0.01, 5) // no refill during the test
	e := newEnvWith(t, []server.Option{server.WithInnerInterceptors([]grpc.UnaryServerInterceptor{ru}, []grpc.StreamServerInterceptor{rs})})
	st, _, err := openHold(t, e.lc, "fast") // the stream's opening: 1
	if err != nil {
		t.Fatal(err)
	}
	heartbeat := func() error {
		if err := st.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Heartbeat{Heartbeat: &coordinatorv1.HoldHeartbeat{}}}); err != nil {
			return err
		}
		_, err := st.Recv()
		return err
	}
	for i := range 4 { // 2..5
		if err := heartbeat(); err != nil {
			t.Fatalf("heartbeat %d within the burst: %v", i, err)
		}
	}
	if err := heartbeat(); code(err) != codes.ResourceExhausted || reasonOf(err) != "RATE_LIMITED" {
		t.Fatalf("a heartbeat beyond the burst: %v (reason %q), want RESOURCE_EXHAUSTED RATE_LIMITED", err, reasonOf(err))
	}
	if _, err := e.lc.Describe(ctxT(t, 10*time.Second), &coordinatorv1.DescribeRequest{Name: "fast"}); code(err) != codes.ResourceExhausted {
		t.Fatalf("a call after the heartbeats used the burst: %v, want RESOURCE_EXHAUSTED", err)
	}
}

// rawHeaders sends one gRPC request for Describe over a raw HTTP/2
// connection, with a header "x-pad" of padSize bytes (split over
// CONTINUATION frames), ignoring the server's advertised header-list limit
// as an attacker would. It answers the grpc-status the server sent, or
// "refused" if the server reset the stream (RST_STREAM) or the connection
// (GOAWAY, or a close: what the HTTP/2 framer does with a header block far
// beyond the limit) without answering.
func rawHeaders(t *testing.T, addr string, padSize int) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(1<<20, nil)
	fr.MaxHeaderListSize = 1 << 20
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/coordinator.v1.LockService/Describe"},
		{":authority", "coordinatord"}, {"content-type", "application/grpc"}, {"te", "trailers"}, {"x-pad", strings.Repeat("0123456789abcdef", padSize/16)}} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			t.Fatal(err)
		}
	}
	const chunk = 16 << 10 // the default SETTINGS_MAX_FRAME_SIZE
	b := block.Bytes()
	first := b[:min(len(b), chunk)]
	b = b[len(first):]
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: first, EndHeaders: len(b) == 0}); err != nil {
		t.Fatal(err)
	}
	// The server may close the connection while the headers are still
	// being written: a write error is a refusal too.
	for len(b) > 0 {
		next := b[:min(len(b), chunk)]
		b = b[len(next):]
		if err := fr.WriteContinuation(1, len(b) == 0, next); err != nil {
			return closed(t, err)
		}
	}
	if err := fr.WriteData(1, true, []byte{0, 0, 0, 0, 0}); err != nil { // an empty message
		return closed(t, err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return closed(t, err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			if s := f.PseudoValue("status"); s != "" && s != "200" {
				return "HTTP " + s
			}
			for _, hf := range f.Fields {
				if hf.Name == "grpc-status" {
					return hf.Value
				}
			}
		case *http2.RSTStreamFrame, *http2.GoAwayFrame:
			return "refused"
		}
	}
}

// closed answers "refused" if err says the server closed the connection,
// and fails the test otherwise.
func closed(t *testing.T, err error) string {
	t.Helper()
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return "refused"
	}
	t.Fatalf("talking to the server: %v", err)
	return ""
}

// Request headers beyond 16 KiB are refused before authentication (the
// stream or the connection is reset; no handler, no interceptor runs): gRPC's default would
// parse up to 16 MiB of them per request for anyone who can connect.
func TestHugeHeadersAreRefusedBeforeAuthentication(t *testing.T) {
	store, _ := authStore(t, testPolicy)
	e := newEnvWith(t, []server.Option{authOption(store)})
	for _, tc := range []struct {
		name string
		pad  int
		want string
	}{
		{"8 KiB of headers reach authentication", 8 << 10, "16"}, // UNAUTHENTICATED: no token
		{"20 KiB of headers are reset", 20 << 10, "refused"},
		{"1 MiB of headers are reset", 1 << 20, "refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := rawHeaders(t, e.addr, tc.pad); got != tc.want {
				t.Fatalf("answer %q, want %q", got, tc.want)
			}
		})
	}
}

// A listener capped at N connections closes the N+1th at once (its calls
// fail fast with UNAVAILABLE); a closed connection frees its slot.
func TestConnectionCap(t *testing.T) {
	e := newEnvWith(t, nil)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = e.gs.Serve(server.LimitConnections(raw, 2)) }()
	dial := func() (*grpc.ClientConn, error) {
		conn, err := grpc.NewClient(raw.Addr().String(), plaintext())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		_, err = coordinatorv1.NewLockServiceClient(conn).Describe(ctxT(t, 5*time.Second), &coordinatorv1.DescribeRequest{Name: "x"})
		return conn, err
	}
	first, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dial(); err != nil {
		t.Fatal(err)
	}
	if _, err := dial(); code(err) != codes.Unavailable {
		t.Fatalf("a third connection with a cap of 2: %v, want UNAVAILABLE", err)
	}
	first.Close()
	eventually(t, 10*time.Second, "a closed connection frees its slot", func() bool { _, err := dial(); return err == nil })
}
