package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/authz"
	"github.com/coordinatord/coordinatord/internal/lease"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// The per-identity lock limit on the shard-owner core (internal/shard,
// identity.go): an identity's count lives on one shard, its home, whose
// owner may be another member. The calls on a count (take a slot, renew
// slots, free slots) go to the home's owner: this replica's Owner if it
// serves the home, else the member that does, as an Acquire forwarded with
// the metadata "coordinatord-identity-slots: reserve|renew|release". The
// receiving member honours it only on a call forwarded with the caller's
// identity verified by the member secret (memberInterceptors), and acts on
// the count of that identity only, never on one the request names: a
// member can move no count but that of the identity it asserts, and a
// client, which cannot assert one, none at all. The request carries the
// slot ids in request_id (comma-separated) and, in name, a lock of the
// identity's, by which the home's member authorizes the call as it would
// the identity's own Acquire; a renewal answers the ids it holds no slot of
// in handle.

// mdIdentitySlots marks a member's call on an identity's lock count.
const mdIdentitySlots = "coordinatord-identity-slots"

// The calls on a count.
const (
	slotsReserve = "reserve"
	slotsRenew   = "renew"
	slotsRelease = "release"
)

// IdentityHomes reaches the homes of the identities' counts for the shard
// core's Owner (shard.Owner.SetIdentityHomes): here, or on the member that
// owns the home, through this service's forwarding.
func (s *LockService) IdentityHomes() shard.IdentityHomes { return identityHomes{s} }

type identityHomes struct{ s *LockService }

func (h identityHomes) Reserve(ctx context.Context, identity, name, id string) error {
	_, err := h.call(ctx, slotsReserve, identity, name, []string{id}, func() error {
		return h.s.shards.ReserveIdentity(ctx, identity, id)
	})
	return err
}

func (h identityHomes) Renew(ctx context.Context, identity, name string, ids []string) (missing []string, err error) {
	r, err := h.call(ctx, slotsRenew, identity, name, ids, func() error {
		var e error
		missing, e = h.s.shards.RenewIdentity(ctx, identity, ids)
		return e
	})
	if r != nil && r.GetHandle() != "" {
		missing = strings.Split(r.GetHandle(), ",")
	}
	return missing, err
}

func (h identityHomes) Release(ctx context.Context, identity, name string, ids []string) error {
	_, err := h.call(ctx, slotsRelease, identity, name, ids, func() error {
		return h.s.shards.ReleaseIdentity(ctx, identity, ids)
	})
	return err
}

// call runs a call on the identity's count here (local) if this replica
// serves its home, else on the home's owner; a home served nowhere now (a
// takeover, a load) is tried again a few times within ctx. It answers the
// peer's response, if the peer answered.
func (h identityHomes) call(ctx context.Context, op, identity, name string, ids []string, local func() error) (*coordinatorv1.AcquireResponse, error) {
	for attempt := 0; ; attempt++ {
		err := local()
		var ns *shard.NotServingError
		if !errors.As(err, &ns) {
			return nil, err
		}
		if f := h.s.fwd; f != nil && ns.Addr != "" && ns.Addr != f.self {
			r, rerr := h.remote(ctx, f, ns.Addr, op, identity, name, ids)
			switch {
			case rerr == nil:
				return r, nil
			case errors.Is(rerr, errNoIdentityHop):
				return nil, rerr
			case errors.Is(rerr, errPeerClosed):
			case !notServedThere(rerr):
				return nil, slotsErr(rerr)
			}
		}
		if !slotsRetry(ctx, attempt) {
			return nil, err
		}
	}
}

// errNoIdentityHop: the home's owner cannot be told the caller's identity.
var errNoIdentityHop = fmt.Errorf("%w: the lock count of this identity is kept by another member, "+
	"which this replica cannot call with the identity (it needs -member-secret-file, and an identity of printable ASCII)", lease.ErrUnavailable)

// errPeerClosed: no connection to the peer can be made (the forwarder is
// closed): as an unreachable peer, tried again.
var errPeerClosed = errors.New("no connection to the member")

// remote calls op on the count of identity at the member at addr.
func (h identityHomes) remote(ctx context.Context, f *Forwarder, addr, op, identity, name string, ids []string) (*coordinatorv1.AcquireResponse, error) {
	octx, ok := f.outgoing(authz.NewContext(ctx, identity))
	if !ok {
		return nil, errNoIdentityHop
	}
	peer, err := f.client(addr)
	if err != nil {
		return nil, errPeerClosed // as unreachable: tried again
	}
	octx = metadata.AppendToOutgoingContext(octx, mdIdentitySlots, op)
	return peer.Acquire(octx, &coordinatorv1.AcquireRequest{Name: name, RequestId: strings.Join(ids, ",")})
}

// slotsErr is a peer's refusal of a call on a count: its status, passed
// through unchanged (forwardedError), and, for a full count, also
// lease.ErrTooManyLocks (the Owner then knows nothing was taken).
func slotsErr(err error) error {
	fw := &forwardedError{st: err}
	if info := ourErrorInfo(status.Convert(err)); status.Code(err) == codes.ResourceExhausted && info != nil && info.GetReason() == reasonTooManyLocks {
		return &countFullError{fw}
	}
	return fw
}

var reasonTooManyLocks = strings.TrimPrefix(coordinatorv1.ErrorReason_ERROR_REASON_TOO_MANY_LOCKS.String(), "ERROR_REASON_")

// countFullError is a peer's TOO_MANY_LOCKS: its status unchanged for the
// caller, lease.ErrTooManyLocks for the Owner.
type countFullError struct{ fw *forwardedError }

func (e *countFullError) Error() string        { return e.fw.Error() }
func (e *countFullError) Unwrap() error        { return e.fw }
func (e *countFullError) Is(target error) bool { return target == lease.ErrTooManyLocks }

// slotsRetry waits before try attempt+1 on a home served nowhere now, and
// tells whether to make it: 5 tries, 20 ms doubling (0.6 s), within ctx.
func slotsRetry(ctx context.Context, attempt int) bool {
	if attempt >= forwardRetries {
		return false
	}
	t := time.NewTimer(forwardBackoff << attempt)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// identitySlotsCall is the call on a count a forwarded Acquire carries, ""
// for none (a client's Acquire, even with the metadata, is an Acquire).
func identitySlotsCall(ctx context.Context) string {
	if !forwarded(ctx) {
		return ""
	}
	if v := metadata.ValueFromIncomingContext(ctx, mdIdentitySlots); len(v) == 1 {
		return v[0]
	}
	return ""
}

// identitySlotsHere answers a member's call on a count of an identity
// homed here: only for the identity the calling member asserted and
// proved with the member secret, never one the request names.
func (s *LockService) identitySlotsHere(ctx context.Context, req *coordinatorv1.AcquireRequest, op string) (*coordinatorv1.AcquireResponse, error) {
	id, verified := ctx.Value(memberVerifiedKey{}).(string)
	if !verified || id == "" || id != callerOf(ctx) {
		return nil, &lease.FieldError{Field: mdIdentitySlots, Reason: "is metadata of member replicas only, " +
			"on a call forwarded with an identity asserted with the member secret; clients may not send it"}
	}
	ids := strings.Split(req.GetRequestId(), ",")
	for _, x := range ids {
		if x == "" || len(x) > 64 {
			return nil, &lease.FieldError{Field: "request_id", Reason: "must list the slot ids, comma-separated"}
		}
	}
	var missing []string
	var err error
	switch op {
	case slotsReserve:
		if len(ids) != 1 {
			return nil, &lease.FieldError{Field: "request_id", Reason: "must name one slot to reserve"}
		}
		err = s.shards.ReserveIdentity(ctx, id, ids[0])
	case slotsRenew:
		missing, err = s.shards.RenewIdentity(ctx, id, ids)
	case slotsRelease:
		err = s.shards.ReleaseIdentity(ctx, id, ids)
	default:
		err = &lease.FieldError{Field: mdIdentitySlots, Reason: "must be reserve, renew or release"}
	}
	if err != nil {
		return nil, err
	}
	return &coordinatorv1.AcquireResponse{Handle: strings.Join(missing, ",")}, nil
}
