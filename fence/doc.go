// Package fence is the resource side of fencing: it lets a protected
// resource (a storage service, a database, a job runner) refuse writes made
// with a stale fencing token, so that a lock holder that was paused or cut
// off past its lease can never overwrite the work of the holder that
// replaced it.
//
// Three tools, from the simplest:
//
//   - Guard, a local high-water mark for a resource served by one process:
//     it admits a token only if it is at least the highest admitted so far,
//     and runs the write under the same mutex, so check and write are one
//     atomic step.
//
//   - Gate, which wraps a gRPC server (UnaryServerInterceptor,
//     StreamServerInterceptor) or an HTTP handler (Middleware): it reads the
//     lock name and token that the client sent (see the header names below),
//     refuses requests without them, and checks the token against a Guard
//     and/or the coordinator (ValidateToken with the resource's name, which
//     keeps a per-resource high-water mark in etcd) before the handler runs.
//
//   - The SQL pattern, for a resource that is a database: store the token
//     with the row and make the write conditional on it, in one statement:
//
//     UPDATE objects SET value = $1, fence_token = $2
//     WHERE key = $3 AND fence_token <= $2
//
//     Zero rows updated means the token is stale (a greater one has
//     written): refuse. See Example_sql.
//
// Clients send the lock name and the token with every request: over HTTP in
// the headers X-Coordinator-Lock and X-Coordinator-Token (decimal), over
// gRPC in the metadata keys x-coordinator-lock and x-coordinator-token
// (SetHeaders and AppendToOutgoingContext do it). The resource name is not
// taken from the request: the server configures it (WithCoordinator), so a
// client cannot pick a resource whose mark it has not yet raised.
//
// Stale tokens are refused with HTTP 409 Conflict / gRPC FAILED_PRECONDITION,
// missing or malformed ones with 400 / INVALID_ARGUMENT, a lock name other
// than the one the gate requires (WithLock), or than the one that owns the
// resource's mark in the coordinator, with 403 / PERMISSION_DENIED,
// and a coordinator that cannot be asked with 503 / UNAVAILABLE.
//
// # The name
//
// This package keeps the name fence although the coordinator's own
// internal/fence exists beside it. The name is what its users type
// (fence.NewGate, fence.Guard) and what the technique is called (fencing
// tokens); internal/fence is invisible outside this module, no package
// imports both (the coordinator's side does not import the resource's, nor
// the reverse), and the two meet only over the wire, as the two ends of
// ValidateToken. What had one name at both ends is the type: this
// package's interface is TokenValidator (what a Gate asks: anything with
// the ValidateToken method, as *client.Client has), the coordinator's
// implementation is internal/fence's Validator, which also keeps the marks.
package fence
