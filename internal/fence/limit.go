package fence

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// DefaultMarkLimit is how many marks one identity may create when New is
// not given WithMarkLimit: at most ~1 KB each (a 512-byte name twice), so
// ~10 MB per identity.
const DefaultMarkLimit = 10_000

// ErrTooManyMarks: the identity has created as many marks as it may
// (WithMarkLimit). Returned as *TooManyMarksError.
var ErrTooManyMarks = errors.New("fence: too many resource marks created by this identity")

// TooManyMarksError refuses a validation that would create a mark beyond
// the caller's cap. Nothing was written.
type TooManyMarksError struct {
	Count, Limit int64
}

func (e *TooManyMarksError) Error() string {
	return fmt.Sprintf("fence: this identity has created %d resource marks, the most allowed is %d (--max-marks-per-identity); "+
		"validate against resources that already have a mark, or ask an admin to delete marks of resources you no longer use (DeleteMark)",
		e.Count, e.Limit)
}

// Is makes errors.Is(err, ErrTooManyMarks) true.
func (e *TooManyMarksError) Is(target error) bool { return target == ErrTooManyMarks }

// Option configures a Validator.
type Option func(*Validator)

// WithMarkLimit caps the marks one identity may create (see AsIdentity) at
// n; 0: no cap (they are still counted, so that a cap set later is exact).
// The count is compared and raised in the etcd transaction that creates a
// mark, and lowered in the one that deletes it, so it is exact under any
// concurrency and any number of replicas.
func WithMarkLimit(n int64) Option { return func(v *Validator) { v.markLimit = n } }

// ValidateOption configures one Validate call.
type ValidateOption func(*validateOptions)

type validateOptions struct {
	identity string
}

// AsIdentity names the caller's authenticated identity (never a value the
// caller chose in its request): a mark the call creates counts against
// that identity's cap. Without it, the caller counts as the anonymous
// identity "", which all unauthenticated callers share.
func AsIdentity(id string) ValidateOption { return func(o *validateOptions) { o.identity = id } }

// identityHash is an identity's segment of the counter keys
// (keyspace.IdentityHash).
func identityHash(id string) string { return keyspace.IdentityHash(id) }

// countKey is the counter of the marks the identity with hash ih created
// and that still exist: a decimal count, outside the marks' range so that
// ListMarks never sees it.
func (v *Validator) countKey(ih string) string { return v.ks.MarkCount(ih) }

// markCount is a read of one identity's counter.
type markCount struct {
	key string
	n   int64 // marks counted
	mr  int64 // the counter's mod revision; 0: no counter yet
}

// readCount reads the counter of the identity with hash ih (linearizable).
func (v *Validator) readCount(ctx context.Context, ih string) (markCount, error) {
	c := markCount{key: v.countKey(ih)}
	r, err := v.cli.Get(ctx, c.key)
	if err != nil {
		return c, v.etcdErr(ctx, "read mark count", err)
	}
	if len(r.Kvs) > 0 {
		c.n, _ = strconv.ParseInt(string(r.Kvs[0].Value), 10, 64) // only we write it
		c.mr = r.Kvs[0].ModRevision
	}
	return c, nil
}

// admit refuses a new mark when c is at the cap.
func (v *Validator) admit(c markCount) error {
	if v.markLimit > 0 && c.n >= v.markLimit {
		return &TooManyMarksError{Count: c.n, Limit: v.markLimit}
	}
	return nil
}

// creators serialises, within one replica, the creations of marks by one
// identity: they all compare and raise the same counter, so concurrent ones
// would mostly lose, and every loser reads and retries (a burst of n costs
// O(n²) transactions: 300 concurrent first validations of one identity took
// 25 s on one embedded etcd; 0.6 s in turn). In turn, each creation costs
// two round trips, and only the replicas contend with each other.
// Identities are striped over a fixed set of slots (a collision only
// serialises two identities' creations).
type creators struct {
	once  sync.Once
	slots [creatorSlots]chan struct{}
}

const creatorSlots = 64

// acquire takes the identity's slot, or fails when ctx ends first.
func (c *creators) acquire(ctx context.Context, ih string) (release func(), err error) {
	c.once.Do(func() {
		for i := range c.slots {
			c.slots[i] = make(chan struct{}, 1)
		}
	})
	h := fnv.New32a()
	h.Write([]byte(ih))
	slot := c.slots[h.Sum32()%creatorSlots]
	select {
	case slot <- struct{}{}:
		return func() { <-slot }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// MarkLimit is the cap on marks per identity (WithMarkLimit; 0: none).
func (v *Validator) MarkLimit() int64 { return v.markLimit }
