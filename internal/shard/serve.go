package shard

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/locktable"
)

// The life of a served shard: won (acquired) → loaded from etcd → serving
// → dropped when it is lost, handed over, or a commit's outcome is unknown;
// after an unknown outcome it is loaded again once none of its units is in
// flight any more (the committer sends nothing of a broken shard), so the
// new table starts from exactly what etcd holds.

// acquired is the ownership callback of a won shard: load it.
func (o *Owner) acquired(shard uint32, rev int64) {
	s := o.shards[shard]
	s.mu.Lock()
	defer s.mu.Unlock()
	o.drop(s)
	s.term = rev
	o.startLoad(s)
}

// lost is the ownership callback of a shard no longer owned: answer
// nothing more for it. In a graceful hand-over (rebalancing, Release) the
// owner key is still ours and the Guard holds while lost runs: the shard
// takes nothing new from now on (term 0: SHARD_NOT_SERVED, which the
// forwarders retry at the next owner) and its units in flight commit and
// are answered before the table is dropped. Dropped in flight, a release
// that committed was answered UNAVAILABLE and its retry at the next owner
// released nothing (coordbench's rolling restart of 3 members: 8–22 such
// releases). The wait ends when nothing is in flight, or the Guard ends (the
// lease's deadline: nothing in flight can commit then), or the Owner
// closes, and lasts at most the lease's TTL. A shard lost without a
// hand-over (its key gone, the lease lost) no longer has the Guard: its
// table is dropped at once.
func (o *Owner) lost(shard uint32) {
	s := o.shards[shard]
	s.mu.Lock()
	defer s.mu.Unlock()
	term := s.term
	s.term = 0
	for start := time.Now(); s.inflight > 0 && o.guarded(s.n, term) && o.ctx.Err() == nil && time.Since(start) < o.cfg.ttl; {
		s.mu.Unlock()
		time.Sleep(time.Millisecond)
		s.mu.Lock()
	}
	o.drop(s)
}

// guarded tells whether the Guard of shard still holds for term: its
// units can commit.
func (o *Owner) guarded(shard uint32, term int64) bool {
	m := o.current()
	if m == nil || term == 0 {
		return false
	}
	_, rev, ok := m.own.Guard(shard)
	return ok && rev == term
}

// HandOver hands every shard over gracefully (SIGTERM, Drain): new calls
// are refused from now on (SHARD_NOT_SERVED), the units in flight commit
// and are answered (until ctx ends), then one Txn deregisters the member
// and deletes its owner keys (Ownership.HandOver), so that the next owners
// campaign and load at once. The ownership view keeps following etcd
// until Close: a call still arriving here is forwarded to the next owner
// as soon as the view shows it (internal/server, forward.go). Waiters are
// answered Unavailable (they re-join elsewhere). Close calls it;
// idempotent.
func (o *Owner) HandOver(ctx context.Context) {
	o.memberMu.Lock()
	o.closing.Store(true)
	m := o.current()
	o.memberMu.Unlock()
	o.awaitQuiet(ctx)
	if ctx.Err() != nil {
		o.cancel() // out of time: lost waits for nothing more
	}
	m.own.HandOver(ctx)
}

// drop fails the shard's table: its calls in progress are answered
// Unavailable, and the results of its units in flight are ignored.
func (o *Owner) drop(s *shardState) {
	if s.tab != nil {
		s.tab.Fail()
		o.flush(s)
		o.drops.Add(1)
	}
	s.tab = nil
	s.gen++
	s.stopTimer()
	clear(s.marks)   // the next table reads its marks from etcd again (marks.go)
	s.sessions = nil // the next table loads its sessions with its grants (sessions.go)
}

// startLoad loads the shard in the background once nothing of an older
// table is in flight (under s.mu).
func (o *Owner) startLoad(s *shardState) {
	if s.loading || s.inflight > 0 || s.term == 0 || o.ctx.Err() != nil {
		return
	}
	s.loading = true
	gen, term := s.gen, s.term
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		o.load(s, gen, term)
	}()
}

// load reads the shard's grants from etcd and serves them from a new
// table, if nothing changed meanwhile; on a failed read it tries again.
func (o *Owner) load(s *shardState, gen uint64, term int64) {
	for attempt := 0; ; attempt++ {
		loaded, err := o.readShard(s.n)
		var sessions map[string]*sessionEntry
		if err == nil {
			sessions, err = o.readSessions(o.ctx, s.n, o.clock.Now())
		}
		s.mu.Lock()
		if s.gen != gen || s.term != term || o.ctx.Err() != nil {
			s.loading = false
			o.startLoad(s) // a newer term may wait for this load to end
			s.mu.Unlock()
			return
		}
		if err == nil {
			s.tab = locktable.New(locktable.Config{Prefix: o.dataPrefix(s.n), EndedPrefix: o.endedPrefix(s.n), Escape: keyspace.Escape,
				Term: term, Incarnation: o.incarnation.Add(1), MaxWaiters: o.cfg.maxWaiters})
			s.tab.Load(o.clock.Now(), loaded)
			s.sessions = sessions
			s.broken.Store(false)
			s.loading = false
			o.flush(s)
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		o.log.Warn("shard: loading a won shard from etcd failed; retrying", "shard", s.n, "err", err)
		select {
		case <-o.ctx.Done():
		case <-time.After(min(time.Duration(attempt+1)*50*time.Millisecond, time.Second)):
		}
	}
}

// readShard is every grant etcd holds for the shard.
func (o *Owner) readShard(shard uint32) ([]locktable.Loaded, error) {
	ctx, cancel := context.WithTimeout(o.ctx, 5*time.Second)
	defer cancel()
	resp, err := o.cli.Get(ctx, o.dataPrefix(shard), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := make([]locktable.Loaded, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		r, err := locktable.DecodeRecord(kv.Value)
		if err != nil {
			return nil, err
		}
		out = append(out, locktable.Loaded{Key: string(kv.Key), Token: kv.CreateRevision, Record: r})
	}
	return out, nil
}

// flush hands the table's output over (under s.mu): units to the
// committer, replies to their callers, ended grants to their watches
// (endings.go); and sets the timer to the table's next deadline.
func (o *Owner) flush(s *shardState) {
	if s.tab == nil {
		return
	}
	rd := s.tab.Ready()
	for _, u := range rd.Units {
		o.submit(s, u)
	}
	for _, r := range rd.Replies {
		if ch := s.answers[r.Call]; ch != nil {
			delete(s.answers, r.Call)
			ch <- r
		}
	}
	o.grantsEnded(s, rd.Ended)
	o.arm(s)
}

// submit sends one unit to the committer; its result comes back to
// committed with the table generation it was made by.
func (o *Owner) submit(s *shardState, u locktable.Unit) {
	ops := make([]Op, len(u.Ops))
	for i, op := range u.Ops {
		ops[i] = Op{Key: op.Key, Value: op.Value, Delete: op.Delete}
		switch {
		case op.Ephemeral: // an end marker: no grant, on the member's lease
			ops[i].Lease = o.current().lease.ID()
		case !op.Delete:
			ops[i].Conflict = "grant:" + op.Name
		}
	}
	s.inflight++
	gen, id := s.gen, u.ID
	o.com.Submit(Unit{Shard: s.n, Ops: ops, Done: func(rev int64, err error) {
		if err != nil {
			s.broken.Store(true) // before the committer builds its next Txn
		}
		s.noteStoreFull(err)
		o.committed(s, gen, id, rev, err)
	}})
}

// submitOwn sends a unit the runtime made itself (a mark's raise,
// marks.go), not the table's: in flight and, failed, breaking and
// dropping the shard exactly as the table's units do (committed). done
// runs under s.mu with the outcome and whether the unit's table is still
// the shard's.
func (o *Owner) submitOwn(s *shardState, ops []Op, done func(rev int64, err error, current bool)) {
	s.inflight++
	gen := s.gen
	o.com.Submit(Unit{Shard: s.n, Ops: ops, Done: func(rev int64, err error) {
		if err != nil {
			s.broken.Store(true) // before the committer builds its next Txn
		}
		s.noteStoreFull(err)
		s.mu.Lock()
		defer s.mu.Unlock()
		s.inflight--
		current := gen == s.gen && s.tab != nil
		if current && err != nil {
			if !errors.Is(err, ErrClosed) {
				o.log.Warn("shard: a commit failed; the shard reloads from etcd", "shard", s.n, "err", err)
			}
			o.drop(s)
		}
		done(rev, err, current)
		if s.inflight == 0 && s.tab == nil {
			o.startLoad(s)
		}
	}})
}

// committed takes a unit's result. A failure drops the table: a lost
// guard means another owner, an unknown outcome means etcd may hold what
// the table does not; either way the next table is loaded from etcd.
func (o *Owner) committed(s *shardState, gen, unit uint64, rev int64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight--
	if gen == s.gen && s.tab != nil {
		if err == nil {
			s.tab.Committed(o.clock.Now(), unit, rev)
			o.flush(s)
		} else {
			if !errors.Is(err, ErrClosed) {
				o.log.Warn("shard: a commit failed; the shard reloads from etcd", "shard", s.n, "err", err)
			}
			o.drop(s)
		}
	}
	if s.inflight == 0 && s.tab == nil {
		o.startLoad(s)
	}
}

// arm sets the shard's timer to its table's next deadline, unless an
// earlier one is set already.
func (o *Owner) arm(s *shardState) {
	next := s.tab.NextDeadline()
	if next.IsZero() || (!s.timerAt.IsZero() && !next.Before(s.timerAt)) {
		return
	}
	s.stopTimer()
	s.timerAt = next
	s.timer = time.AfterFunc(max(next.Sub(o.clock.Now()), 0), func() { o.tick(s) })
}

// tick runs the table's clock when its deadline comes.
func (o *Owner) tick(s *shardState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.timer, s.timerAt = nil, time.Time{}
	if s.tab == nil || o.ctx.Err() != nil {
		return
	}
	if !o.current().lease.Valid() {
		// Past the deadline nothing is decided; look again shortly.
		s.timerAt = o.clock.Now().Add(10 * time.Millisecond)
		s.timer = time.AfterFunc(10*time.Millisecond, func() { o.tick(s) })
		return
	}
	s.tab.Tick(o.clock.Now())
	o.flush(s)
}

func (s *shardState) stopTimer() {
	if s.timer != nil {
		s.timer.Stop()
		s.timer, s.timerAt = nil, time.Time{}
	}
}

// noteStoreFull records whether etcd refuses the shard's commits for its
// storage quota: set by a commit refused with NOSPACE, cleared by one that
// succeeds (not by the units a broken shard then refuses to send, whose
// failure says nothing of the quota).
func (s *shardState) noteStoreFull(err error) {
	switch {
	case err == nil:
		s.storeFull.Store(false)
	case errors.Is(err, rpctypes.ErrNoSpace):
		s.storeFull.Store(true)
	}
}
