package locktable

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The simulation drives a table through random interleavings of calls,
// clock ticks, commits, cancellations, unknown commit outcomes and
// takeovers, by seed, against a model of etcd that applies the table's
// units, and checks after every step:
//
//   - invariant 1 and 11: at every revision etcd holds at most one grant of
//     a mutex, one writer or only readers of a read-write lock, at most N
//     holders of a semaphore; and so does the table's visible state;
//   - invariant 2: successive grants of one name answer rising tokens;
//   - invariant 3 (in its table form): the table's visible holders are
//     exactly etcd's grant keys, so a validation answers what a crash cannot
//     undo;
//   - invariant 4: a release or renewal with a wrong handle, token or
//     identity changes nothing;
//   - invariant 6: once every caller is gone and every TTL has passed,
//     neither etcd nor the table holds anything;
//   - invariant 8: a request id retried by another identity never finds
//     another identity's grant;
//   - invariant 12: no unit holds two operations on one key (end markers
//     included), nor two new grants of one name;
//   - every call is answered exactly once;
//   - Ready.Ended: every grant answered Granted is reported ended exactly
//     once, when its delete commits (by the table that committed it, with
//     the reason the table decided: a release answers Released with its
//     Ended in the same Ready, a force release likewise with Forced, an
//     expiry with Expired), or is still held at the end; a table dropped by
//     Fail reports each grant it showed as Dropped, and a grant whose
//     delete reached etcd unseen (a commit of unknown outcome) is reported
//     only so;
//   - end markers (ended.go): the unit that deletes a grant puts its lock's
//     marker listing it as the table reports its end (released, forced),
//     or lists it nowhere (expired), and lists no grant it does not delete;
//   - sessions: a grant acquired through a session answers the session's
//     handle, a session holds a lock at most once (in etcd and in the
//     table), another identity's use of a session's handle is refused
//     Forbidden and changes nothing, and a session's keep-alive and close
//     (SessionGrants, then KeepAlive or Release of each) reach exactly its
//     grants.
//
// SIM_SEEDS sets how many seeds run (default 300, 40 with -short); SIM_SEED
// runs one.
func TestSimulation(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 40
	}
	if s := os.Getenv("SIM_SEEDS"); s != "" {
		seeds, _ = strconv.Atoi(s)
	}
	first := uint64(1)
	if s := os.Getenv("SIM_SEED"); s != "" {
		v, _ := strconv.ParseUint(s, 10, 64)
		first, seeds = v, 1
	}
	var kinds endKinds
	for seed := first; seed < first+uint64(seeds); seed++ {
		s := newSim(t, seed)
		s.run(1500)
		if t.Failed() {
			t.Fatalf("seed %d failed (rerun with SIM_SEED=%d)", seed, seed)
		}
		kinds.add(s.kinds)
	}
	t.Logf("ends reported: %+v", kinds)
	if seeds >= 10 && (kinds.released == 0 || kinds.expired == 0 || kinds.forced == 0 || kinds.dropped == 0 || kinds.forbidden == 0) {
		t.Fatalf("the runs reported no end of some kind: %+v", kinds)
	}
}

// endKinds counts the Ended reports of a run, by kind.
type endKinds struct{ released, expired, forced, dropped, forbidden int }

func (k *endKinds) add(o endKinds) {
	k.forbidden += o.forbidden
	k.released += o.released
	k.expired += o.expired
	k.forced += o.forced
	k.dropped += o.dropped
}

// grantID names a grant across tables: its name and token.
type grantID struct {
	name  string
	token int64
}

type simGrant struct {
	name, handle, caller string
	token                int64
	requestID            string
	session              string
}

// simSession is a session as its opener knows it.
type simSession struct {
	id, caller string
	secret     [16]byte
}

func (ss simSession) handle() string { return SessionHandle(ss.id, ss.secret) }

type sim struct {
	t           *testing.T
	seed        uint64
	rng         *rand.Rand
	now         time.Time
	tab         *Table
	term        int64
	incarnation uint64
	etcd        map[string]etcdKV // key -> value and create revision
	rev         int64
	units       []Unit // handed out, not yet committed, in order
	calls       map[CallID]simCall
	next        CallID
	held        []simGrant // grants answered, as their callers know them
	last        map[string]int64
	names       []string
	shape       map[string]shape // each name's usual shape
	step        int
	// Ready.Ended, by grant: the grants answered Granted, the ends
	// reported by a live table, those reported Dropped, and how each
	// grant's key left etcd ("commit": a unit the table was told of;
	// "unseen": a unit of unknown outcome that applied).
	answered map[grantID]bool
	ended    map[grantID]int
	dropped  map[grantID]bool
	deleted  map[grantID]string
	marked   map[grantID]EndCause // by the end marker of the unit that deleted it
	kinds    endKinds
	sessions []simSession
}

type etcdKV struct {
	value string
	rev   int64
}

type simCall struct {
	kind string
	acq  Acquire
	// for releases and renewals
	name, handle, caller string
	token                int64
	genuine              bool // the handle, token and caller are a holder's own
	// otherCaller: only the caller is wrong, on a session's grant (the
	// one case the table answers Forbidden).
	otherCaller bool
}

type shape struct {
	limit  int32
	shared bool // readers and writers both occur when true
}

var callers = []string{"alice", "bob", ""}

func newSim(t *testing.T, seed uint64) *sim {
	s := &sim{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		now: time.Unix(1_700_000_000, 0), etcd: map[string]etcdKV{}, rev: 100,
		calls: map[CallID]simCall{}, last: map[string]int64{}, shape: map[string]shape{},
		answered: map[grantID]bool{}, ended: map[grantID]int{}, dropped: map[grantID]bool{}, deleted: map[grantID]string{},
		marked: map[grantID]EndCause{}}
	for i := range 4 {
		n := fmt.Sprintf("lock/%d", i)
		s.names = append(s.names, n)
		switch i {
		case 0, 1:
			s.shape[n] = shape{limit: 1}
		case 2:
			s.shape[n] = shape{limit: 1, shared: true}
		default:
			s.shape[n] = shape{limit: 3}
		}
	}
	for i, c := range []string{"alice", "bob"} {
		ss := simSession{id: fmt.Sprintf("s%d", i), caller: c}
		for j := range ss.secret {
			ss.secret[j] = byte(s.rng.IntN(256))
		}
		s.sessions = append(s.sessions, ss)
	}
	s.term = 1
	s.tab = s.newTable(nil)
	return s
}

func (s *sim) newTable(loaded []Loaded) *Table {
	s.incarnation++
	tab := New(Config{Prefix: "/d/", EndedPrefix: "/e/", Term: s.term, Incarnation: s.incarnation, MaxWaiters: 6})
	tab.Load(s.now, loaded)
	return tab
}

func (s *sim) fatalf(format string, args ...any) {
	s.t.Helper()
	s.t.Fatalf("seed %d step %d: %s", s.seed, s.step, fmt.Sprintf(format, args...))
}

func (s *sim) run(steps int) {
	for s.step = 0; s.step < steps; s.step++ {
		s.randomStep()
		s.drain()
		s.check()
	}
	s.wind()
}

func (s *sim) randomStep() {
	switch r := s.rng.IntN(100); {
	case r < 30:
		s.acquire()
	case r < 42:
		s.release(true)
	case r < 46:
		s.release(false)
	case r < 54:
		s.keepAlive()
	case r < 57:
		s.cancel()
	case r < 58:
		s.forceRelease()
	case r < 80:
		s.commitOne()
	case r < 95:
		s.now = s.now.Add(time.Duration(s.rng.IntN(400)) * time.Millisecond)
		s.tab.Tick(s.now)
	case r < 96:
		s.retryOther()
	case r < 97:
		s.sessionCall()
	case r < 99:
		s.unknownOutcome()
	default:
		s.takeover()
	}
}

func (s *sim) newCall(c simCall) CallID {
	s.next++
	s.calls[s.next] = c
	return s.next
}

func (s *sim) acquire() {
	name := s.names[s.rng.IntN(len(s.names))]
	sh := s.shape[name]
	a := Acquire{Name: name, Caller: callers[s.rng.IntN(len(callers))], Owner: "o",
		TTL: time.Duration(200+s.rng.IntN(800)) * time.Millisecond, Limit: sh.limit}
	a.Wait = []time.Duration{0, 100 * time.Millisecond, time.Second, 5 * time.Second}[s.rng.IntN(4)]
	if sh.shared {
		a.Shared = s.rng.IntN(2) == 0
	}
	if s.rng.IntN(20) == 0 {
		a.Limit = 2 // a mismatch with the limit in force, now and then
	}
	if s.rng.IntN(4) == 0 {
		a.MaxHold = time.Duration(300+s.rng.IntN(1000)) * time.Millisecond
	}
	if s.rng.IntN(6) == 0 {
		a.LockDelay = time.Duration(s.rng.IntN(300)) * time.Millisecond
	}
	if s.rng.IntN(3) == 0 {
		a.RequestID = fmt.Sprintf("req-%d", s.rng.IntN(8))
	}
	for i := range a.Secret {
		a.Secret[i] = byte(s.rng.IntN(256))
	}
	if s.rng.IntN(4) == 0 { // through a session: its caller, its secret
		ss := s.sessions[s.rng.IntN(len(s.sessions))]
		a.Session, a.Caller, a.Secret = ss.id, ss.caller, ss.secret
	}
	a.Call = s.newCall(simCall{kind: "acquire", acq: a})
	s.tab.Acquire(s.now, a)
}

// sessionCall is a session's keep-alive or close, as the owner runs them
// on a table: SessionGrants, then a KeepAlive or a Release of each with
// the session's handle; now and then by another identity, which reaches
// nothing.
func (s *sim) sessionCall() {
	ss := s.sessions[s.rng.IntN(len(s.sessions))]
	caller := ss.caller
	if s.rng.IntN(4) == 0 {
		caller = "mallory"
	}
	hs := s.tab.SessionGrants(s.now, ss.handle(), caller)
	if caller != ss.caller && len(hs) > 0 {
		s.fatalf("another identity sees session %s's grants: %+v", ss.id, hs)
	}
	closing := s.rng.IntN(3) == 0
	for _, h := range hs {
		c := simCall{kind: "renew", name: h.Name, handle: ss.handle(), caller: caller, token: h.Token, genuine: true}
		if closing {
			c.kind = "release"
		}
		call := s.newCall(c)
		if closing {
			s.tab.Release(s.now, call, c.name, c.token, c.handle, c.caller)
		} else {
			s.tab.KeepAlive(s.now, call, c.name, c.token, c.handle, c.caller)
		}
	}
}

// retryOther sends a request id another identity used, with its exact
// parameters: it must never come back with that identity's grant.
func (s *sim) retryOther() {
	for _, h := range s.held {
		if h.requestID == "" {
			continue
		}
		other := callers[(slices.Index(callers, h.caller)+1)%len(callers)]
		a := Acquire{Name: h.name, Caller: other, Owner: "o", RequestID: h.requestID, TTL: time.Second, Limit: s.shape[h.name].limit}
		a.Call = s.newCall(simCall{kind: "acquire", acq: a})
		s.tab.Acquire(s.now, a)
		return
	}
}

func (s *sim) pickHeld() (simGrant, bool) {
	if len(s.held) == 0 {
		return simGrant{}, false
	}
	return s.held[s.rng.IntN(len(s.held))], true
}

// release sends a holder's release, genuine or with one thing wrong.
func (s *sim) release(genuine bool) {
	h, ok := s.pickHeld()
	if !ok {
		return
	}
	c := simCall{kind: "release", name: h.name, handle: h.handle, caller: h.caller, token: h.token, genuine: genuine}
	if !genuine {
		s.spoil(&c)
		c.otherCaller = h.session != "" && c.caller != h.caller
	}
	call := s.newCall(c)
	s.tab.Release(s.now, call, c.name, c.token, c.handle, c.caller)
}

func (s *sim) keepAlive() {
	h, ok := s.pickHeld()
	if !ok {
		return
	}
	c := simCall{kind: "renew", name: h.name, handle: h.handle, caller: h.caller, token: h.token, genuine: s.rng.IntN(5) > 0}
	if !c.genuine {
		s.spoil(&c)
		c.otherCaller = h.session != "" && c.caller != h.caller
	}
	call := s.newCall(c)
	s.tab.KeepAlive(s.now, call, c.name, c.token, c.handle, c.caller)
}

// spoil makes one of a release's credentials wrong.
func (s *sim) spoil(c *simCall) {
	switch s.rng.IntN(4) {
	case 0:
		c.handle = flipSecret(c.handle)
	case 1:
		c.token++
	case 2:
		c.caller += "x"
	default:
		c.name = s.names[(slices.Index(s.names, c.name)+1)%len(s.names)]
	}
}

// forceRelease ends a holder's grant by its token alone, as an admin does.
func (s *sim) forceRelease() {
	h, ok := s.pickHeld()
	if !ok {
		return
	}
	call := s.newCall(simCall{kind: "force", name: h.name, token: h.token, handle: h.handle})
	s.tab.ForceRelease(s.now, call, h.name, h.token)
}

func (s *sim) cancel() {
	for c, sc := range s.calls {
		if sc.kind == "acquire" {
			s.tab.Cancel(s.now, c)
			return
		}
	}
}

// commitOne applies the oldest unit to etcd and tells the table.
func (s *sim) commitOne() {
	if len(s.units) == 0 {
		return
	}
	u := s.units[0]
	s.units = s.units[1:]
	s.apply(u, "commit")
	s.tab.Committed(s.now, u.ID, s.rev)
}

func (s *sim) apply(u Unit, how string) {
	s.rev++
	seen := map[string]bool{}
	newGrants := map[string]bool{}
	markers := map[string]string{} // the unit's end markers, by name
	var deleted []grantID
	for _, op := range u.Ops {
		if seen[op.Key] {
			s.fatalf("unit %d holds two operations on key %s", u.ID, op.Key)
		}
		seen[op.Key] = true
		if op.Ephemeral { // an end marker: on the member's lease, not a grant
			if op.Delete || op.Key != "/e/"+op.Name {
				s.fatalf("unit %d: ephemeral op %+v is no end marker of %s", u.ID, op, op.Name)
			}
			markers[op.Name] = op.Value
			continue
		}
		if op.Delete {
			kv, ok := s.etcd[op.Key]
			if !ok {
				s.fatalf("unit %d deletes %s, which etcd does not hold", u.ID, op.Key)
			}
			s.deleted[grantID{op.Name, kv.rev}] = how
			deleted = append(deleted, grantID{op.Name, kv.rev})
			delete(s.etcd, op.Key)
			continue
		}
		if newGrants[op.Name] {
			s.fatalf("unit %d holds two new grants of %s (they would share a token)", u.ID, op.Name)
		}
		newGrants[op.Name] = true
		if _, ok := s.etcd[op.Key]; ok {
			s.fatalf("unit %d puts %s, which exists: a grant key is never reused", u.ID, op.Key)
		}
		s.etcd[op.Key] = etcdKV{value: op.Value, rev: s.rev}
	}
	s.judgeMarkers(u, markers, deleted)
}

// judgeMarkers records how the unit's end markers say its deleted grants
// ended, and checks that each marker lists only grants the unit deletes.
func (s *sim) judgeMarkers(u Unit, markers map[string]string, deleted []grantID) {
	listed := map[string]int{}
	for _, id := range deleted {
		c := MarkedEnd(markers[id.name], id.token)
		s.marked[id] = c
		if c != EndExpired {
			listed[id.name]++
		}
	}
	for name, m := range markers {
		if n := strings.Count(m, ",") + 1; n != listed[name] {
			s.fatalf("unit %d: end marker %q of %s lists %d grants, %d of its deletes", u.ID, m, name, n, listed[name])
		}
	}
}

// unknownOutcome is a commit whose answer is lost: etcd applied it or not,
// the owner cannot tell, drops the table and loads a new one once nothing
// of the old one is in flight.
func (s *sim) unknownOutcome() {
	if len(s.units) == 0 {
		return
	}
	s.tab.Fail()
	s.settleInFlight()
	s.reload()
}

// settleInFlight decides what became of the units in flight when the
// owner lost track of them. The committer sends a shard's units in order,
// one Txn at a time, and sends nothing of the shard after a Txn of unknown
// outcome (or a failed guard): so a prefix of them reached etcd in one
// Txn, applied all or none, and the rest never did.
func (s *sim) settleInFlight() {
	if n := len(s.units); n > 0 && s.rng.IntN(2) == 0 {
		for _, u := range s.units[:1+s.rng.IntN(n)] {
			s.apply(u, "unseen")
		}
	}
	s.units = nil
}

// takeover is a new owner: the old one stops, whatever it had in flight
// either committed or failed its guard, and the new one loads etcd.
func (s *sim) takeover() {
	s.tab.Fail()
	s.settleInFlight()
	s.term++
	s.reload()
}

func (s *sim) reload() {
	s.drain()
	var loaded []Loaded
	for k, kv := range s.etcd {
		r, err := DecodeRecord([]byte(kv.value))
		if err != nil {
			s.fatalf("record of %s: %v", k, err)
		}
		loaded = append(loaded, Loaded{Key: k, Token: kv.rev, Record: r})
	}
	sort.Slice(loaded, func(i, j int) bool { return loaded[i].Key < loaded[j].Key })
	s.tab = s.newTable(loaded)
	// Holders keep their handles: a grant outlives its owner.
}

// drain takes the table's output: units to the commit queue, replies
// checked against their calls.
func (s *sim) drain() {
	rd := s.tab.Ready()
	s.units = append(s.units, rd.Units...)
	ends := s.judgeEnded(rd.Ended)
	for _, r := range rd.Replies {
		c, ok := s.calls[r.Call]
		if !ok {
			s.fatalf("reply to call %d, which is not in progress (answered twice?): %+v", r.Call, r)
		}
		delete(s.calls, r.Call)
		s.judgeReply(c, r)
		s.judgeEndOfReply(c, r, ends)
	}
}

// judgeEnded checks a Ready's Ended: a live table reports a grant whose
// delete committed, once, with one reason; a dead one reports Dropped. It
// returns them by grant.
func (s *sim) judgeEnded(ends []Ended) map[grantID]Ended {
	out := map[grantID]Ended{}
	for _, e := range ends {
		id := grantID{e.Name, e.Token}
		if _, dup := out[id]; dup {
			s.fatalf("%v reported ended twice in one Ready", id)
		}
		out[id] = e
		flags := 0
		for _, f := range []bool{e.Expired, e.Forced, e.Dropped} {
			if f {
				flags++
			}
		}
		if flags > 1 {
			s.fatalf("%+v: more than one reason", e)
		}
		if e.Dropped {
			if !s.tab.Dead() {
				s.fatalf("%+v reported dropped by a live table", e)
			}
			s.dropped[id] = true
			s.kinds.dropped++
			continue
		}
		if s.tab.Dead() {
			s.fatalf("%+v reported ended by a dead table", e)
		}
		if s.deleted[id] != "commit" {
			s.fatalf("%+v reported ended, but no commit deleted its key (%q)", e, s.deleted[id])
		}
		if s.ended[id]++; s.ended[id] > 1 {
			s.fatalf("%+v reported ended %d times", e, s.ended[id])
		}
		want := EndReleased
		switch {
		case e.Expired:
			want = EndExpired
		case e.Forced:
			want = EndForced
		}
		if s.marked[id] != want {
			s.fatalf("%+v: its end marker says %v", e, s.marked[id])
		}
		switch {
		case e.Expired:
			s.kinds.expired++
		case e.Forced:
			s.kinds.forced++
		default:
			s.kinds.released++
		}
	}
	return out
}

// judgeEndOfReply checks that a release or force release that ended a
// grant comes with its Ended, of its kind.
func (s *sim) judgeEndOfReply(c simCall, r Reply, ends map[grantID]Ended) {
	if r.Outcome == Granted {
		s.answered[grantID{r.Grant.Name, r.Grant.Token}] = true
		return
	}
	if !r.Released || (c.kind != "release" && c.kind != "force") {
		return
	}
	e, ok := ends[grantID{c.name, c.token}]
	switch {
	case !ok:
		s.fatalf("%s of %s %d answered released without its Ended", c.kind, c.name, c.token)
	case c.kind == "force" && !e.Forced:
		s.fatalf("force release of %s %d reported as %+v", c.name, c.token, e)
	case c.kind == "release" && (e.Forced || e.Expired || e.Dropped):
		s.fatalf("release of %s %d reported as %+v", c.name, c.token, e)
	}
}

// checkEnded is Ready.Ended's rule at the end of a run: every grant
// answered is reported ended exactly once by a live table if a commit it
// was told of deleted its key, never if its delete reached etcd unseen
// (then it was reported Dropped), and not at all while etcd holds it.
func (s *sim) checkEnded() {
	for id := range s.answered {
		switch s.deleted[id] {
		case "commit":
			if s.ended[id] != 1 {
				s.fatalf("%v: deleted by a commit, reported ended %d times", id, s.ended[id])
			}
		case "unseen":
			if s.ended[id] != 0 || !s.dropped[id] {
				s.fatalf("%v: deleted unseen, reported ended %d times, dropped %v", id, s.ended[id], s.dropped[id])
			}
		default:
			if s.ended[id] != 0 {
				s.fatalf("%v: still held, reported ended %d times", id, s.ended[id])
			}
		}
	}
}

func (s *sim) judgeReply(c simCall, r Reply) {
	switch c.kind {
	case "acquire":
		s.judgeAcquire(c.acq, r)
	case "release":
		if r.Outcome == Forbidden && c.otherCaller {
			s.kinds.forbidden++
			return // a session's grant, by another identity
		}
		if r.Outcome != Released && r.Outcome != Unavailable {
			s.fatalf("release answered %v", r.Outcome)
		}
		if r.Released && !c.genuine {
			s.fatalf("a release with a wrong credential ended a grant: %+v", c)
		}
		if r.Released {
			s.forgetHeld(c.name, c.token)
		}
	case "force":
		if r.Outcome != Released && r.Outcome != Unavailable {
			s.fatalf("force release answered %v", r.Outcome)
		}
		if r.Released {
			s.forgetHeld(c.name, c.token)
		}
	case "renew":
		if r.Outcome == Renewed && !c.genuine {
			s.fatalf("a renewal with a wrong credential renewed a grant: %+v", c)
		}
		if r.Outcome == Forbidden {
			if !c.otherCaller {
				s.fatalf("a renewal answered Forbidden, not by another identity on a session's grant: %+v", c)
			}
			s.kinds.forbidden++
		}
	}
}

func (s *sim) judgeAcquire(a Acquire, r Reply) {
	if r.Outcome != Granted {
		return
	}
	g := r.Grant
	if g.Name != a.Name || g.Token <= 0 || g.Handle == "" {
		s.fatalf("grant %+v for %+v", g, a)
	}
	if a.Session != "" && g.Handle != SessionHandle(a.Session, a.Secret) {
		s.fatalf("a grant through session %s answered handle %q, not the session's", a.Session, g.Handle)
	}
	for _, h := range s.held {
		if h.handle == g.Handle && h.caller != a.Caller {
			s.fatalf("%q got %q's grant by its request id", a.Caller, h.caller)
		}
	}
	if g.Resumed {
		return
	}
	if g.Token <= s.last[a.Name] {
		s.fatalf("grant of %s answered token %d after %d", a.Name, g.Token, s.last[a.Name])
	}
	s.last[a.Name] = g.Token
	s.held = append(s.held, simGrant{name: a.Name, handle: g.Handle, caller: a.Caller, token: g.Token, requestID: a.RequestID, session: a.Session})
}

// forgetHeld forgets the released grant of name and token (a session's
// grants share one handle).
func (s *sim) forgetHeld(name string, token int64) {
	s.held = slices.DeleteFunc(s.held, func(h simGrant) bool { return h.name == name && h.token == token })
}

// check compares the table's visible holders with etcd's keys and checks
// exclusion on both.
func (s *sim) check() {
	if s.tab.Dead() {
		return
	}
	byName := map[string][]Record{}
	tokens := map[string][]int64{}
	for k, kv := range s.etcd {
		r, _ := DecodeRecord([]byte(kv.value))
		if !strings.HasPrefix(k, "/d/"+r.Name+"/") {
			s.fatalf("key %s holds a record of %s", k, r.Name)
		}
		byName[r.Name] = append(byName[r.Name], r)
		tokens[r.Name] = append(tokens[r.Name], kv.rev)
	}
	for name, rs := range byName {
		s.exclusive(name, rs)
		sessions := map[string]bool{}
		for _, r := range rs {
			if r.Session != "" && sessions[r.Session] {
				s.fatalf("%s: session %s holds it twice", name, r.Session)
			}
			sessions[r.Session] = true
		}
	}
	for _, name := range s.names {
		hs, _ := s.tab.Describe(name)
		var got []int64
		for _, h := range hs {
			got = append(got, h.Token)
		}
		want := tokens[name]
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			s.fatalf("%s: the table shows holders %v, etcd holds %v", name, got, want)
		}
		for _, tok := range want {
			if v := s.tab.Validate(name, tok); !v.Valid {
				s.fatalf("%s: token %d is in etcd but validates %+v", name, tok, v)
			}
		}
		if len(want) > 0 {
			if v := s.tab.Validate(name, slices.Min(want)-1); v.Valid {
				s.fatalf("%s: an older token validates", name)
			}
		}
	}
}

// exclusive checks one name's grants in etcd against its shape.
func (s *sim) exclusive(name string, rs []Record) {
	limit := max(rs[0].Limit, 1)
	writers, readers, slots := 0, 0, map[int32]bool{}
	for _, r := range rs {
		if max(r.Limit, 1) != limit {
			s.fatalf("%s: grants with limits %d and %d", name, limit, r.Limit)
		}
		if r.Shared {
			readers++
		} else {
			writers++
		}
		if slots[r.Slot] {
			s.fatalf("%s: two holders in slot %d", name, r.Slot)
		}
		slots[r.Slot] = !r.Shared || limit > 1
	}
	if limit > 1 && len(rs) > int(limit) {
		s.fatalf("%s: %d holders of a semaphore of %d", name, len(rs), limit)
	}
	if limit == 1 && (writers > 1 || (writers == 1 && readers > 0)) {
		s.fatalf("%s: %d writers and %d readers at once", name, writers, readers)
	}
}

// wind ends the run: every waiting call is cancelled, time passes every
// TTL, every unit commits; nothing may be left in etcd or the table.
func (s *sim) wind() {
	for c, sc := range s.calls {
		if sc.kind == "acquire" {
			s.tab.Cancel(s.now, c)
		}
	}
	for range 200 {
		s.drain()
		for len(s.units) > 0 {
			s.commitOne()
			s.drain()
		}
		s.now = s.now.Add(500 * time.Millisecond)
		s.tab.Tick(s.now)
	}
	s.drain()
	if len(s.etcd) != 0 {
		s.fatalf("orphans in etcd after every caller left: %v", keys(s.etcd))
	}
	if len(s.tab.locks) != 0 || len(s.tab.grants) != 0 || len(s.tab.waiting) != 0 || len(s.tab.calls) != 0 {
		s.fatalf("the table still holds %d locks, %d grants, %d waiters, %d calls", len(s.tab.locks), len(s.tab.grants), len(s.tab.waiting), len(s.tab.calls))
	}
	if len(s.calls) != 0 {
		s.fatalf("%d calls never answered", len(s.calls))
	}
	s.checkEnded()
}

func keys(m map[string]etcdKV) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// flipSecret changes one character in the middle of a handle's secret.
func flipSecret(h string) string {
	b := []byte(h)
	i := len(b) - 8
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}
