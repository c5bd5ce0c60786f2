package shard

import (
	"slices"

	"github.com/coordinatord/coordinatord/internal/locktable"
)

// Grant endings: a holding stream (the server's Hold) is told when its
// grant ends while it is open, so that it reports the loss as it happens
// rather than at the holder's next heartbeat. The table reports every end
// it makes final (locktable.Ready.Ended: a delete committed, or the whole
// table dropped); flush hands them here, under the shard's mutex, and they
// close the watches of those grants.

// GrantEnd is how a watched grant ended (GrantWatch.Reason).
type GrantEnd int

// How a grant ended.
const (
	// GrantReleased: released with its handle (a Release, from any
	// connection).
	GrantReleased GrantEnd = iota + 1
	// GrantExpired: no renewal within its TTL, or its max hold reached.
	GrantExpired
	// GrantForced: an administrator's ForceRelease.
	GrantForced
	// GrantDropped: not the grant but the shard's table ended here (the
	// shard was lost or handed over, a commit's outcome was unknown, the
	// replica is closing). The grant may live on in etcd, and in the next
	// table that loads it (here, or at another owner): watch again once
	// the shard serves (WatchGrant fails while it does not), or renew it.
	GrantDropped
	// GrantGone: it was not a current grant when the watch began, and its
	// end is not remembered (see recentEnds).
	GrantGone
)

func (e GrantEnd) String() string {
	switch e {
	case GrantReleased:
		return "released"
	case GrantExpired:
		return "expired"
	case GrantForced:
		return "force-released"
	case GrantDropped:
		return "dropped"
	case GrantGone:
		return "gone"
	}
	return "unknown"
}

// recentEnds is how many ends per shard are remembered for a watch that
// begins just after its grant ended (the grant's caller had not started
// watching yet when a racing release or force release committed).
const recentEnds = 128

// endings is a shard's watches and its recent ends (under shardState.mu).
type endings struct {
	watches map[grantKey][]*GrantWatch
	recent  map[grantKey]GrantEnd
	order   []grantKey // recent, oldest first
}

// grantKey names a grant: tokens never repeat for a name.
type grantKey struct {
	name  string
	token int64
}

// GrantWatch is told when one grant ends. Done is closed then, and Reason
// says how; Stop ends the watch before that.
type GrantWatch struct {
	s      *shardState
	key    grantKey
	done   chan struct{}
	reason GrantEnd // written before done is closed
}

// WatchGrant watches the grant of name with this token (a create
// revision): Done is closed when its delete commits (GrantReleased,
// GrantExpired, GrantForced) or the shard's table is dropped
// (GrantDropped). A grant that is no current holder of name any more
// is done at once, with its end if it is remembered, else GrantGone. It
// fails with a *NotServingError while the shard has no table here. Stop
// the watch once it no longer matters.
func (o *Owner) WatchGrant(name string, token int64) (*GrantWatch, error) {
	s := o.shards[o.ShardOf(name)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tab == nil || s.tab.Dead() || s.term == 0 || o.closing.Load() {
		// o.serving says which; a lease past its deadline is no reason to
		// refuse a watch (the table still reports what commits).
		if err := o.serving(s); err != nil {
			return nil, err
		}
		return nil, &NotServingError{Shard: s.n, Reason: "its state is being loaded from etcd"}
	}
	w := &GrantWatch{s: s, key: grantKey{name, token}, done: make(chan struct{})}
	if !s.tab.Validate(name, token).Valid {
		r, ok := s.ends.recent[w.key]
		if !ok {
			r = GrantGone
		}
		w.end(r)
		return w, nil
	}
	if s.ends.watches == nil {
		s.ends.watches = map[grantKey][]*GrantWatch{}
	}
	s.ends.watches[w.key] = append(s.ends.watches[w.key], w)
	return w, nil
}

// Done is closed when the grant ended (or the watch's table was dropped).
func (w *GrantWatch) Done() <-chan struct{} { return w.done }

// Reason is how the grant ended, once Done is closed (0 before).
func (w *GrantWatch) Reason() GrantEnd {
	select {
	case <-w.done:
		return w.reason
	default:
		return 0
	}
}

// Stop ends the watch; Done is then closed only if the grant ended before.
func (w *GrantWatch) Stop() {
	s := w.s
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := slices.DeleteFunc(s.ends.watches[w.key], func(x *GrantWatch) bool { return x == w })
	if len(ws) == 0 {
		delete(s.ends.watches, w.key)
	} else {
		s.ends.watches[w.key] = ws
	}
}

// end closes the watch with its reason (under s.mu).
func (w *GrantWatch) end(r GrantEnd) {
	w.reason = r
	close(w.done)
}

// grantsEnded takes a Ready's ends (flush, under s.mu): each closes the
// watches of its grant and, unless it is a drop, is remembered. A dead
// table reported every grant it showed; any watch left is ended too.
func (o *Owner) grantsEnded(s *shardState, ends []locktable.Ended) {
	o.identityEnded(s, ends) // their slots of the per-identity limit (identityheld.go)
	o.feedEnds(s, ends)      // the hold-time metrics' feed (endfeed.go)
	for _, e := range ends {
		k := grantKey{e.Name, e.Token}
		r := endOf(e)
		if r != GrantDropped {
			s.ends.remember(k, r)
		}
		for _, w := range s.ends.watches[k] {
			w.end(r)
		}
		delete(s.ends.watches, k)
	}
	if s.tab != nil && s.tab.Dead() {
		for k, ws := range s.ends.watches {
			for _, w := range ws {
				w.end(GrantDropped)
			}
			delete(s.ends.watches, k)
		}
	}
}

// remember keeps an end for a watch that begins late, forgetting the
// oldest beyond recentEnds.
func (e *endings) remember(k grantKey, r GrantEnd) {
	if e.recent == nil {
		e.recent = map[grantKey]GrantEnd{}
	}
	if _, ok := e.recent[k]; !ok {
		e.order = append(e.order, k)
	}
	e.recent[k] = r
	if len(e.order) > recentEnds {
		delete(e.recent, e.order[0])
		e.order = slices.Delete(e.order, 0, 1)
	}
}

func endOf(e locktable.Ended) GrantEnd {
	switch {
	case e.Dropped:
		return GrantDropped
	case e.Forced:
		return GrantForced
	case e.Expired:
		return GrantExpired
	}
	return GrantReleased
}
