// Package fence validates fencing tokens against the current holder of a
// lock, linearizably, and keeps per-resource high-water marks so that a
// protected resource can refuse stale writes.
//
// It is the coordinator's end of ValidateToken; the resource's end is the
// public package fence (its Gate asks through a fence.TokenValidator). It
// stands on internal/keyspace for its keys and input rules and on
// internal/etcdx for etcd's errors and its private watch stream, not on
// internal/lease: lease writes the queues, fence only reads them.
package fence

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/etcdx"
	"github.com/coordinatord/coordinatord/internal/keyspace"
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
	// Fenced: the resource has accepted a greater token; this one is
	// refused forever.
	Fenced
)

func (r Reason) String() string {
	switch r {
	case Current:
		return "current"
	case Superseded:
		return "superseded"
	case NotHeld:
		return "not held"
	case Fenced:
		return "fenced"
	}
	return "unknown"
}

// ErrNoMark: the resource has no high-water mark (no token was ever
// validated for it).
var ErrNoMark = errors.New("fence: no high-water mark for this resource: no token has been validated for it yet")

// errConflict: the optimistic transaction lost every retry to concurrent
// writers of the same mark or queue.
var errConflict = errors.New("fence: too much contention on the resource's high-water mark")

// testHookBeforeAdvance, if set, runs between the read and the transaction
// that advances a mark (tests change the lock's holder there).
var testHookBeforeAdvance func()

// maxAttempts bounds the optimistic retries of one validation. A conflict
// needs a concurrent change of the holder or of the mark, and only the
// current holder's token advances a mark, so a few attempts suffice.
const maxAttempts = 16

// Verdict is the answer to Validate.
type Verdict struct {
	Valid  bool
	Reason Reason
	// CurrentToken is the current holder's token, 0 when the lock is free.
	CurrentToken int64
	// Mark is the resource's high-water mark after the call, 0 without a
	// resource or when the resource has none.
	Mark int64
}

// Validator checks tokens against etcd.
type Validator struct {
	cli   *clientv3.Client
	ks    keyspace.Keyspace
	reads reads
	view  atomic.Pointer[view] // set while Follow runs
	// viewed and readBack count validations answered from the view and
	// those that read etcd themselves while it was running.
	viewed, readBack atomic.Int64
	markLimit        int64 // WithMarkLimit
	creating         creators
	epochs           Epochs // WithEpochs
}

// Follow keeps a watch-fed view of every lock's holder until ctx ends, so
// that validations without a resource share one barrier read instead of a
// range read each (see view). It returns nil when ctx ends; while it is not
// running, or has not caught up, validations read etcd themselves. At most
// one Follow per Validator.
func (v *Validator) Follow(ctx context.Context, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := newView(v.cli, v.ks.Locks())
	if !v.view.CompareAndSwap(nil, w) {
		return errors.New("fence: Follow is already running")
	}
	defer v.view.Store(nil)
	return w.run(ctx, log)
}

// FollowInBackground runs Follow in a goroutine; stop ends it and waits.
func (v *Validator) FollowInBackground(log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = v.Follow(ctx, log) }()
	return func() { cancel(); <-done }
}

// New returns a Validator for the locks laid out by ks; marks live under
// ks.Marks(), their per-identity counters at ks.MarkCount (the layout is
// internal/keyspace's). Without WithMarkLimit, an identity may create
// DefaultMarkLimit marks.
func New(cli *clientv3.Client, ks keyspace.Keyspace, opts ...Option) *Validator {
	v := &Validator{cli: cli, ks: ks, reads: reads{cli: cli, barrier: ks.Barrier()}, markLimit: DefaultMarkLimit, epochs: epochZero{}}
	for _, o := range opts {
		o(v)
	}
	return v
}

// Validate tells whether token is the current holder's token for name. The
// read is linearizable: Valid means the token was current at some instant
// during the call. A stale token is not an error.
//
// With a resource (non-empty), the token must also be at or above the
// resource's high-water mark; a valid answer advances the mark to the token,
// in the same etcd transaction that asserts the token is still the holder's.
// A token below the mark answers Fenced, whatever the lock's state.
//
// A mark belongs to the lock that created it: a validation against the
// resource with another lock's name is refused with a *MarkOwnedError, and
// changes nothing. Creating a mark counts against the caller's cap (see
// AsIdentity, WithMarkLimit): beyond it, a *TooManyMarksError, and nothing
// is written.
func (v *Validator) Validate(ctx context.Context, name string, token int64, resource string, opts ...ValidateOption) (Verdict, error) {
	if err := keyspace.ValidateName("name", name, false); err != nil {
		return Verdict{}, err
	}
	if err := keyspace.ValidateToken(token); err != nil {
		return Verdict{}, err
	}
	if resource == "" {
		return v.validate(ctx, name, token)
	}
	if err := keyspace.ValidateName("resource", resource, false); err != nil {
		return Verdict{}, err
	}
	var o validateOptions
	for _, opt := range opts {
		opt(&o)
	}
	ih := identityHash(o.identity)
	// Lost advances are bounded by maxAttempts; lost creations are not
	// counted there: each one means another creation by the same identity
	// won (progress, bounded by its cap), so a burst of one identity's
	// first validations is served rather than refused as contention.
	for lost, tries := 0, 0; lost < maxAttempts && tries < maxCreateAttempts; tries++ {
		verdict, res, err := v.validateAt(ctx, name, token, resource, ih)
		switch {
		case err != nil || res == attemptDone:
			return verdict, err
		case res == attemptLostAdvance:
			lost++
		}
	}
	return Verdict{}, fmt.Errorf("%w: %w (resource %q); retry", etcdx.ErrUnavailable, errConflict, resource)
}

// maxCreateAttempts bounds all attempts of one validation, creations
// included.
const maxCreateAttempts = 256

// attempt is how one optimistic attempt ended.
type attempt int

const (
	attemptDone        attempt = iota // answered (or failed)
	attemptLostAdvance                // the mark or holder changed: retry
	attemptLostCreate                 // another creation won: retry
)

func (v *Validator) validate(ctx context.Context, name string, token int64) (Verdict, error) {
	if w := v.view.Load(); w != nil && w.following() {
		rev, err := v.reads.revision()
		if err == nil && ctx.Err() != nil {
			err = ctx.Err()
		}
		if err != nil {
			return Verdict{}, v.etcdErr(ctx, "validate", err)
		}
		if hs, ok := w.holders(ctx, v.ks.Queue(name), rev); ok {
			v.viewed.Add(1)
			e, err := v.epochs.Epoch(ctx, rev)
			if err != nil {
				return Verdict{}, err
			}
			return hs.inEpoch(e).judge(token, 0), nil
		}
		v.readBack.Add(1)
	}
	r, err := v.reads.get(clientv3.OpGet(v.ks.Queue(name), clientv3.WithFirstCreate()...))
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	if err != nil {
		return Verdict{}, v.etcdErr(ctx, "validate", err)
	}
	var cur int64
	if len(r.Kvs) > 0 {
		cur = r.Kvs[0].CreateRevision
		if s, _ := keyspace.ShapeOf(r.Kvs[0].Value); !s.Plain() {
			e, err := v.epochs.Epoch(ctx, r.Header.Revision)
			if err != nil {
				return Verdict{}, err
			}
			if te, trev := keyspace.SplitToken(token); te == e && cur < trev {
				// A semaphore's or readers' queue: token may be a later
				// holder's. Read the entries up to it (at a later revision:
				// still inside the call).
				q, err := v.cli.Get(ctx, v.ks.Queue(name), clientv3.WithPrefix(), clientv3.WithMaxCreateRev(trev),
					clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
				if err != nil {
					return Verdict{}, v.etcdErr(ctx, "validate", err)
				}
				return judgeAmong(token, tokensIn(e, holderTokens(q.Kvs)), 0), nil
			}
		}
	}
	curTok, err := v.holderToken(ctx, cur, r.Header.Revision)
	if err != nil {
		return Verdict{}, err
	}
	return judge(token, curTok, 0), nil
}

// tokensIn are the tokens, in epoch e, of the create revisions revs.
func tokensIn(e int64, revs []int64) []int64 {
	out := make([]int64, len(revs))
	for i, r := range revs {
		out[i] = keyspace.TokenOf(e, r)
	}
	return out
}

// holderTokens are the create revisions of the holders among a queue's
// entries in create-revision order (their tokens in epoch 0: tokensIn).
func holderTokens(kvs []*mvccpb.KeyValue) []int64 {
	shapes := make([]keyspace.Shape, len(kvs))
	for i, kv := range kvs {
		shapes[i], _ = keyspace.ShapeOf(kv.Value)
	}
	out := make([]int64, keyspace.Holders(shapes))
	for i := range out {
		out[i] = kvs[i].CreateRevision
	}
	return out
}

// judgeAmong is judge for a queue of several holders (hs, oldest first;
// none: free): Current if token is one of them; Superseded if a holder's
// token is greater; CurrentToken is the token itself when current, else
// the newest holder's.
func judgeAmong(token int64, hs []int64, mark int64) Verdict {
	if len(hs) <= 1 {
		var cur int64
		if len(hs) == 1 {
			cur = hs[0]
		}
		return judge(token, cur, mark)
	}
	newest := hs[len(hs)-1]
	if slices.Contains(hs, token) {
		return judge(token, token, mark)
	}
	return judge(token, newest, mark)
}

// judge is the verdict for token given the holder's token cur (0: free) and
// the resource's mark (0: none).
func judge(token, cur, mark int64) Verdict {
	switch {
	case token < mark:
		return Verdict{Reason: Fenced, CurrentToken: cur, Mark: mark}
	case cur == 0:
		return Verdict{Reason: NotHeld, Mark: mark}
	case cur == token:
		return Verdict{Valid: true, Reason: Current, CurrentToken: cur, Mark: mark}
	case cur > token:
		return Verdict{Reason: Superseded, CurrentToken: cur, Mark: mark}
	default:
		return Verdict{Reason: NotHeld, CurrentToken: cur, Mark: mark}
	}
}

// validateAt is one optimistic attempt: read the holder and the mark at one
// revision, then, for a valid token above the mark, advance the mark in a
// transaction that asserts nothing changed (createAt when there is no mark
// yet). ih is the caller's identity hash.
func (v *Validator) validateAt(ctx context.Context, name string, token int64, resource, ih string) (Verdict, attempt, error) {
	queue := v.ks.Queue(name)
	id := MarkID{Resource: resource}
	markKey := id.key(v.ks)
	// A read-only transaction: both reads at one linearizable revision.
	r, err := v.cli.Txn(ctx).Then(
		clientv3.OpGet(queue, clientv3.WithFirstCreate()...),
		clientv3.OpGet(markKey),
	).Commit()
	if err != nil {
		return Verdict{}, attemptDone, v.etcdErr(ctx, "validate", err)
	}
	var (
		cur       int64
		holderKey string
	)
	if kvs := r.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		cur, holderKey = kvs[0].CreateRevision, string(kvs[0].Key)
		if s, _ := keyspace.ShapeOf(kvs[0].Value); !s.Plain() {
			e, err := v.epochs.Epoch(ctx, r.Header.Revision)
			if err != nil {
				return Verdict{}, attemptDone, err
			}
			if te, trev := keyspace.SplitToken(token); te == e && cur <= trev {
				return v.validateShapedAt(ctx, name, token, e, resource, ih)
			}
		}
	}
	if cur, err = v.holderToken(ctx, cur, r.Header.Revision); err != nil {
		return Verdict{}, attemptDone, err
	}
	var (
		m      Mark
		markMR int64 // the mark key's mod revision; 0: no mark yet
	)
	if kvs := r.Responses[1].GetResponseRange().GetKvs(); len(kvs) > 0 {
		m = decodeMark(id, kvs[0])
		markMR = kvs[0].ModRevision
	}
	if markMR != 0 && m.Lock != name {
		// Another lock's resource: refused whatever the token, so that no
		// holder of one lock can raise (and fence) another lock's mark.
		return Verdict{}, attemptDone, &MarkOwnedError{Resource: resource, Lock: name, Owner: m.Lock}
	}
	verdict := judge(token, cur, m.Token)
	if !verdict.Valid || token == m.Token {
		// Refused, or the same holder again: the read alone is the answer
		// (both facts held at revision r.Header.Revision).
		return verdict, attemptDone, nil
	}
	// Advance the mark only if, at commit, the holder's key still exists
	// with create revision token (it was the lowest in the queue, and keys
	// created later have higher revisions, so it still holds), every key in
	// the queue is at or above token (redundant with the former, kept as a
	// direct statement of "token holds"; an empty queue compares as 0 and
	// fails), and nobody moved the mark. The holder compare is the one that
	// matters: the range compare alone accepts a released token once only
	// newer keys remain (TestMarkNotAdvancedWhenHolderChangesMidway).
	if testHookBeforeAdvance != nil {
		testHookBeforeAdvance()
	}
	rev := revisionOf(token) // token is current: of the current epoch
	holds := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(queue), ">", rev-1).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(holderKey), "=", rev),
	}
	return v.advance(ctx, verdict, holds, markKey, markMR, m, Mark{MarkID: id, Token: token, Lock: name, creator: ih})
}

// advance raises the mark at markKey (of mod revision markMR, 0: none yet;
// its current value m) to next.Token while holds hold: creating it
// (createAt), or moving it.
func (v *Validator) advance(ctx context.Context, verdict Verdict, holds []clientv3.Cmp, markKey string, markMR int64, m, next Mark) (Verdict, attempt, error) {
	if markMR == 0 {
		return v.createAt(ctx, verdict, holds, markKey, next)
	}
	// The creator stays (its cap counts the mark until it is deleted); an
	// advance ends any idle period retention saw.
	next.creator = m.creator
	tr, err := v.cli.Txn(ctx).If(append(holds,
		clientv3.Compare(clientv3.ModRevision(markKey), "=", markMR))...,
	).Then(clientv3.OpPut(markKey, next.encode())).Commit()
	if err != nil {
		return Verdict{}, attemptDone, v.etcdErr(ctx, "advance mark", err)
	}
	if !tr.Succeeded {
		return Verdict{}, attemptLostAdvance, nil
	}
	verdict.Mark = next.Token
	return verdict, attemptDone, nil
}

// createAt creates the resource's first mark, owned by the validated lock,
// if the token still holds (holds), nobody created the mark meanwhile, and
// the creator is under its cap: the counter read here is compared (mod
// revision) and raised in the same transaction, so no burst on any number
// of replicas creates more than the cap.
func (v *Validator) createAt(ctx context.Context, verdict Verdict, holds []clientv3.Cmp, markKey string, next Mark) (Verdict, attempt, error) {
	release, err := v.creating.acquire(ctx, next.creator)
	if err != nil {
		return Verdict{}, attemptDone, err
	}
	defer release()
	c, err := v.readCount(ctx, next.creator)
	if err != nil {
		return Verdict{}, attemptDone, err
	}
	if err := v.admit(c); err != nil {
		return Verdict{}, attemptDone, err
	}
	tr, err := v.cli.Txn(ctx).If(append(holds,
		clientv3.Compare(clientv3.ModRevision(markKey), "=", 0),
		clientv3.Compare(clientv3.ModRevision(c.key), "=", c.mr))...,
	).Then(
		clientv3.OpPut(markKey, next.encode()),
		clientv3.OpPut(c.key, strconv.FormatInt(c.n+1, 10)),
	).Commit()
	if err != nil {
		return Verdict{}, attemptDone, v.etcdErr(ctx, "create mark", err)
	}
	if !tr.Succeeded {
		return Verdict{}, attemptLostCreate, nil
	}
	verdict.Mark = next.Token
	return verdict, attemptDone, nil
}

func (v *Validator) etcdErr(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return etcdx.Classify("fence: "+op, err)
}
