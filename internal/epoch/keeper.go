// Package epoch keeps fencing tokens monotonic across restores of etcd from
// a backup.
//
// Tokens are etcd create revisions, and a restore takes revisions back to
// the snapshot's: without this package, a token issued after the snapshot
// would be issued again, and a holder whose queue key came back with the
// snapshot would hold again. A Keeper detects a restore, at start and while
// running, and then raises the token epoch in etcd before anything is
// granted or validated again: tokens are epoch<<48 + revision
// (keyspace.TokenOf), so every token of the new epoch is greater than every
// token of the earlier ones, and a token of an earlier epoch never matches
// a holder again.
//
// Detection (check.go) compares what etcd shows now with what was seen
// before: etcd's raft index and term (recorded in the beacon key, which a
// restore brings back with its old values while the live ones restart at 1),
// the revision and the beacon's mod revision (which a replica that kept
// running remembers; a restore without --bump-revision takes them back),
// and each member's committed raft index against the entries its revision
// needs since the beacon (beacon.go: a restore keeps or raises revisions
// and restarts the index, so this shows even a young snapshot's restore).
// The cluster ID is no signal: a restore with the same flags keeps it.
//
// Raising the epoch (bump.go) fences the old epoch off: every lease attached
// to a queue entry, a session, a lock-delay or a slot is revoked (a restored
// lease can be kept alive again) and those keys and the request records are
// deleted, so nothing granted before the restore holds, renews, releases or
// validates after it.
//
// The Keeper is a gate: while it has not checked etcd, or handles a restore,
// Epoch answers *PausedError (UNAVAILABLE, reason EPOCH_PAUSED), and the
// server grants and validates nothing; once etcd's revision passed what a
// token carries, *ExhaustedError (FAILED_PRECONDITION, reason
// TOKENS_EXHAUSTED; revisions.go).
package epoch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// ErrPaused matches every *PausedError.
var ErrPaused = errors.New("epoch: granting and validating are paused")

// PausedError says why the Keeper grants and validates nothing for now: it
// has not been able to check etcd's history yet, or it found a restore and
// is raising the epoch. Retrying later is safe.
type PausedError struct{ Reason string }

func (e *PausedError) Error() string {
	return fmt.Sprintf("epoch: granting and validating are paused until etcd's history is checked (%s); retry", e.Reason)
}

// Is makes errors.Is(err, ErrPaused) hold.
func (e *PausedError) Is(target error) bool { return target == ErrPaused }

// DefaultInterval is how often a running Keeper checks etcd: a restore that
// a replica's own answers do not show (one with a large enough
// --bump-revision) is found within it. Each check is one read and one
// Status call per endpoint; the beacon is rewritten only when etcd's raft
// index doubled since it was written.
const DefaultInterval = time.Second

// Keeper detects restores and holds the current epoch.
type Keeper struct {
	cli    *clientv3.Client
	ks     keyspace.Keyspace
	log    *slog.Logger
	every  time.Duration
	onBump func(epoch int64)

	mu     sync.Mutex
	epoch  int64
	paused string    // "" when open
	until  time.Time // open only until then: the last successful check's start + validity()
	// What this replica saw of etcd's history in this epoch: a restore takes
	// them back.
	maxRev   int64         // the greatest revision a check read or an answer was witnessed at
	beaconMR int64         // the beacon's mod revision, as last read or written
	changed  chan struct{} // closed when the epoch changes (then replaced)
	gen      atomic.Uint64 // epochs adopted (Witness ignores answers to calls from before one)

	checkMu sync.Mutex   // one check at a time
	started atomic.Int64 // checks started
	bumps   atomic.Int64 // epochs raised by this Keeper
}

// Option configures New.
type Option func(*Keeper)

// WithInterval sets how often Run checks etcd (default DefaultInterval).
func WithInterval(d time.Duration) Option { return func(k *Keeper) { k.every = d } }

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(k *Keeper) { k.log = l } }

// OnBump sets a function called, outside every lock, after this Keeper
// adopted a new epoch (raised by itself or by another replica); the
// coordinator restarts there what followed the old history (the holder
// view).
func OnBump(f func(epoch int64)) Option { return func(k *Keeper) { k.onBump = f } }

// New returns a Keeper of the epoch keys under ks, paused until its first
// check (Check or Run).
func New(cli *clientv3.Client, ks keyspace.Keyspace, opts ...Option) *Keeper {
	k := &Keeper{cli: cli, ks: ks, log: slog.New(slog.DiscardHandler), every: DefaultInterval,
		paused: "etcd not checked yet", changed: make(chan struct{})}
	for _, o := range opts {
		o(k)
	}
	return k
}

// State is what Status reports.
type State struct {
	Epoch int64
	// Floor is the smallest token of Epoch: every token below it is of an
	// earlier epoch and never valid again.
	Floor int64
	// Paused is why granting and validating are paused, "" when they are
	// not: also once etcd's revision passed MaxRevision (then for good,
	// until a restore).
	Paused string
	// Bumps counts the epochs this Keeper raised itself.
	Bumps int64
	// Revision is the greatest etcd revision this Keeper read or witnessed
	// in the epoch, and Headroom the revisions etcd can still make before
	// tokens run out (MaxRevision - Revision, 0 once past).
	Revision, Headroom int64
}

// Status is the Keeper's current state.
func (k *Keeper) Status() State {
	k.mu.Lock()
	defer k.mu.Unlock()
	paused := k.pausedLocked()
	if paused == "" && k.maxRev > MaxRevision {
		paused = (&ExhaustedError{Revision: k.maxRev}).Error()
	}
	return State{Epoch: k.epoch, Floor: keyspace.EpochFloor(k.epoch), Paused: paused, Bumps: k.bumps.Load(),
		Revision: k.maxRev, Headroom: headroom(k.maxRev)}
}

// pausedLocked is why the gate is closed, "" when it is open (k.mu held).
func (k *Keeper) pausedLocked() string {
	if k.paused == "" && time.Now().After(k.until) {
		return fmt.Sprintf("no check of etcd's history succeeded for %s", k.validity())
	}
	return k.paused
}

// Epoch is the epoch to make and judge tokens with, for an answer of etcd
// at revision at (0: no revision to judge). A revision below what an
// earlier check read may show a restore (or only a read that raced the
// check): Epoch then checks etcd again, and answers only if that check
// finds no restore. While paused, or when no check succeeded for three
// intervals (etcd was down: it may come back restored), a *PausedError;
// once etcd's revision (at, or any seen in the epoch) passed MaxRevision, an
// *ExhaustedError: a token of it would go back.
func (k *Keeper) Epoch(ctx context.Context, at int64) (int64, error) {
	k.mu.Lock()
	epoch, paused, suspicious, top := k.epoch, k.pausedLocked(), at > 0 && at < k.maxRev, max(at, k.maxRev)
	k.mu.Unlock()
	if paused != "" {
		return 0, &PausedError{Reason: paused}
	}
	if top > MaxRevision {
		return 0, &ExhaustedError{Revision: top}
	}
	if !suspicious {
		return epoch, nil
	}
	if err := k.checkSince(ctx, k.started.Load()); err != nil {
		return 0, &PausedError{Reason: "etcd's history could not be checked: " + err.Error()}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case k.pausedLocked() != "":
		return 0, &PausedError{Reason: k.pausedLocked()}
	case k.epoch != epoch:
		return 0, &PausedError{Reason: fmt.Sprintf("the answer was read in epoch %d, now %d", epoch, k.epoch)}
	}
	return epoch, nil
}

// Generation counts the epochs this Keeper adopted: read it when an etcd
// call starts, and pass it to Witness with the revision of the answer.
func (k *Keeper) Generation() uint64 { return k.gen.Load() }

// Witness records that etcd answered, at revision rev, a call that started
// at generation gen. A check that then reads a revision below every one
// witnessed in the epoch has found a restore: so the tokens this replica
// granted, and the answers it gave, since its last check count too (a
// restore to a snapshot taken after that check, without a bump, was
// otherwise found only by the raft index, which a short history does not
// move enough). An answer to a call from before the epoch changed is of the
// old history and does not count.
func (k *Keeper) Witness(gen uint64, rev int64) {
	if rev <= 0 {
		return
	}
	k.mu.Lock()
	if gen == k.gen.Load() && rev > k.maxRev {
		k.maxRev = rev
	}
	k.mu.Unlock()
}

// Changed is closed once the current epoch is no longer epoch (at once if
// it is not now): what follows etcd's history of epoch (a Watch stream)
// ends there, since the history it follows was replaced by a restore.
func (k *Keeper) Changed(epoch int64) <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.epoch != epoch {
		return closedChan
	}
	return k.changed
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// ErrChanged matches every *ChangedError.
var ErrChanged = errors.New("epoch: the token epoch changed")

// ChangedError says that what a caller follows or resumes is of token
// epoch From, and the current epoch is To: etcd was restored from a backup
// and the history of From is gone. Start over from the current state.
type ChangedError struct{ From, To int64 }

func (e *ChangedError) Error() string {
	return fmt.Sprintf("epoch: etcd was restored from a backup: the history of token epoch %d is gone, the current epoch is %d; start over from the current state (start_revision 0)", e.From, e.To)
}

// Is makes errors.Is(err, ErrChanged) hold.
func (e *ChangedError) Is(target error) bool { return target == ErrChanged }

// Check checks etcd's history once: a restore found raises the epoch before
// Check returns. On an error the Keeper stays (or becomes) paused until a
// check succeeds.
func (k *Keeper) Check(ctx context.Context) error {
	return k.checkSince(ctx, k.started.Load())
}

// checkSince makes sure a check started after the seen-th has completed:
// the caller's own, or one that another caller ran meanwhile.
func (k *Keeper) checkSince(ctx context.Context, seen int64) error {
	k.checkMu.Lock()
	defer k.checkMu.Unlock()
	if k.started.Load() > seen {
		k.mu.Lock()
		defer k.mu.Unlock()
		if k.paused != "" {
			return &PausedError{Reason: k.paused}
		}
		if time.Now().After(k.until) {
			return errors.New("the last check failed")
		}
		return nil
	}
	k.started.Add(1)
	start := time.Now()
	if err := k.check(ctx); err != nil {
		// An etcd that does not answer may come back restored, and what
		// followed it (the holder view) would answer from the history
		// before: nothing is served until a check succeeds again
		// (TestRestoreFencesOldTokens/NoBump/RunningCoordinator saw a
		// stale token validate when a failed check paused nothing).
		k.pause("the last check of etcd's history failed: " + err.Error())
		return err
	}
	k.mu.Lock()
	k.until = start.Add(k.validity())
	k.mu.Unlock()
	return nil
}

// validity is how long a successful check keeps the gate open from its
// start: three intervals and a check's time, so that one late check
// pauses nothing (a failed one does), and an etcd that went away for longer
// than that is never served before a check.
func (k *Keeper) validity() time.Duration { return 3*k.every + k.timeout() }

// timeout bounds one check: a call to an etcd that went away waits for its
// deadline.
func (k *Keeper) timeout() time.Duration {
	return min(max(2*k.every, 500*time.Millisecond), 5*time.Second)
}

// Run checks etcd every interval until ctx ends (an answer that looks like
// a restore checks at once, in Epoch).
func (k *Keeper) Run(ctx context.Context) {
	t := time.NewTicker(k.every)
	defer t.Stop()
	for {
		if err := k.Check(ctx); err != nil && ctx.Err() == nil {
			k.log.Warn("epoch: check of etcd's history failed; granting and validating paused", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// RunInBackground runs Run in a goroutine; stop ends it and waits.
func (k *Keeper) RunInBackground() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); k.Run(ctx) }()
	return func() { cancel(); <-done }
}

func (k *Keeper) pause(reason string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.paused = reason
}
