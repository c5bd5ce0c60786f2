package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/coordinatord/coordinatord/internal/epoch"
	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// The wire's fencing tokens are epoch<<48 + create revision
// (keyspace.TokenOf); the lease manager speaks create revisions. These
// helpers convert at the handlers, with the epoch of the Keeper
// (internal/epoch), which also gates: while it is paused (a restore of etcd
// being handled) they fail with its *epoch.PausedError and nothing is
// granted, renewed, released or validated.

// Epochs is the token epoch (internal/epoch's Keeper).
type Epochs interface {
	Epoch(ctx context.Context, at int64) (int64, error)
	Status() epoch.State
	// Changed is closed once the epoch is no longer the given one.
	Changed(epoch int64) <-chan struct{}
}

// ServiceOption configures NewLockService.
type ServiceOption func(*LockService)

// WithEpochs sets the token epoch (default: 0 forever; the token is the
// create revision).
func WithEpochs(e Epochs) ServiceOption { return func(s *LockService) { s.epochs = e } }

type epochZero struct{}

func (epochZero) Epoch(context.Context, int64) (int64, error) { return 0, nil }

func (epochZero) Status() epoch.State { return epoch.State{} }

func (epochZero) Changed(int64) <-chan struct{} { return nil }

// epoch is the current epoch, or why none may be used now.
func (s *LockService) epoch(ctx context.Context) (int64, error) { return s.epochs.Epoch(ctx, 0) }

// wireToken is the token of create revision rev in epoch (0 stays 0). A
// revision past what a token carries (2^48 - 1) has no token: 0, never one
// that wraps below the tokens before it (issue 26, item 4). The keeper
// refuses every call once it has seen such a revision (*epoch.ExhaustedError,
// after a grant too: both cores check the epoch again before answering a
// grant), so only an answer racing that refusal can get here.
func wireToken(epoch, rev int64) int64 {
	if rev <= 0 {
		return rev
	}
	if !keyspace.TokenFits(epoch, rev) {
		return 0
	}
	return keyspace.TokenOf(epoch, rev)
}

// revisionOf is the create revision a caller's token names, and false when
// the token is of another epoch than the current one: no grant of it holds
// (raising the epoch ended them all). A token that is no token at all
// (zero, negative) passes unchanged, for the domain to refuse as a field.
func (s *LockService) revisionOf(ctx context.Context, token int64) (int64, bool, error) {
	e, err := s.epoch(ctx)
	if err != nil || token <= 0 {
		return token, true, err
	}
	te, rev := keyspace.SplitToken(token)
	return rev, te == e, nil
}

// unchanged is nil while the current epoch is still token's: checked after
// a call's etcd work, whose success must not be answered if the epoch
// paused or changed meanwhile (etcd went away during the call and may have
// come back restored, with the grant's key back from the snapshot: a
// release, a renewal there is not of the grant the caller held).
func (s *LockService) unchanged(ctx context.Context, token int64) error {
	e, err := s.epoch(ctx)
	if errors.Is(err, epoch.ErrExhausted) {
		// etcd's revisions ran out during the call: its token fits, and
		// what it did at etcd stands; only calls after it are refused.
		e, err = s.epochs.Status().Epoch, nil
	}
	if err != nil {
		return err
	}
	if te, _ := keyspace.SplitToken(token); te != e {
		return &epoch.PausedError{Reason: fmt.Sprintf("the token epoch changed from %d to %d during the call", te, e)}
	}
	return nil
}

// wireErr puts the wire token of the holder into a refusal.
func wireErr(epoch int64, err error) error {
	var ng *lease.NotGrantedError
	if errors.As(err, &ng) {
		ng.HolderToken = wireToken(epoch, ng.HolderToken)
	}
	return err
}
