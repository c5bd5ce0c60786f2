package chaos_test

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/chaos"
)

// The chaos suite on the shard-owner core (coordinator.WithShardCore):
// members that own shards and forward the calls on the others' shards,
// optionally a relay, under the faults of the queue core that still apply
// and those of the shard core (an owner cut off past its lease, a member
// killed right after a grant, rolling restarts, skewed clocks).

// newShardEnv starts a 3-member etcd cluster and one shard-core replica per
// configuration, stopped at cleanup.
func newShardEnv(t *testing.T, cfgs []chaos.ShardConfig) *chaos.Env {
	t.Helper()
	e, err := chaos.NewShardEnv(t.TempDir(), cfgs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// holdOnOwner sends a Hold stream to the replica that owns its name's
// shard now (the client's own replica if none is known, which relays it).
func holdOnOwner(e *chaos.Env) func(string) int {
	return func(name string) int {
		for i, r := range e.Replicas {
			if r.Owns(name) {
				return i
			}
		}
		return -1
	}
}

// survivedShards is survived on the shard core: every shard is owned by a
// running member again and every running replica (members and relays)
// grants and releases a lock through itself.
func survivedShards(t *testing.T, e *chaos.Env) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.WaitShards(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range e.Replicas {
		if !r.Running() {
			continue
		}
		var g *coordinatorv1.AcquireResponse
		eventually(t, 30*time.Second, fmt.Sprintf("a grant through replica %d", r.ID), func() bool {
			var err error
			g, err = r.Client().Acquire(ctx, &coordinatorv1.AcquireRequest{Name: "probe", Ttl: durationpb.New(5 * time.Second), Wait: durationpb.New(5 * time.Second)})
			return err == nil
		})
		if rr, err := r.Client().Release(ctx, &coordinatorv1.ReleaseRequest{Name: "probe", Token: g.GetToken(), Handle: g.GetHandle()}); err != nil || !rr.GetReleased() {
			t.Fatalf("probe release through replica %d: %v %v", r.ID, rr, err)
		}
	}
	owned := map[int]int{}
	for _, r := range e.Replicas {
		if r.IsMember() {
			owned[r.ID] = r.OwnedShards()
		}
	}
	t.Logf("compaction: %d compactions, up to revision %d; shards owned by member: %v; replica warnings: %v",
		e.Compactor.Runs(), e.Compactor.Compacted(), owned, warnings(e.Replicas))
}

// shardRun is what the shard core's faults act on.
type shardRun struct {
	t   *testing.T
	e   *chaos.Env
	w   *chaos.Workload
	seq int // numbers the kill-after-grant probes' names and clients
	// revived counts the members restarted because their lease was lost.
	revived int
}

// members are the running members; all are the running replicas.
func (s *shardRun) members() []*chaos.Replica {
	var out []*chaos.Replica
	for _, r := range s.e.Replicas {
		if r.IsMember() && r.Running() {
			out = append(out, r)
		}
	}
	return out
}

func (s *shardRun) index(r *chaos.Replica) int {
	for i, x := range s.e.Replicas {
		if x == r {
			return i
		}
	}
	return -1
}

// revive waits, once a member is reachable again, for its lease to be
// renewed or found lost; a member whose lease etcd expired owns nothing
// and campaigns no more (shard.Ownership leaves a new lease to its
// caller, and nothing makes one yet): it is restarted, as an operator (or
// a liveness probe) would, so that the run keeps enough owners.
func (s *shardRun) revive(r *chaos.Replica) string {
	if !r.IsMember() || !r.Running() {
		return ""
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if r.LeaseLost() {
			r.Stop(5 * time.Second)
			if err := r.Restart(); err != nil {
				s.t.Errorf("restart of member %d after its lease was lost: %v", r.ID, err)
			}
			s.revived++
			return fmt.Sprintf("; member %d's lease was lost: restarted", r.ID)
		}
		if r.LeaseValid() {
			return ""
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Sprintf("; member %d's lease neither renewed nor lost within 5s", r.ID)
}

type shardFault struct {
	name string
	do   func(s *shardRun, rng *mrand.Rand) (string, func() error)
}

func noUndo() error { return nil }

// pick is a random element of rs (nil if none).
func pick(rng *mrand.Rand, rs []*chaos.Replica) *chaos.Replica {
	if len(rs) == 0 {
		return nil
	}
	return rs[rng.IntN(len(rs))]
}

var shardFaults = []shardFault{
	{"kill-leader", func(s *shardRun, _ *mrand.Rand) (string, func() error) {
		l, err := s.e.Cluster.KillLeader()
		if err != nil {
			return err.Error(), noUndo
		}
		return fmt.Sprintf("killed leader m%d", l), func() error { return s.e.Cluster.RestartMember(l) }
	}},
	{"kill-follower", func(s *shardRun, _ *mrand.Rand) (string, func() error) {
		l, _ := s.e.Cluster.WaitLeader(10 * time.Second)
		f := (l + 1) % s.e.Cluster.Size()
		s.e.Cluster.KillMember(f)
		return fmt.Sprintf("killed follower m%d", f), func() error { return s.e.Cluster.RestartMember(f) }
	}},
	{"partition-replica", func(s *shardRun, rng *mrand.Rand) (string, func() error) {
		r := s.e.Replicas[rng.IntN(len(s.e.Replicas))]
		r.PartitionFromEtcd()
		return fmt.Sprintf("partitioned replica %d from etcd", r.ID), func() error {
			r.Heal()
			if m := s.revive(r); m != "" {
				s.t.Logf("healed replica %d%s", r.ID, m)
			}
			return nil
		}
	}},
	{"delay-replica", func(s *shardRun, rng *mrand.Rand) (string, func() error) {
		r := s.e.Replicas[rng.IntN(len(s.e.Replicas))]
		d := time.Duration(50+rng.IntN(400)) * time.Millisecond
		r.DelayEtcd(d)
		return fmt.Sprintf("delayed replica %d's etcd traffic by %v", r.ID, d), func() error {
			r.Heal()
			if m := s.revive(r); m != "" {
				s.t.Logf("healed replica %d%s", r.ID, m)
			}
			return nil
		}
	}},
	{"reset-replica", func(s *shardRun, rng *mrand.Rand) (string, func() error) {
		r := s.e.Replicas[rng.IntN(len(s.e.Replicas))]
		r.ResetEtcd()
		return fmt.Sprintf("reset replica %d's etcd connections", r.ID), noUndo
	}},
	{"crash-replica", func(s *shardRun, rng *mrand.Rand) (string, func() error) {
		r := s.e.Replicas[rng.IntN(len(s.e.Replicas))]
		r.Crash()
		return fmt.Sprintf("crashed replica %d", r.ID), r.Restart
	}},
	// The owner of a name of the workload cut off from etcd for 3x its
	// lease TTL (every proxy blackholed): it must stop answering for its
	// shards before another member takes them over (S2), and the history
	// stays linearizable across the takeover.
	{"cut-off-owner", func(s *shardRun, rng *mrand.Rand) (string, func() error) {
		name := s.w.Names[rng.IntN(len(s.w.Names))]
		r := s.e.OwnerOf(name)
		if r == nil {
			if r = pick(rng, s.members()); r == nil {
				return "cut-off-owner: no member runs", noUndo
			}
		}
		ttl := r.ShardConfig().LeaseTTL
		if ttl == 0 {
			ttl = chaos.DefaultShardLeaseTTL
		}
		r.PartitionFromEtcd()
		end := time.Now().Add(3 * ttl)
		return fmt.Sprintf("cut member %d (owner of %q) off from etcd for %v", r.ID, name, 3*ttl), func() error {
			time.Sleep(time.Until(end))
			r.Heal()
			s.t.Logf("healed member %d%s", r.ID, s.revive(r))
			return nil
		}
	}},
	// A member killed right after it answered a grant (Crash: its etcd
	// traffic cut, then gRPC stopped, then the etcd client closed), then
	// restarted: whoever owns the shard next must honour the grant (S4):
	// that owner's own first definite answer about its token is valid, the
	// holder renews it there and releases it, and a contender waiting
	// meanwhile is not granted inside the holder's safe_until
	// (CheckSafeUntil) nor before the release while the grant is
	// honoured (porcupine).
	{"kill-after-grant", func(s *shardRun, rng *mrand.Rand) (string, func() error) {
		return killAfterGrant(s, rng), noUndo
	}},
	// A rolling restart: each member in turn stopped gracefully (its
	// shards handed over) and started again with its id and address,
	// waiting until it owns shards again, while the load runs.
	{"rolling-restart", func(s *shardRun, _ *mrand.Rand) (string, func() error) {
		var back []string
		for _, r := range s.members() {
			start := time.Now()
			cut := r.Stop(5 * time.Second)
			if err := r.Restart(); err != nil {
				s.t.Errorf("rolling restart of member %d: %v", r.ID, err)
				continue
			}
			deadline := time.Now().Add(15 * time.Second)
			for r.OwnedShards() == 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			back = append(back, fmt.Sprintf("member %d (cut %v) owns %d shards after %v", r.ID, cut, r.OwnedShards(), time.Since(start).Round(time.Millisecond)))
		}
		return fmt.Sprintf("rolling restart: %v", back), noUndo
	}},
}

// owners is who owns name's shard in each running replica's view
// (replica id: member id, and "*" if that replica holds the shard itself).
func (s *shardRun) owners(name string) map[int]string {
	out := map[int]string{}
	for _, r := range s.e.Replicas {
		o := r.Owner()
		if o == nil {
			continue
		}
		id, _, _ := o.Ownership().Owner(o.ShardOf(name))
		if r.Owns(name) {
			id += "*"
		}
		out[r.ID] = id
	}
	return out
}

// dumpShard logs what etcd holds for name's shard (its owner key and
// grants), each running replica's Describe of name, and the history of
// name so far.
func (s *shardRun) dumpShard(name string) {
	t := s.t
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var sh uint32
	for _, r := range s.e.Replicas {
		if o := r.Owner(); o != nil {
			sh = o.ShardOf(name)
			break
		}
	}
	for _, key := range []string{fmt.Sprintf("%sshards/owners/%05d", chaos.KeyPrefix, sh), fmt.Sprintf("%sshards/data/%05d/", chaos.KeyPrefix, sh)} {
		resp, err := s.e.Etcd.Get(ctx, key, clientv3.WithPrefix())
		if err != nil {
			t.Logf("  etcd %s: %v", key, err)
			continue
		}
		t.Logf("  etcd %s at revision %d: %d keys", key, resp.Header.Revision, len(resp.Kvs))
		for _, kv := range resp.Kvs {
			t.Logf("    %s create=%d mod=%d lease=%x %s", kv.Key, kv.CreateRevision, kv.ModRevision, kv.Lease, kv.Value)
		}
	}
	for _, r := range s.e.Replicas {
		if !r.Running() {
			continue
		}
		d, err := r.Client().Describe(ctx, &coordinatorv1.DescribeRequest{Name: name})
		t.Logf("  describe through replica %d: %v %v", r.ID, d, err)
	}
	for _, op := range s.w.Rec.Ops() {
		if op.Name == name {
			t.Logf("  %v", op)
		}
	}
}

// killAfterGrant is the kill-after-grant fault; it returns what it did.
func killAfterGrant(s *shardRun, rng *mrand.Rand) string {
	t := s.t
	m := pick(rng, s.members())
	if m == nil {
		return "kill-after-grant: no member runs"
	}
	s.seq++
	var name string
	for i := range 10000 {
		if n := fmt.Sprintf("k%d-%d", s.seq, i); m.Owns(n) {
			name = n
			break
		}
	}
	if name == "" {
		return fmt.Sprintf("kill-after-grant: member %d owns no shard", m.ID)
	}
	work := context.Background()
	holder := s.w.Client(2000+2*s.seq, name)
	holder.Use(s.index(m))
	g, out := holder.AcquireID(work, chaos.RequestID(), 1)
	if out != chaos.OK {
		return fmt.Sprintf("kill-after-grant: member %d did not grant %q (%v)", m.ID, name, out)
	}
	s.t.Logf("member %d granted %q token %d at %v (history time); crashing it", m.ID, name, g.GetToken(), time.Duration(s.w.Rec.Now()).Round(time.Millisecond))
	old := m.Owner() // the incarnation killed: never asked again
	crashed := time.Now()
	since := func() time.Duration { return time.Since(crashed).Round(time.Millisecond) }
	var crashTook, restartAt, restarted time.Duration
	pause := time.Duration(rng.IntN(1000)) * time.Millisecond
	down := make(chan struct{})
	go func() {
		defer close(down)
		m.Crash()
		crashTook = since()
		time.Sleep(pause)
		restartAt = since()
		if err := m.Restart(); err != nil {
			t.Errorf("restart of member %d after kill-after-grant: %v", m.ID, err)
		}
		restarted = since()
	}()
	defer func() { <-down }()
	// A contender waits for the lock through another replica (a member or
	// the relay) meanwhile: it must not be granted inside the holder's
	// safe_until (CheckSafeUntil), nor before the holder's release while
	// the grant is honoured (porcupine).
	var others []*chaos.Replica
	for _, r := range s.e.Replicas {
		if r != m && r.Running() {
			others = append(others, r)
		}
	}
	other := pick(rng, others)
	if other == nil {
		other = m
	}
	contender := s.w.Client(2001+2*s.seq, name)
	contender.Use(s.index(other))
	contender.Wait = 10 * time.Second
	cdone := make(chan struct{})
	go func() {
		defer close(cdone)
		rid := chaos.RequestID()
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
			cg, out := contender.AcquireID(work, rid, 1)
			if out == chaos.OK {
				contender.Release(work, chaos.Release, cg.GetToken(), cg.GetHandle())
				return
			}
			if out == chaos.Failed {
				return
			}
			contender.Use(s.index(other))
			time.Sleep(50 * time.Millisecond)
		}
	}()
	defer func() { <-cdone }()
	// S4: whoever owns the shard next honours the grant for a TTL from its
	// takeover. Its own answer is asked for, every 20ms from the crash on,
	// so that the first definite one comes within a poll of its load: it
	// must be valid, and the holder renews there. (Answers forwarded by
	// the other replicas may come later than that TTL: a peer's connection
	// to the restarted member's address stays in gRPC's reconnect backoff
	// for a while, and it answers SHARD_NOT_SERVED meanwhile; they are
	// recorded for porcupine, not judged here.)
	var honoured time.Duration
	var by *chaos.Replica
	var trace []string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("kill-after-grant: no owner of %q answered about token %d within 20s of member %d's crash", name, g.GetToken(), m.ID)
			for _, l := range trace {
				t.Logf("  %s", l)
			}
			return fmt.Sprintf("kill-after-grant: member %d's grant of %q never answered for", m.ID, name)
		}
		owner := s.e.OwnerOf(name)
		if owner == nil {
			continue
		}
		if o := owner.Owner(); o == nil || o == old || o.Status().Serving == 0 {
			continue
		}
		holder.Use(s.index(owner))
		ok, err := holder.Validate(work, name, g.GetToken())
		trace = append(trace, fmt.Sprintf("%v: member %d validates: %v %v; owners %v", since(), owner.ID, ok, err, s.owners(name)))
		if err != nil {
			continue
		}
		if !ok {
			t.Errorf("S4: member %d granted %q token %d (safe until %v after the crash) and was killed; the next owner, member %d, does not honour it (%v after the crash)",
				m.ID, name, g.GetToken(), g.GetSafeUntil().AsTime().Sub(crashed).Round(time.Millisecond), owner.ID, since())
			for _, l := range trace {
				t.Logf("  %s", l)
			}
			s.dumpShard(name)
			return fmt.Sprintf("kill-after-grant: member %d's grant of %q NOT honoured", m.ID, name)
		}
		honoured, by = since(), owner
		break
	}
	holder.Use(s.index(by))
	if holder.KeepAlive(work, g) == chaos.Failed {
		t.Errorf("S4: the grant of %q token %d, valid on member %d after member %d's crash, could not be renewed there (NOT_FOUND)", name, g.GetToken(), by.ID, m.ID)
	}
	// The same through the other replica (forwarded), and the release.
	holder.Use(s.index(other))
	fwdOK, fwdErr := holder.Validate(work, name, g.GetToken())
	holder.Use(s.index(other))
	if holder.Release(work, chaos.Release, g.GetToken(), g.GetHandle()) == chaos.Ambiguous {
		holder.Use(s.index(by))
		holder.Release(work, chaos.Release, g.GetToken(), g.GetHandle())
	}
	<-down
	return fmt.Sprintf("killed member %d right after it granted %q token %d (crash took %v, restart at %v, serving at %v); valid on member %d %v after the crash; through replica %d: %v %v",
		m.ID, name, g.GetToken(), crashTook, restartAt, restarted, by.ID, honoured, other.ID, fwdOK, fwdErr)
}

// logStaleAccepted logs the paused holders' writes the register accepted
// (the coordinator still called the token valid 2xTTL+1s after its last
// renewal: legal when no later grant of the name was accepted, which
// CheckRegister and porcupine judge, e.g. after a takeover, whose new
// owner honours every grant for a full TTL from the takeover, S4), with
// the history of their grant, for a reader to see why.
func logStaleAccepted(t *testing.T, w *chaos.Workload, ops []chaos.Op) {
	t.Helper()
	if w == nil {
		return
	}
	for _, wr := range w.Reg.Writes() {
		if !wr.Stale || !wr.Accepted {
			continue
		}
		t.Logf("a paused holder's write was accepted: client %d, %q token %d; its grant's history:", wr.Client, wr.Name, wr.Token)
		for _, op := range ops {
			if op.Name == wr.Name && op.Token == wr.Token {
				t.Logf("  %v", op)
			}
		}
	}
}

// namesOnMembers are n lock names, the i-th on a shard that the i-th
// member (modulo their number) owns now: every member, the skewed clocks'
// too, starts out serving the workload.
func namesOnMembers(t *testing.T, e *chaos.Env, n int) []string {
	t.Helper()
	var members []*chaos.Replica
	for _, r := range e.Replicas {
		if r.IsMember() {
			members = append(members, r)
		}
	}
	var names []string
	taken := map[string]bool{}
	for i := range n {
		m := members[i%len(members)]
		for k := 0; ; k++ {
			if k == 10000 {
				t.Fatalf("member %d owns no shard", m.ID)
			}
			name := fmt.Sprintf("%c%d", 'a'+i, k)
			if !taken[name] && m.Owns(name) {
				names, taken[name] = append(names, name), true
				break
			}
		}
	}
	return names
}

// shardSkew is the clock-rate error of members 0 (fast) and 1 (slow):
// CHAOS_SKEW, 0.05 by default.
func shardSkew(t *testing.T) float64 {
	s := os.Getenv("CHAOS_SKEW")
	if s == "" {
		return 0.05
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 || v >= 1 {
		t.Fatalf("CHAOS_SKEW=%q: want a rate error in [0, 1)", s)
	}
	return v
}

// TestChaosRandomizedShards is TestChaosRandomized on the shard-owner core
// (make chaos-shards): per run, 2 or 3 members (member 0's clock 5% fast,
// member 1's 5% slow, for the whole run) and in half the runs a relay that
// some clients use, on a 3-member etcd cluster, under a random schedule of
// etcd leader and follower kills, partitions, delays and resets of a
// replica's etcd traffic, replica crashes and restarts, an owner cut off
// from etcd for 3x its lease TTL, a member killed right after a grant it
// answered, and rolling restarts. Each run's history (locks, validations
// with and without a resource, Hold streams) must be linearizable, the
// register must see no violation and refuse at least one stale write, and
// the safe_until and answer checkers must pass. Skipped unless CHAOS_RUNS
// or CHAOS_SEED is set; CHAOS_SEED=n replays one schedule.
func TestChaosRandomizedShards(t *testing.T) {
	runs, _ := strconv.Atoi(os.Getenv("CHAOS_RUNS"))
	base := uint64(time.Now().UnixNano() % 1_000_000)
	if s := os.Getenv("CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: %v", s, err)
		}
		base, runs = v, 1
	}
	if runs == 0 {
		t.Skip("set CHAOS_RUNS (make chaos-shards) or CHAOS_SEED to run randomized fault schedules on the shard core")
	}
	d := 15 * time.Second
	if s := os.Getenv("CHAOS_DURATION"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			t.Fatal(err)
		}
	}
	var ops, amb, grants, writes, stale, faultsRun, counterOps, ran int
	var failed []uint64 // the seeds of the runs that failed (the first stops the series)
	for i := range runs {
		seed := base + uint64(i)
		ran++
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Logf("replay with: CHAOS_SEED=%d make chaos-shards", seed)
			rng := mrand.New(mrand.NewPCG(seed, 0x5eed))
			members, relay := 2+rng.IntN(2), rng.IntN(2) == 0
			cfgs := make([]chaos.ShardConfig, members)
			cfgs[0].Rate, cfgs[1].Rate = 1+shardSkew(t), 1-shardSkew(t)
			if relay {
				cfgs = append(cfgs, chaos.ShardConfig{Relay: true})
			}
			t.Logf("%d members (member 0's clock %v%% fast, member 1's %v%% slow), relay: %v", members, 100*shardSkew(t), 100*shardSkew(t), relay)
			e := newShardEnv(t, cfgs)
			counters := startCounterLoad(t, e)
			s := &shardRun{t: t, e: e}
			res := run{d: d, names: namesOnMembers(t, e, 3), perName: 3, pauseOneIn: 4, wantStale: true, seed: seed, shardCore: true}.exec(t, e, func(ctx context.Context, w *chaos.Workload) {
				s.w = w
				owners := map[string]int{}
				for _, n := range w.Names {
					if r := e.OwnerOf(n); r != nil {
						owners[n] = r.ID
					}
				}
				t.Logf("owners at the start: %v", owners)
				for pause(ctx, time.Duration(500+rng.IntN(1500))*time.Millisecond) {
					f := shardFaults[rng.IntN(len(shardFaults))]
					at := time.Duration(w.Rec.Now())
					what, undo := f.do(s, rng)
					faultsRun++
					t.Logf("[%v] %s", at.Round(time.Millisecond), what)
					pause(ctx, time.Duration(1000+rng.IntN(3000))*time.Millisecond)
					if err := undo(); err != nil {
						t.Fatalf("undo %s: %v", f.name, err)
					}
					t.Logf("[%v] undone: %s", time.Duration(w.Rec.Now()).Round(time.Millisecond), f.name)
				}
			})
			hits := counters.stopAndCheck(t)
			logStaleAccepted(t, s.w, res.ops)
			if s.revived > 0 {
				t.Logf("members restarted because their lease was lost: %d", s.revived)
			}
			ops += res.verdict.Ops
			counterOps += hits.Ops
			amb += res.verdict.Ambiguous
			grants += res.verdict.Grants
			writes += res.reg.Writes
			stale += res.reg.StaleRejected
		})
		if !ok {
			failed = append(failed, seed)
			break
		}
	}
	// The counts are of the runs that passed; a failed run's own log says
	// what it violated (issue 26, item 12: this line printed "violations:
	// 0" after a failure).
	t.Logf("chaos: %d runs (seeds %d..%d), %d faults, %d ops checked (%d ambiguous, %d grants), %d register writes, %d stale writes refused, %d counter hits checked, failed runs: %d %v",
		ran, base, base+uint64(ran)-1, faultsRun, ops, amb, grants, writes, stale, counterOps, len(failed), failed)
}

// TestShardMemberKilledAfterGrant is S4 under load: a member (2 members
// and a relay, clocks 5% fast and 5% slow) is killed right after each of
// several grants it answered, and restarted; each grant is honoured by the
// next owner of its shard (its token valid, renewed and released through
// another replica), a contender is not granted inside its safe_until, and
// the history stays linearizable. CHAOS_KILLS sets the number of kills
// (default 3).
func TestShardMemberKilledAfterGrant(t *testing.T) {
	scenario(t, false)
	kills := 3
	if v, err := strconv.Atoi(os.Getenv("CHAOS_KILLS")); err == nil && v > 0 {
		kills = v
	}
	e := newShardEnv(t, []chaos.ShardConfig{{Rate: 1 + shardSkew(t)}, {Rate: 1 - shardSkew(t)}, {Relay: true}})
	s := &shardRun{t: t, e: e}
	rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 0x5eed))
	d := scale(time.Duration(kills) * 6 * time.Second)
	run{d: d, names: namesOnMembers(t, e, 3), pauseOneIn: 4, wantStale: true, shardCore: true}.exec(t, e, func(ctx context.Context, w *chaos.Workload) {
		s.w = w
		for range kills {
			if !pause(ctx, time.Second) {
				return
			}
			t.Logf("[%v] %s", time.Duration(w.Rec.Now()).Round(time.Millisecond), killAfterGrant(s, rng))
		}
	})
}
