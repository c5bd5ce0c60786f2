package fence

import (
	"context"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// Epochs is the token epoch the validator judges with (internal/epoch's
// Keeper): Epoch answers the current epoch for an answer of etcd read at
// revision at, or an error while granting and validating are paused (a
// restore of etcd being handled).
type Epochs interface {
	Epoch(ctx context.Context, at int64) (int64, error)
}

// WithEpochs sets the token epoch (default: epoch 0 forever, the token is
// the create revision).
func WithEpochs(e Epochs) Option { return func(v *Validator) { v.epochs = e } }

type epochZero struct{}

func (epochZero) Epoch(context.Context, int64) (int64, error) { return 0, nil }

// holderToken is the token of the holder whose queue key has create
// revision rev (0: no holder), read at revision at. Every queue entry is of
// the current epoch: raising it deleted the others.
func (v *Validator) holderToken(ctx context.Context, rev, at int64) (int64, error) {
	e, err := v.epochs.Epoch(ctx, at)
	if err != nil || rev == 0 {
		return 0, err
	}
	return keyspace.TokenOf(e, rev), nil
}

// revisionOf is the create revision a token of the current epoch carries
// (only asked of a token judged current).
func revisionOf(token int64) int64 {
	_, rev := keyspace.SplitToken(token)
	return rev
}
