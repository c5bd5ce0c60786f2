package server

import (
	"context"

	"github.com/coordinatord/coordinatord/internal/authz"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// lockScopeKey carries, from the auth interceptor to the session handlers,
// the test of the lock names the caller may use (its lock prefixes under
// the policy current at each test).
type lockScopeKey struct{}

// withLockScope returns ctx carrying id's lock scope under store's policy.
func withLockScope(ctx context.Context, store *authz.Store, id string) context.Context {
	may := func(name string) bool { return store.Policy().MayLock(id, name) }
	return context.WithValue(ctx, lockScopeKey{}, may)
}

// ownedOptions name the authenticated identity (never a request field) to
// the lease domain, which counts the acquisition against that identity's
// limit (lease.WithMaxLocksPerIdentity). Without an identity (no
// authorization policy) there is nothing to count against: client
// addresses are shared behind NAT and a Service, so they would make a poor
// quota key.
func ownedOptions(ctx context.Context) []lease.AcquireOption {
	id, ok := authz.FromContext(ctx)
	if !ok || id == "" {
		return nil
	}
	return []lease.AcquireOption{lease.WithIdentity(id)}
}

// callerOptions name the authenticated identity (never a request field) to
// an acquisition: its request id is looked up under it, and a session handle
// must be its own. Without authentication: none.
func callerOptions(ctx context.Context) []lease.AcquireOption {
	if id, ok := authz.FromContext(ctx); ok && id != "" {
		return []lease.AcquireOption{lease.WithCaller(id)}
	}
	return nil
}

// callOptions name the authenticated identity to a call on a session or an
// existing grant, and the lock names a session call may list or release.
func callOptions(ctx context.Context) []lease.CallOption {
	var opts []lease.CallOption
	if id, ok := authz.FromContext(ctx); ok && id != "" {
		opts = append(opts, lease.AsCaller(id))
	}
	if may, ok := ctx.Value(lockScopeKey{}).(func(string) bool); ok {
		opts = append(opts, lease.InScope(may))
	}
	return opts
}
