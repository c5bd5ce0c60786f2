package fence

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/etcdx"
	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// view is a watch-fed copy of every lock queue's keys (their create
// revisions: the lowest is the holder's token), so that a validation needs
// no range read of its own. It stays linearizable with one shared barrier:
// a validation first takes a linearizable read's revision B (shared by the
// validations in flight, as before), then waits until the view has applied
// every change up to some revision V >= B, and answers from the view. The
// state at V was current at an instant inside the call (B was current at
// the barrier, after the call began; V >= B was committed before it is
// seen). When the view is not following (starting, watch broken, compacted)
// or does not catch up within viewWait, the validation reads etcd itself.
// It relies on etcd's watch guarantee: on a live watch, every event, in
// revision order, none missing (a stream that loses data breaks, and
// clientv3 resumes it from the next revision expected).
type view struct {
	cli    *clientv3.Client
	prefix string // the locks prefix

	mu      sync.Mutex
	live    bool          // following: rev is meaningful
	rev     int64         // every change up to rev is applied
	queues  queueIndex    // every queue's keys
	moved   chan struct{} // closed and replaced when rev advances or live changes
	asked   bool          // a progress request is outstanding
	request func()        // asks the watch for progress
}

// viewWait bounds how long a validation waits for the view to catch up
// with its barrier before it reads etcd itself.
const viewWait = 250 * time.Millisecond

// holderSet is a queue's holders: the oldest's token (0: free) and, for
// a semaphore or readers, every holder's, oldest first (nil for a mutex:
// the oldest alone holds, and the view's hot path allocates nothing).
type holderSet struct {
	oldest int64
	all    []int64
}

// judge is the verdict for token against the holders and a mark.
func (h holderSet) judge(token, mark int64) Verdict {
	if h.all == nil {
		return judge(token, h.oldest, mark)
	}
	return judgeAmong(token, h.all, mark)
}

// inEpoch is the holder set with its create revisions turned into the
// tokens of epoch e (every queue entry is of the current epoch: raising it
// deleted the others).
func (h holderSet) inEpoch(e int64) holderSet {
	if e == 0 {
		return h
	}
	var out holderSet
	if h.oldest != 0 { // 0: free, in every epoch
		out.oldest = keyspace.TokenOf(e, h.oldest)
	}
	if h.all != nil {
		out.all = tokensIn(e, h.all)
	}
	return out
}

// holdersIn are the holders among a queue's members (keyspace.Holders).
func holdersIn(ms []member) holderSet {
	var oldest member
	for i, m := range ms {
		if i == 0 || m.rev < oldest.rev {
			oldest = m
		}
	}
	if len(ms) <= 1 || oldest.shape.Plain() {
		return holderSet{oldest: oldest.rev}
	}
	return holderSet{oldest: oldest.rev, all: holdersOf(ms)}
}

// holdersOf are the tokens of the holders among a queue's members, oldest
// first.
func holdersOf(ms []member) []int64 {
	sorted := slices.SortedFunc(slices.Values(ms), func(a, b member) int { return cmp.Compare(a.rev, b.rev) })
	shapes := make([]keyspace.Shape, len(sorted))
	for i, m := range sorted {
		shapes[i] = m.shape
	}
	out := make([]int64, keyspace.Holders(shapes))
	for i := range out {
		out[i] = sorted[i].rev
	}
	return out
}

func newView(cli *clientv3.Client, prefix string) *view {
	return &view{cli: cli, prefix: prefix, moved: make(chan struct{}), queues: newQueueIndex(0)}
}

// holders returns the tokens of queue's holders, oldest first (none:
// free), as of a revision at or after min, or false if the view cannot
// answer in time.
func (w *view) holders(ctx context.Context, queue string, min int64) (holderSet, bool) {
	var deadline *time.Timer // made only if the view has to catch up
	defer func() {
		if deadline != nil {
			deadline.Stop()
		}
	}()
	for {
		w.mu.Lock()
		if !w.live {
			w.mu.Unlock()
			return holderSet{}, false
		}
		if w.rev >= min {
			hs := w.queues.holders(queue)
			w.mu.Unlock()
			return hs, true
		}
		moved := w.moved
		ask := !w.asked
		w.asked = true
		request := w.request
		w.mu.Unlock()
		if ask {
			request()
		}
		if deadline == nil {
			deadline = time.NewTimer(viewWait)
		}
		select {
		case <-moved:
		case <-deadline.C:
			w.mu.Lock()
			w.asked = false // that request may have gone unanswered
			w.mu.Unlock()
			return holderSet{}, false
		case <-ctx.Done():
			return holderSet{}, false
		}
	}
}

// advance records that every change up to rev is applied; w.mu is held.
func (w *view) advance(rev int64) {
	if rev > w.rev {
		w.rev = rev
		w.asked = false
		w.wake()
	}
}

// wake wakes every waiter to look again; w.mu is held.
func (w *view) wake() {
	close(w.moved)
	w.moved = make(chan struct{})
}

// following reports whether the view is live (a validation may wait for it).
func (w *view) following() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.live
}

// Following reports whether Follow runs and its view follows etcd now
// (validations without a resource answer from it).
func (v *Validator) Following() bool {
	w := v.view.Load()
	return w != nil && w.following()
}

func (w *view) setLive(live bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.live != live {
		w.live = live
		w.asked = false
		w.wake()
	}
}

func queueOf(key string) string {
	if i := strings.LastIndexByte(key, '/'); i >= 0 {
		return key[:i+1]
	}
	return key
}

// run follows the locks prefix until ctx ends: load, watch, and on any
// break (compaction, lost leader, member restart) start over.
func (w *view) run(ctx context.Context, log *slog.Logger) error {
	// A watch stream of its own: progress requests are answered per stream.
	ctx = etcdx.WithOwnWatchStream(ctx, "fence-view")
	var backoff time.Duration // the last wait (0: none yet)
	for ctx.Err() == nil {
		start := time.Now()
		err := w.follow(ctx)
		w.setLive(false)
		if ctx.Err() != nil {
			break
		}
		backoff = viewBackoff(backoff, time.Since(start))
		log.Warn("fence: the holder view stopped following etcd; validations read etcd until it is back", "err", err, "retryIn", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
	}
	return nil
}

// The holder view's wait before it follows etcd again after a break.
const (
	minViewBackoff = 50 * time.Millisecond
	maxViewBackoff = 5 * time.Second
	// followedLong: a follow that lasted this long was a working view, so
	// its break is a new fault, waited for from minViewBackoff again.
	followedLong = 30 * time.Second
)

// viewBackoff is the wait after a follow that lasted ran, the last wait
// having been prev (0: none): the minimum at first and after a follow that
// worked for a while, doubled while follows keep breaking at once (it never
// came back down before: after a few breaks in a process's life, every
// later break left the view off for 5 s).
func viewBackoff(prev, ran time.Duration) time.Duration {
	if prev == 0 || ran >= followedLong {
		return minViewBackoff
	}
	return min(2*prev, maxViewBackoff)
}

// follow loads the queues at one revision and applies the watch from the
// next, until the watch breaks or ctx ends.
//
// Which responses prove "every change up to r was sent": a response's
// events (each revision's events arrive together, in order), and a progress
// notification (etcd sends one only while the watch is synced). Not the
// header revision of other responses: a watch catching up from an old
// revision gets the current revision there with part of the events.
func (w *view) follow(ctx context.Context) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	r, err := w.cli.Get(wctx, w.prefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	queues := newQueueIndex(len(r.Kvs))
	for _, kv := range r.Kvs {
		key := string(kv.Key)
		shape, _ := keyspace.ShapeOf(kv.Value)
		queues.put(queueOf(key), key, kv.CreateRevision, shape)
	}
	wch := w.cli.Watch(wctx, w.prefix, clientv3.WithPrefix(), clientv3.WithRev(r.Header.Revision+1),
		clientv3.WithProgressNotify())
	w.mu.Lock()
	w.queues, w.rev = queues, 0
	w.request = func() {
		rctx, cancel := context.WithTimeout(wctx, viewWait)
		defer cancel()
		_ = w.cli.RequestProgress(rctx)
	}
	w.advance(r.Header.Revision) // the loaded state is the state at that revision
	w.mu.Unlock()
	w.setLive(true)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case wr, ok := <-wch:
			if !ok {
				return errors.New("watch closed")
			}
			if err := wr.Err(); err != nil {
				return err
			}
			if wr.Canceled {
				return errors.New("watch cancelled")
			}
			w.mu.Lock()
			var upTo int64
			for _, ev := range wr.Events {
				key := string(ev.Kv.Key)
				q := queueOf(key)
				switch ev.Type {
				case mvccpb.PUT:
					shape, _ := keyspace.ShapeOf(ev.Kv.Value)
					w.queues.put(q, key, ev.Kv.CreateRevision, shape)
				case mvccpb.DELETE:
					w.queues.del(q, key)
				}
				upTo = max(upTo, ev.Kv.ModRevision)
			}
			if wr.IsProgressNotify() {
				upTo = wr.Header.Revision
				w.asked = false // answered: a waiter still behind asks again
				w.wake()
			}
			w.advance(upTo)
			w.mu.Unlock()
		}
	}
}
