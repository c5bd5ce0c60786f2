package fence

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
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
type view struct {
	cli    *clientv3.Client
	prefix string // the locks prefix

	mu      sync.Mutex
	live    bool                        // following: rev is meaningful
	rev     int64                       // every change up to rev is applied
	queues  map[string]map[string]int64 // queue prefix -> key -> create revision
	moved   chan struct{}               // closed and replaced when rev advances or live changes
	asked   bool                        // a progress request is outstanding
	request func()                      // asks the watch for progress
}

// viewWait bounds how long a validation waits for the view to catch up
// with its barrier before it reads etcd itself.
const viewWait = 250 * time.Millisecond

func newView(cli *clientv3.Client, prefix string) *view {
	return &view{cli: cli, prefix: prefix, moved: make(chan struct{})}
}

// holder returns the token of queue's holder (0: free) as of a revision at
// or after min, or false if the view cannot answer in time.
func (w *view) holder(ctx context.Context, queue string, min int64) (int64, bool) {
	deadline := time.NewTimer(viewWait)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		if !w.live {
			w.mu.Unlock()
			return 0, false
		}
		if w.rev >= min {
			var cur int64
			for _, rev := range w.queues[queue] {
				if cur == 0 || rev < cur {
					cur = rev
				}
			}
			w.mu.Unlock()
			return cur, true
		}
		moved := w.moved
		ask := !w.asked
		w.asked = true
		request := w.request
		w.mu.Unlock()
		if ask {
			request()
		}
		select {
		case <-moved:
		case <-deadline.C:
			w.mu.Lock()
			w.asked = false // that request may have gone unanswered
			w.mu.Unlock()
			return 0, false
		case <-ctx.Done():
			return 0, false
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
	ctx = metadata.AppendToOutgoingContext(ctx, "coordinatord-watch", "fence-view")
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := w.follow(ctx)
		w.setLive(false)
		if ctx.Err() != nil {
			break
		}
		log.Warn("fence: the holder view stopped following etcd; validations read etcd until it is back", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	return nil
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
	r, err := w.cli.Get(wctx, w.prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	queues := map[string]map[string]int64{}
	for _, kv := range r.Kvs {
		q := queueOf(string(kv.Key))
		if queues[q] == nil {
			queues[q] = map[string]int64{}
		}
		queues[q][string(kv.Key)] = kv.CreateRevision
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
					if w.queues[q] == nil {
						w.queues[q] = map[string]int64{}
					}
					w.queues[q][key] = ev.Kv.CreateRevision
				case mvccpb.DELETE:
					delete(w.queues[q], key)
					if len(w.queues[q]) == 0 {
						delete(w.queues, q)
					}
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
