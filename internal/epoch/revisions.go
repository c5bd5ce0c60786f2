package epoch

import (
	"errors"
	"fmt"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// A token carries etcd's revision in its low 48 bits (keyspace.TokenOf):
// a revision past MaxRevision would spill into the epoch and make a token
// below the ones before it (issue 26, item 4: after a restore whose
// --bump-revision passed 2^48, tokens fell from 562949953421299 to
// 281474976710697, and Release, KeepAlive and ValidateToken no longer
// recognised the grants). A replica that has seen etcd past MaxRevision,
// in a check or in any answer of its etcd client (Witness), grants,
// renews, releases and validates nothing: Epoch answers *ExhaustedError,
// after a grant too, whose caller then gives the grant up unanswered.
// Headroom (State.Headroom, the metric coordinatord_token_revision_headroom)
// shows it coming: revisions grow by a few per grant, so only a restore's
// bump gets there (coordctl restore-plan refuses bumps past 2^47).

// MaxRevision is the greatest etcd revision a fencing token can carry:
// 2^48 - 1.
const MaxRevision = 1<<keyspace.EpochShift - 1

// ErrExhausted matches every *ExhaustedError.
var ErrExhausted = errors.New("epoch: etcd's revision is past the greatest a fencing token can carry")

// ExhaustedError says that etcd's revision passed MaxRevision: the next
// token would go back below the earlier ones. Retrying does not help; an
// operator restores etcd from a snapshot with a smaller --bump-revision.
type ExhaustedError struct{ Revision int64 }

func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("epoch: etcd's revision %d is past %d (2^48 - 1), the greatest a fencing token can carry: nothing is granted, renewed, released or validated, since tokens would go back; restore etcd from a snapshot with a --bump-revision that keeps its revision below 2^47 (coordctl restore-plan)", e.Revision, MaxRevision)
}

// Is makes errors.Is(err, ErrExhausted) hold.
func (e *ExhaustedError) Is(target error) bool { return target == ErrExhausted }

// headroom is how many revisions etcd can still make before tokens run out,
// from the greatest revision seen (0 once past).
func headroom(rev int64) int64 { return max(MaxRevision-rev, 0) }
