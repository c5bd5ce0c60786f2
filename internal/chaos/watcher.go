package chaos

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// watcher follows one lock name with Watch streams the way a client of the
// API resumes them: each stream runs for a while and is dropped, the next
// one resumes from the last revision seen + 1; OUT_OF_RANGE (that revision
// was compacted) starts over from the current state. Now and then it asks
// for start_revision 2, which the compactor has long removed: that must
// answer OUT_OF_RANGE, before any event. Every stream is recorded as a
// Watch op (so the answer checks see its code); what it saw is checked as
// it arrives (see watcher.saw).
type watcher struct {
	w      *Workload
	c      *Client // for the replica choice and the recording
	rng    *mrand.Rand
	next   int64 // the start revision of the next stream (0: current state)
	probed bool  // a stream from a compacted revision ran
	// lastRev and lastTok: the highest revision and granted token seen.
	lastRev, lastTok int64
}

// WatchReport sums up the watchers' streams.
type WatchReport struct {
	// Resumes: streams from a revision (not a probe); CompactedProbes:
	// streams from a compacted revision answered OUT_OF_RANGE.
	Streams, Events, Resumes, OutOfRange, CompactedProbes int
	// Violations: an event out of order or before its start revision, a
	// token going back, a compacted start revision not answered
	// OUT_OF_RANGE.
	Violations []string
}

type watchReports struct {
	mu sync.Mutex
	r  WatchReport
}

func (wr *watchReports) add(f func(*WatchReport)) {
	wr.mu.Lock()
	f(&wr.r)
	wr.mu.Unlock()
}

// Watches is the watchers' report so far.
func (w *Workload) Watches() WatchReport {
	w.watches.mu.Lock()
	defer w.watches.mu.Unlock()
	r := w.watches.r
	r.Violations = append([]string(nil), r.Violations...)
	return r
}

func (wt *watcher) violation(format string, args ...any) {
	msg := fmt.Sprintf("watch %q: ", wt.c.name) + fmt.Sprintf(format, args...)
	wt.w.watches.add(func(r *WatchReport) { r.Violations = append(r.Violations, msg) })
}

func (wt *watcher) loop(ctx context.Context) {
	for ctx.Err() == nil {
		start := wt.next
		// The first stream once the compactor ran, then one in four.
		probe := wt.w.Compacted != nil && wt.w.Compacted() >= 2 && (!wt.probed || wt.rng.IntN(4) == 0)
		if probe {
			start, wt.probed = 2, true
		}
		wt.stream(ctx, start, probe, time.Duration(200+wt.rng.IntN(1300))*time.Millisecond)
		sleep(ctx, time.Duration(wt.rng.IntN(100))*time.Millisecond)
	}
}

// stream runs one Watch from start for about d and records it.
func (wt *watcher) stream(ctx context.Context, start int64, probe bool, d time.Duration) {
	sctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	op := Op{Client: wt.c.id, Name: wt.c.name, Kind: Watch, Token: start, Call: wt.w.Rec.Now()}
	events := 0
	st, err := wt.c.LC().Watch(sctx, &coordinatorv1.WatchRequest{Name: wt.c.name, StartRevision: start})
	for err == nil {
		var ev *coordinatorv1.WatchResponse
		if ev, err = st.Recv(); err == nil {
			events++
			if probe {
				wt.violation("start_revision %d is compacted, yet the stream sent %v", start, ev)
				continue
			}
			wt.saw(start, ev)
		}
	}
	// own: the stream's time ran out, or the run ended (ctx); cutOff: the
	// run's end cancelled it. A probe the run cut off is not judged: it had
	// no time to be answered (seed 110113 failed on a probe cancelled at
	// the end of the run, as if the server had answered CANCELLED). What
	// the server answered before is judged as ever.
	own := sctx.Err() != nil
	code := Code(err)
	cutOff := ctx.Err() != nil && (code == codes.Canceled || code == codes.DeadlineExceeded)
	switch {
	case code == codes.OutOfRange:
		err = nil
		op.Outcome = Failed
		op.Code = code
		op.Err = "OUT_OF_RANGE"
		wt.next, wt.lastRev = 0, max(wt.lastRev, start-1)
	case own && (code == codes.DeadlineExceeded || code == codes.Canceled) && probe && events == 0:
		// No answer in time: etcd could not serve the read (no quorum, a
		// partition); a compacted start is refused as soon as it can.
		op.Outcome = Ambiguous
		op.Code = code
		op.Err = err.Error()
	case own && (code == codes.DeadlineExceeded || code == codes.Canceled):
		err = nil
		op.Outcome = OK // we ended it
	default:
		op.Outcome = Ambiguous
		op.Code = code
		op.Err = err.Error()
		wt.c.home++
	}
	if probe && !cutOff && op.Outcome == Ambiguous && code != codes.Unavailable && code != codes.DeadlineExceeded {
		wt.violation("start_revision %d is compacted, yet the stream ended with %v, want OUT_OF_RANGE", start, code)
	}
	op.Return = wt.w.Rec.Now()
	wt.w.Rec.Add(op)
	wt.w.watches.add(func(r *WatchReport) {
		r.Streams++
		r.Events += events
		if start > 0 && !probe {
			r.Resumes++
		}
		if code == codes.OutOfRange {
			r.OutOfRange++
			if probe {
				r.CompactedProbes++
			}
		}
	})
}

// saw checks one event of a stream from start against everything seen
// before, and advances the resume point past it.
func (wt *watcher) saw(start int64, ev *coordinatorv1.WatchResponse) {
	rev, tok := ev.GetRevision(), ev.GetHolder().GetToken()
	switch {
	case start > 0 && rev < start:
		wt.violation("a stream from revision %d sent an event of revision %d: %v", start, rev, ev)
	case rev < wt.lastRev:
		wt.violation("revision %d after %d: %v", rev, wt.lastRev, ev)
	case ev.GetKind() == coordinatorv1.WatchResponse_KIND_ACQUIRED && tok <= wt.lastTok:
		wt.violation("acquired token %d after %d: %v", tok, wt.lastTok, ev)
	case ev.GetKind() == coordinatorv1.WatchResponse_KIND_CURRENT && tok != 0 && tok < wt.lastTok:
		wt.violation("current holder %d after token %d was granted: %v", tok, wt.lastTok, ev)
	}
	wt.lastRev = max(wt.lastRev, rev)
	if ev.GetKind() == coordinatorv1.WatchResponse_KIND_ACQUIRED || ev.GetKind() == coordinatorv1.WatchResponse_KIND_CURRENT {
		wt.lastTok = max(wt.lastTok, tok)
	}
	wt.next = rev + 1
}
