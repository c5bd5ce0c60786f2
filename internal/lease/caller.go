package lease

import (
	"context"
	"errors"
	"slices"
)

// ErrSessionForbidden: the session handle is right, but the session was
// opened by another identity. Nothing is read from or done to the session.
var ErrSessionForbidden = errors.New("lease: this session belongs to another identity: only the identity that opened it may use its handle; open your own session")

// WithCaller names the authenticated identity making the acquisition (never
// a value the caller chose in its request). A request id is looked up under
// it, so another identity sending the same id makes another acquisition and
// never obtains this one's grant, handle or queue place; and a session
// handle is accepted only from the identity that opened the session. Empty:
// an unauthenticated caller, which shares one namespace with every other
// unauthenticated caller.
func WithCaller(identity string) AcquireOption {
	return func(o *acquireOptions) { o.caller = identity }
}

// CallOption says who makes a call on a session or an existing grant.
type CallOption func(*callOptions)

type callOptions struct {
	caller string
	scope  func(name string) bool // nil: every name
}

// AsCaller names the authenticated identity making the call (never a value
// from the request), as WithCaller does for Acquire: a session is opened for
// it, and a session, or a grant held through one, answers only it.
func AsCaller(identity string) CallOption { return func(o *callOptions) { o.caller = identity } }

// InScope restricts what a session call lists or releases to the lock names
// for which may returns true (the caller's lock prefixes now): a lock the
// session holds outside them is neither shown nor released by name; it ends
// with the session.
func InScope(may func(name string) bool) CallOption { return func(o *callOptions) { o.scope = may } }

func callOptionsOf(opts []CallOption) callOptions {
	var o callOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

func (o callOptions) inScope(name string) bool { return o.scope == nil || o.scope(name) }

// callerHash is how a session records its opener: the identity's hash (the
// key space holds no identity in clear), "" for an unauthenticated caller.
func callerHash(identity string) string {
	if identity == "" {
		return ""
	}
	return identityHash(identity)
}

// checkSessionOwner checks that the session on lease id was opened by
// caller; ErrNotHeld if the session is gone (and so are its grants).
func (m *Manager) checkSessionOwner(ctx context.Context, h *held, caller string) error {
	r, err := m.cli.Get(ctx, m.ks.session(h.id))
	if err != nil {
		return m.etcdErr(ctx, "read session", err)
	}
	if len(r.Kvs) == 0 {
		return ErrNotHeld
	}
	if decodeSessionRecord(r.Kvs[0].Value).Ident != callerHash(caller) {
		return ErrSessionForbidden
	}
	return nil
}

// scoped keeps the holders (and their helds) whose names are in o's scope.
func (o callOptions) scoped(hs []Holder, helds []*held) ([]Holder, []*held) {
	if o.scope == nil {
		return hs, helds
	}
	out := func(n string) bool { return !o.inScope(n) }
	return slices.DeleteFunc(hs, func(h Holder) bool { return out(h.Name) }),
		slices.DeleteFunc(helds, func(h *held) bool { return out(h.name) })
}
