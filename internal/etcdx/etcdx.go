// Package etcdx is what the domain packages (internal/lease, internal/fence)
// need from etcd beyond clientv3's API: which etcd errors mean "unavailable,
// retry" or "store full" (Classify), and a watch stream of one's own
// (WithOwnWatchStream).
//
// It is not a domain package: it holds etcd-client mechanics, and it is the
// one package below internal/server that imports gRPC (grpc/metadata),
// because outgoing metadata is how clientv3 tells watch streams apart. The
// domain packages import it instead of gRPC.
package etcdx

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The texts keep the "lease:" prefix they had before this package held
// them: they reach clients in status messages.
var (
	// ErrUnavailable: etcd is unreachable or has no quorum; the operation
	// may be retried.
	ErrUnavailable = errors.New("lease: etcd unavailable")
	// ErrStoreFull: etcd refused a write because its store reached its
	// quota (etcd's NOSPACE alarm); writes fail until space is reclaimed
	// and the alarm disarmed, reads go on. Retry later.
	ErrStoreFull = errors.New("lease: etcd's store is full (its quota is reached, NOSPACE alarm) and refuses writes until space is reclaimed: " +
		"the embedded etcd compacts, defragments and disarms by itself within seconds; an external cluster needs " +
		"--auto-compaction-mode/--auto-compaction-retention, or an operator's compaction, defragmentation and `etcdctl alarm disarm`; " +
		"if live data fills it, raise the quota (--quota-backend-bytes)")
)

// unavailable are the etcd errors after which a retry may succeed: no
// leader, a leader change, an overloaded or unhealthy member, no endpoint.
var unavailable = []error{
	rpctypes.ErrNoLeader, rpctypes.ErrLeaderChanged, rpctypes.ErrNotCapable,
	rpctypes.ErrTimeout, rpctypes.ErrTimeoutDueToLeaderFail, rpctypes.ErrTimeoutDueToConnectionLost,
	rpctypes.ErrTooManyRequests, rpctypes.ErrUnhealthy,
	clientv3.ErrNoAvailableEndpoints, context.DeadlineExceeded,
}

// Classify wraps the etcd errors that mean "etcd is unavailable, retry" in
// ErrUnavailable, and etcd's "database space exceeded" in ErrStoreFull;
// any other error is wrapped as it is. op names the operation. The cause
// stays inspectable (errors.Is(err, rpctypes.ErrNoLeader)); toStatus tests
// ErrStoreFull and ErrUnavailable before any cause they may wrap
// (context.DeadlineExceeded among them).
func Classify(op string, err error) error {
	if errors.Is(err, rpctypes.ErrNoSpace) {
		return fmt.Errorf("%w: %s: %w", ErrStoreFull, op, err)
	}
	for _, u := range unavailable {
		if errors.Is(err, u) {
			return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
		}
	}
	return fmt.Errorf("%s: %w", op, err)
}
