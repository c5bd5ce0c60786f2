package lease

import (
	"context"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// GrantEnd is the end of one grant, as seen in etcd's history.
type GrantEnd struct {
	Name     string
	Token    int64
	Reason   EndReason
	Revision int64 // the etcd revision of the end
	// Held is how long the grant was held: from its grant (on the clock of
	// the replica that granted it) to when the end was seen (on this
	// replica's clock); never negative. After a watch gap (etcd restart)
	// the end is seen late and Held is longer than the truth.
	Held time.Duration
}

// WatchEnds calls observe, in revision order, with every grant of every
// lock under the key prefix that ends after revision after (0: from now
// on), whichever replica granted it: released (a release with the handle,
// release-on-disconnect, a session's close), forced (ForceRelease) or
// expired (its lease ran out, or was revoked without a release). A waiter
// that gives up is not a grant and is not reported. It blocks until ctx
// ends, then returns nil.
//
// It survives etcd restarts and leader changes (the watch is resumed from
// the revision after the last one seen) and compaction (resumed at once from
// the oldest revision etcd still has, the ends in between not reported; if
// that is compacted too before the watch catches up, as with a compactor that
// keeps almost no history, from the current revision).
// It watches the range from "<prefix>ended/" to the end of "<prefix>locks/"
// with previous values: every queue-key write of every lock crosses it.
func (m *Manager) WatchEnds(ctx context.Context, after int64, observe func(GrantEnd)) error {
	from, end := m.ks.ended(""), clientv3.GetPrefixRangeEnd(m.ks.locks())
	next := int64(0)
	if after > 0 {
		next = after + 1
	}
	const minBackoff, maxBackoff = 100 * time.Millisecond, 5 * time.Second
	backoff := minBackoff
	behind := false // the last watch fell behind the compaction
	for ctx.Err() == nil {
		compacted := false
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithPrevKV(), clientv3.WithCreatedNotify()}
		if next > 0 {
			opts = append(opts, clientv3.WithRev(next))
		}
		for wr := range m.cli.Watch(wctx, from, opts...) {
			if wr.CompactRevision != 0 {
				m.log.Warn("the lock-end watch fell behind etcd's compaction: ends before the compacted revision are not counted",
					"from", next, "compacted", wr.CompactRevision)
				next = wr.CompactRevision
				if behind {
					next = 0 // from now: a watch from the past keeps losing the race
				}
				compacted = true
				break
			}
			if err := wr.Err(); err != nil {
				m.log.Debug("lock-end watch broke; resuming", "from", next, "err", err)
				break
			}
			if wr.Created && next == 0 {
				next = wr.Header.Revision + 1
			}
			if len(wr.Events) > 0 {
				m.endsOf(wr.Events, observe)
				next = wr.Events[len(wr.Events)-1].Kv.ModRevision + 1
				backoff = minBackoff
			}
		}
		cancel()
		behind = compacted
		if compacted {
			// Resume at once: after a backoff, a compactor that keeps
			// little history has compacted past next again, every time.
			backoff = minBackoff
			continue
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		backoff = min(2*backoff, maxBackoff)
	}
	return nil
}

// endsOf reports the grants that ended in evs (whole revisions, in order):
// a deleted queue key whose previous value was granted is a grant's end,
// classified by the end marker written in the same revision, if any.
func (m *Manager) endsOf(evs []*clientv3.Event, observe func(GrantEnd)) {
	endedPrefix := m.ks.ended("")
	now := m.now()
	for len(evs) > 0 {
		rev := evs[0].Kv.ModRevision
		n := 1
		for n < len(evs) && evs[n].Kv.ModRevision == rev {
			n++
		}
		group := evs[:n]
		evs = evs[n:]
		var markers map[string]string // escaped name -> "<how>:<token>"
		for _, ev := range group {
			if esc, ok := strings.CutPrefix(string(ev.Kv.Key), endedPrefix); ok && ev.Type == clientv3.EventTypePut {
				if markers == nil {
					markers = map[string]string{}
				}
				markers[esc] = string(ev.Kv.Value)
			}
		}
		for _, ev := range group {
			if ev.Type != clientv3.EventTypeDelete || ev.PrevKv == nil {
				continue
			}
			esc, ok := m.ks.nameOf(string(ev.Kv.Key))
			if !ok {
				continue
			}
			rec := decodeRecord(ev.PrevKv.Value)
			if rec.Acquired == 0 {
				continue // a waiter
			}
			e := GrantEnd{Name: unescape(esc), Token: ev.PrevKv.CreateRevision, Reason: EndExpired, Revision: rev,
				Held: max(now.Sub(unixTime(rec.Acquired)), 0)}
			if how, tok, _ := strings.Cut(markers[esc], ":"); tok == strconv.FormatInt(e.Token, 10) {
				switch how {
				case endReleased:
					e.Reason = EndReleased
				case endForced:
					e.Reason = EndForced
				}
			}
			observe(e)
		}
	}
}
