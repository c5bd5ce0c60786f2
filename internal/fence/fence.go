// Package fence validates fencing tokens against the current holder of a
// lock, linearizably, so that a protected resource can refuse stale writes.
package fence

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/lease"
)

// Reason says why a token is or is not valid.
type Reason int

// Reasons.
const (
	// Current: the token is the current holder's.
	Current Reason = iota + 1
	// Superseded: a newer holder (a greater token) holds the lock now.
	Superseded
	// NotHeld: nobody holds the lock with this token (released or expired
	// with nobody newer holding yet, or never issued).
	NotHeld
)

func (r Reason) String() string {
	switch r {
	case Current:
		return "current"
	case Superseded:
		return "superseded"
	case NotHeld:
		return "not held"
	}
	return "unknown"
}

// Verdict is the answer to Validate.
type Verdict struct {
	Valid  bool
	Reason Reason
	// CurrentToken is the current holder's token, 0 when the lock is free.
	CurrentToken int64
}

// Validator checks tokens against etcd.
type Validator struct {
	cli *clientv3.Client
	ks  lease.Keyspace
}

// New returns a Validator for the locks laid out by ks.
func New(cli *clientv3.Client, ks lease.Keyspace) *Validator {
	return &Validator{cli: cli, ks: ks}
}

// Validate tells whether token is the current holder's token for name. The
// read is linearizable: Valid means the token was current at some instant
// during the call. A stale token is not an error.
func (v *Validator) Validate(ctx context.Context, name string, token int64) (Verdict, error) {
	if err := lease.ValidateName("name", name, false); err != nil {
		return Verdict{}, err
	}
	if err := lease.ValidateToken(token); err != nil {
		return Verdict{}, err
	}
	r, err := v.cli.Get(ctx, v.ks.Queue(name), append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())...)
	if err != nil {
		if ctx.Err() != nil {
			return Verdict{}, ctx.Err()
		}
		return Verdict{}, lease.Classify("fence: validate", err)
	}
	if len(r.Kvs) == 0 {
		return Verdict{Reason: NotHeld}, nil
	}
	cur := r.Kvs[0].CreateRevision
	switch {
	case cur == token:
		return Verdict{Valid: true, Reason: Current, CurrentToken: cur}, nil
	case cur > token:
		return Verdict{Reason: Superseded, CurrentToken: cur}, nil
	default:
		return Verdict{Reason: NotHeld, CurrentToken: cur}, nil
	}
}
