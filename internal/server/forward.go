package server

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/authz"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// Forwarding on the shard-owner core: any replica answers for any name.
// A shard handler that finds the name's shard owned by another member
// (a *shard.NotServingError naming its address) calls the same RPC on that
// member, under the caller's deadline, and answers the member's response
// or status unchanged (forwardedError). A relay owns nothing and forwards
// every call. A Hold stream is relayed to the owner the same way
// (forwardhold.go); Watch is served by every replica itself.
//
// What it guarantees, and why:
//
//   - No loops: a forwarded call carries "coordinatord-forwarded: 1" and
//     is never forwarded again; a member that does not own the shard
//     either answers SHARD_NOT_SERVED.
//   - The shard may move: when the owner is unreachable (UNAVAILABLE from
//     the transport) or answers SHARD_NOT_SERVED, and when nobody serves
//     the shard here now (a hand-over, a load, this replica draining), the
//     call is tried again after re-reading the owner from this replica's
//     view (a refusal that names no other member goes to the owner the
//     view shows): at once when the view changes (shard.Ownership
//     Changed), else after a pause from 5 ms doubling to 80 ms, for up to
//     forwardPatience within the deadline; then the answer is
//     SHARD_NOT_SERVED, safe to retry. A caller waits for a graceful
//     hand-over about as long as it takes (forwardPatience), not for the
//     next step of a fixed backoff. Only the refusals that say the call was not applied are retried
//     there (an Acquire cut in flight is withdrawn by its owner, see
//     shard.Acquire).
//   - The caller's identity crosses the hop only with the member secret:
//     the forwarding replica has authenticated and authorized the caller;
//     it sends "coordinatord-identity: <id>" and
//     "coordinatord-member-secret: <secret>", and the receiving replica
//     accepts that identity only if the secret is its own (memberInterceptors,
//     identify), and authorizes it again. Without authentication there is
//     no identity and none is sent. A replica with an authenticated caller
//     but no member secret does not forward (SHARD_NOT_SERVED, logged once).
//   - List asks every member that owns shards for the shards it serves
//     ("coordinatord-list-local: 1"; the member names them in the response
//     header "coordinatord-list-shards-bin"), keeps each shard's holders
//     from one member only, and answers only when every shard was answered
//     for (else SHARD_NOT_SERVED after the retries).

// The metadata of forwarded calls.
const (
	mdForwarded    = "coordinatord-forwarded"
	mdIdentity     = "coordinatord-identity"
	mdMemberSecret = "coordinatord-member-secret"
	mdListLocal    = "coordinatord-list-local"
	mdListShards   = "coordinatord-list-shards-bin" // binary: a bitmap of the shards answered for
)

// The retries of a Hold's relay, of a List (Forwarder.wait) and of a call
// on an identity's lock count (identitylimit.go): forwardRetries waits, doubling from forwardBackoff (20+40+80+160+320 ms:
// 0.6 s in all), each only if the caller's deadline leaves room for it.
const (
	forwardRetries = 5
	forwardBackoff = 20 * time.Millisecond
)

// The retries of a unary forward (forwardWait): at once when this
// replica's view of the owners changes (the old owner's keys deleted, the
// next owner's won), else after a pause from forwardFirstWait doubling to
// forwardMaxWait (a load ends without a change of the view), for
// forwardPatience in all, within the caller's deadline. A graceful
// hand-over leaves a shard unserved while its units in flight commit, one
// Txn deletes its key, the next owner's campaign wins it and a read loads
// it: forwarded calls waited 90–190 ms for it in coordbench's rolling
// restart on a loaded 2-core machine (each of those steps 4–50 ms). A
// crash leaves it unserved for the owner's lease TTL (the caller retries
// SHARD_NOT_SERVED then, as its RetryInfo says). The fixed retries at 20,
// 60, 140, 300 and 620 ms they replace made a caller wait for the next of
// them after the shard served again.
const (
	forwardPatience  = 600 * time.Millisecond
	forwardFirstWait = 5 * time.Millisecond
	forwardMaxWait   = 80 * time.Millisecond
)

// MinMemberSecret is the shortest member secret (WithMemberSecret) the
// daemon accepts: 16 bytes, 128 bits if random.
const MinMemberSecret = 16

// Forwarder is a replica's connections to its peers, one lazily created
// gRPC client connection per peer address, closed by Close.
type Forwarder struct {
	self   string       // this replica's advertised address: never forwarded to
	own    *shard.Owner // this replica's view of the owners, re-read on a retry
	secret []byte
	dial   []grpc.DialOption
	log    *slog.Logger

	warnOnce sync.Once // the missing member secret, logged once

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool
}

func newForwarder(own *shard.Owner, secret []byte, dial []grpc.DialOption, log *slog.Logger) *Forwarder {
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithConnectParams(peerReconnect)}, dial...)
	return &Forwarder{self: own.Advertise(), own: own, secret: secret, dial: opts, log: log, conns: map[string]*grpc.ClientConn{}}
}

// peerReconnect is how a connection to a peer dials again after it broke.
// gRPC's default backoff (1s, growing 1.6x to 2 minutes) kept forwarding
// into a peer that had restarted on its address for seconds after it
// served again: the chaos suite saw holders unable to renew through
// another replica until their grant's honoured TTL ran out. A member is
// on the local network and answers at once when it is up: retry fast,
// never wait more than a second.
var peerReconnect = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: time.Second,
}

// Close closes every connection to a peer; calls forwarded after it fail
// as if the peer were unreachable. Idempotent.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	var errs []error
	for addr, c := range f.conns {
		errs = append(errs, c.Close())
		delete(f.conns, addr)
	}
	return errors.Join(errs...)
}

// client is a client of the peer at addr, on the pooled connection.
func (f *Forwarder) client(addr string) (coordinatorv1.LockServiceClient, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, errors.New("the forwarder is closed")
	}
	c, ok := f.conns[addr]
	if !ok {
		var err error
		if c, err = grpc.NewClient(addr, f.dial...); err != nil {
			return nil, err
		}
		f.conns[addr] = c
	}
	return coordinatorv1.NewLockServiceClient(c), nil
}

// outgoing is ctx with the metadata of a forwarded call: the mark, and the
// caller's identity with the member secret if the call is authenticated.
// ok is false if the identity cannot be asserted (no member secret, or an
// identity that is not printable ASCII, which metadata cannot carry).
func (f *Forwarder) outgoing(ctx context.Context) (_ context.Context, ok bool) {
	md := metadata.Pairs(mdForwarded, "1")
	if id, authenticated := authz.FromContext(ctx); authenticated && id != "" {
		if len(f.secret) == 0 {
			f.warnOnce.Do(func() {
				f.log.WarnContext(ctx, "calls of authenticated clients on shards of other members are not forwarded: "+
					"this replica has no member secret (-member-secret-file); they answer SHARD_NOT_SERVED")
			})
			return nil, false
		}
		if !printableASCII(id) {
			f.log.WarnContext(ctx, "a call is not forwarded: its identity is not printable ASCII, which gRPC metadata cannot carry", "identity", id)
			return nil, false
		}
		md.Set(mdIdentity, id)
		md.Set(mdMemberSecret, string(f.secret))
	}
	return metadata.NewOutgoingContext(ctx, md), true
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// forwardedError is a peer's answer to a forwarded call: already the
// status the call ends with, passed through toStatus unchanged.
type forwardedError struct{ st error }

func (e *forwardedError) Error() string { return e.st.Error() }

// forward answers a unary call of the shard core: here (the shard
// handler) if this replica serves the name's shard, else there (the same
// RPC) on the member that owns it; see the guarantees above. f may be nil
// (no forwarding).
func forward[Req, Resp any](ctx context.Context, f *Forwarder, req Req,
	here func(context.Context, Req) (Resp, error),
	there func(coordinatorv1.LockServiceClient, context.Context, Req, ...grpc.CallOption) (Resp, error),
) (Resp, error) {
	resp, err := here(ctx, req)
	var ns *shard.NotServingError
	if f == nil || !errors.As(err, &ns) || forwarded(ctx) {
		return resp, err
	}
	octx, ok := f.outgoing(ctx)
	if !ok {
		return resp, err
	}
	w := forwardWait{start: time.Now()}
	for {
		changed := f.own.Ownership().Changed() // taken before the owner is read: no later change is missed
		if addr := f.target(ns); addr != "" {
			peer, perr := f.client(addr)
			if perr == nil {
				r, ferr := there(peer, octx, req)
				if ferr == nil {
					return r, nil
				}
				if !notServedThere(ferr) {
					return r, &forwardedError{st: ferr}
				}
				perr = ferr
			}
			f.log.DebugContext(ctx, "forward: the owner did not answer for its shard; re-reading the owner", "shard", ns.Shard, "addr", addr, "err", perr)
		}
		if !w.wait(ctx, changed) {
			return resp, err
		}
		if resp, err = here(ctx, req); !errors.As(err, &ns) {
			return resp, err
		}
	}
}

// target is the address to forward a call refused with ns to: the member
// ns names, else (it names none, or this replica: it is draining, or
// handing the shard over) the owner this replica's view shows; "" if that
// is nobody or this replica (wait for the view to move).
func (f *Forwarder) target(ns *shard.NotServingError) string {
	addr := ns.Addr
	if addr == "" || addr == f.self {
		_, addr, _ = f.own.Ownership().Owner(ns.Shard)
	}
	if addr == f.self {
		return ""
	}
	return addr
}

// forwardWait paces one forward's retries (the constants above).
type forwardWait struct {
	start time.Time
	pause time.Duration // the next pause without a change of the view; 0: forwardFirstWait
}

// wait sleeps until the view changes (changed is closed) or the next pause
// has passed, and tells whether to try again: not past forwardPatience,
// nor past the caller's deadline. A change starts the pauses over.
func (w *forwardWait) wait(ctx context.Context, changed <-chan struct{}) bool {
	if time.Since(w.start) >= forwardPatience {
		return false
	}
	d := max(w.pause, forwardFirstWait)
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-changed:
		w.pause = 0
		return true
	case <-t.C:
		w.pause = min(2*d, forwardMaxWait)
		return true
	}
}

// wait sleeps before retry attempt+1 of a Hold's relay or a List, and
// tells whether to make it: not after forwardRetries, nor past the
// caller's deadline.
func (f *Forwarder) wait(ctx context.Context, attempt int) bool {
	if attempt >= forwardRetries {
		return false
	}
	d := forwardBackoff << attempt
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// notServedThere tells whether a peer's failure says the call was not
// applied because the shard is not served there: UNAVAILABLE from the
// transport (no ErrorInfo of ours), or SHARD_NOT_SERVED.
func notServedThere(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return false
	}
	info := ourErrorInfo(st)
	return info == nil || info.GetReason() == reasonShardNotServed
}

// unreachable tells whether a peer's failure is the transport's (the peer
// is gone, or was never reached): UNAVAILABLE with no ErrorInfo of ours.
func unreachable(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.Unavailable && ourErrorInfo(st) == nil
}

// ourErrorInfo is the ErrorInfo a coordinatord replica put in st, nil if
// none (the status is the transport's).
func ourErrorInfo(st *status.Status) *errdetails.ErrorInfo {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == errorDomain {
			return info
		}
	}
	return nil
}

var reasonShardNotServed = strings.TrimPrefix(coordinatorv1.ErrorReason_ERROR_REASON_SHARD_NOT_SERVED.String(), "ERROR_REASON_")

// forwarded tells whether the call was forwarded by a peer (it is never
// forwarded again).
func forwarded(ctx context.Context) bool {
	return len(metadata.ValueFromIncomingContext(ctx, mdForwarded)) > 0
}

// forwardTo makes the service forward calls on shards owned elsewhere (see
// Forwarder), if it runs the shard core.
func (s *LockService) forwardTo(secret []byte, dial []grpc.DialOption, log *slog.Logger) {
	if s.shards != nil && s.fwd == nil {
		s.fwd = newForwarder(s.shards, secret, dial, log)
	}
}

// Close closes the connections to peers (the shard core's forwarding).
// The coordinator closes it after gRPC has stopped.
func (s *LockService) Close() error {
	if s.fwd == nil {
		return nil
	}
	return s.fwd.Close()
}
