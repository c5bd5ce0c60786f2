package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// The shard core's scenarios with several member replicas on the one etcd
// (-core shard; on the queue core they are skipped, with a note):
//
//   - replicas: N member replicas (-replicas, 1,3,8 by default), each a
//     coordinatord child as the daemon runs it (its own advertised address,
//     the members' shared secret, -shard-lease-ttl), the shards split over
//     them and every call on another member's shard forwarded to it; the
//     uncontended cycle with the most -clients, worker w on replica w mod N.
//     Cycles/s against one replica, and etcd's work per cycle (the etcd CPU
//     per operation of every replica count within 1.2x of each other: a
//     replica must not make etcd work more per lock).
//   - failover: see failover.go.
const (
	scReplicas = "replicas"
	scFailover = "failover"
)

// sysReplicas names the system of the replicas scenario with n replicas.
func sysReplicas(n int) string {
	if n == 1 {
		return "coordinatord, 1 replica"
	}
	return fmt.Sprintf("coordinatord, %d replicas", n)
}

// coordArgs are the arguments of a coordinatord child on etcdAddr. On the
// shard core they give it the members' lease TTL and shared secret, and a
// listen address (if any) that it also advertises to its peers; with listen
// "" it picks a free port and advertises that, as bound.
func coordArgs(cfg config, etcdAddr, secret, listen string) []string {
	args := []string{"-etcd", etcdAddr, "-core", cfg.core}
	if listen != "" {
		args = append(args, "-listen", listen)
	}
	if cfg.core == "shard" {
		if listen != "" {
			args = append(args, "-advertise", listen)
		}
		args = append(args, "-shard-lease-ttl", cfg.shardTTL.String())
		if secret != "" {
			args = append(args, "-member-secret-file", secret)
		}
	}
	return args
}

func (b *bench) coordArgs(listen string) []string {
	return coordArgs(b.cfg, b.etcd.addr, b.secret, listen)
}

// writeMemberSecret writes a random member secret (64 hex digits) to path.
func writeMemberSecret(path string) error {
	var k [32]byte
	_, _ = rand.Read(k[:]) // never fails (crypto/rand)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(hex.EncodeToString(k[:])+"\n"), 0o600)
}

// freeAddr is a loopback address with a port free now: a member that keeps
// its address across restarts listens on it.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	a := l.Addr().String()
	return a, l.Close()
}

// startMember starts a coordinatord replica listening on (and advertising)
// addr, a new free address if "". A port just released by a replica that
// stopped may be busy for a moment: it tries again for up to 5s.
func (b *bench) startMember(addr string) (*child, error) {
	if addr == "" {
		var err error
		if addr, err = freeAddr(); err != nil {
			return nil, err
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := startChild(roleCoordinator, append(b.coordArgs(addr), "-quiet-calls")...)
		if err == nil || time.Now().After(deadline) {
			return c, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// members are the running coordinatord replicas: the main child first.
func (b *bench) members() []*child { return append([]*child{b.coord}, b.extra...) }

func (b *bench) memberAddrs() []string {
	var addrs []string
	for _, c := range b.members() {
		addrs = append(addrs, c.addr)
	}
	return addrs
}

// setMembers makes n replicas run (the main child and n-1 others), starting
// the missing ones or stopping (gracefully: their shards handed over) the
// ones too many, in parallel, then waits until the shards are settled over
// them.
func (b *bench) setMembers(n int) error {
	if len(b.extra) > n-1 {
		stopping := slices.Clone(b.extra[n-1:])
		b.extra = b.extra[:n-1]
		stopAll(stopping)
	}
	if missing := n - 1 - len(b.extra); missing > 0 {
		started := make([]*child, missing)
		errs := make([]error, missing)
		var wg sync.WaitGroup
		for i := range missing {
			wg.Go(func() { started[i], errs[i] = b.startMember("") })
		}
		wg.Wait()
		for _, c := range started {
			if c != nil {
				b.extra = append(b.extra, c)
			}
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("start a replica: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return b.waitSettled(ctx)
}

// stopAll stops children gracefully, in parallel.
func stopAll(cs []*child) {
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Go(func() { stopLogged(roleCoordinator, c) })
	}
	wg.Wait()
}

// stopExtras stops every replica but the main child (gracefully); the main
// child owns every shard again.
func (b *bench) stopExtras() {
	stopAll(b.extra)
	b.extra = nil
}

// shardView is the shard core's ownership as it is stored in etcd
// (internal/shard's stored format: <prefix>shards/count holds the shard
// count; members/<id> each member, {"id","addr"}; owners/<shard, 5 digits>
// the id of the shard's owner, on the owner's lease).
type shardView struct {
	count int
	addr  map[string]string // member id -> advertised address
	owner []string          // shard -> owner's member id, "" if free
}

func readShardView(ctx context.Context, cli *clientv3.Client) (shardView, error) {
	root := coordPrefix + "shards/"
	members, owners := root+"members/", root+"owners/"
	r, err := cli.Get(ctx, root+"count")
	if err != nil {
		return shardView{}, err
	}
	if len(r.Kvs) != 1 {
		return shardView{}, fmt.Errorf("no shard count at %s (is the core not shard?)", root+"count")
	}
	v := shardView{addr: map[string]string{}}
	if v.count, err = strconv.Atoi(string(r.Kvs[0].Value)); err != nil || v.count < 1 {
		return shardView{}, fmt.Errorf("shard count %q", r.Kvs[0].Value)
	}
	v.owner = make([]string, v.count)
	r, err = cli.Get(ctx, members, clientv3.WithRange(clientv3.GetPrefixRangeEnd(owners)))
	if err != nil {
		return shardView{}, err
	}
	for _, kv := range r.Kvs {
		k := string(kv.Key)
		if id, ok := strings.CutPrefix(k, members); ok {
			var m struct {
				Addr string `json:"addr"`
			}
			if err := json.Unmarshal(kv.Value, &m); err != nil {
				return shardView{}, fmt.Errorf("member key %s: %w", k, err)
			}
			v.addr[id] = m.Addr
		} else if s, ok := strings.CutPrefix(k, owners); ok {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 || n >= v.count {
				return shardView{}, fmt.Errorf("owner key %s", k)
			}
			v.owner[n] = string(kv.Value)
		}
	}
	return v, nil
}

// settled tells why the shards are not settled over exactly the members at
// addrs (every shard owned by one of them, each owning one at least), nil
// if they are.
func (v shardView) settled(addrs []string) error {
	var live []string
	for _, a := range v.addr {
		live = append(live, a)
	}
	slices.Sort(live)
	want := slices.Sorted(slices.Values(addrs))
	if !slices.Equal(live, want) {
		return fmt.Errorf("members registered at %v, want %v", live, want)
	}
	owns := map[string]int{}
	for s, id := range v.owner {
		if _, ok := v.addr[id]; !ok {
			return fmt.Errorf("shard %d owned by %q, not a live member", s, id)
		}
		owns[id]++
	}
	if len(owns) != len(addrs) {
		return fmt.Errorf("%d of the %d members own shards", len(owns), len(addrs))
	}
	return nil
}

// ownedBy lists the shards the member at addr owns.
func (v shardView) ownedBy(addr string) []uint32 {
	var out []uint32
	for s, id := range v.owner {
		if id != "" && v.addr[id] == addr {
			out = append(out, uint32(s))
		}
	}
	return out
}

// waitSettled waits until the shards are settled over the running members
// and their owners did not change between two reads 200 ms apart.
func (b *bench) waitSettled(ctx context.Context) error {
	var prev []string
	why := errors.New("not read yet")
	for {
		v, err := readShardView(ctx, b.cl.etcd[0])
		if err == nil {
			err = v.settled(b.memberAddrs())
		}
		if err == nil && slices.Equal(prev, v.owner) {
			return nil
		}
		if err != nil {
			why, prev = err, nil
		} else {
			prev = v.owner
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("shards not settled over %d members: %w", len(b.members()), why)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// dialMembers connects to the running members: per connections to each
// (cfg.conns split over them, one at least), ordered so that worker w of a
// coordLocker on them calls member w mod len(members).
func (b *bench) dialMembers() (*clients, func(), error) {
	ms := b.members()
	per := (b.cfg.conns + len(ms) - 1) / len(ms)
	cl := &clients{}
	closeAll := func() {
		for _, gc := range cl.coordConns {
			_ = gc.Close()
		}
	}
	for range per {
		for _, m := range ms {
			gc, err := grpc.NewClient(m.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				closeAll()
				return nil, nil, err
			}
			cl.coordConns = append(cl.coordConns, gc)
			cl.coord = append(cl.coord, coordinatorv1.NewLockServiceClient(gc))
		}
	}
	return cl, closeAll, nil
}

// runShardScenarios runs the replicas and failover scenarios (on the shard
// core; skipped on the other), leaving the main child alone again.
func (b *bench) runShardScenarios(progress func(result), rotate func([]string, int) []string, rep *report) error {
	if b.cfg.core != "shard" {
		var which []string
		for _, sc := range []string{scReplicas, scFailover} {
			if b.cfg.has(sc) {
				which = append(which, sc)
			}
		}
		b.skipped = append(b.skipped, fmt.Sprintf("the %s scenario(s): the shard-owner core's (run with -core shard)", strings.Join(which, " and ")))
		return nil
	}
	defer b.stopExtras()
	if b.cfg.has(scReplicas) {
		if err := b.runReplicas(progress, rotate); err != nil {
			return fmt.Errorf("replicas: %w", err)
		}
	}
	if b.cfg.has(scFailover) {
		for r := range b.cfg.failoverReps {
			f, err := b.failover(r)
			if err != nil {
				return fmt.Errorf("failover: %w", err)
			}
			rep.failovers = append(rep.failovers, f)
			b.compact()
		}
	}
	return nil
}

// runReplicas measures the uncontended cycle with the most -clients on each
// number of replicas, the counts rotated each repetition.
func (b *bench) runReplicas(progress func(result), rotate func([]string, int) []string) error {
	n := slices.Max(b.cfg.clients)
	count := map[string]int{}
	var systems []string
	for _, k := range b.cfg.replicas {
		s := sysReplicas(k)
		if _, dup := count[s]; !dup {
			count[s] = k
			systems = append(systems, s)
		}
	}
	for r := range b.cfg.reps {
		for _, s := range rotate(systems, r) {
			k := count[s]
			t := time.Now()
			if err := b.setMembers(k); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "replicas: %d members settled in %v\n", k, time.Since(t).Round(time.Millisecond))
			cl, closeCl, err := b.dialMembers()
			if err != nil {
				return err
			}
			b.systems[s] = coordLocker{cl}
			res := b.uncontended(cell{scenario: scReplicas, clients: n, system: s}, r, "")
			closeCl()
			progress(res)
		}
	}
	return nil
}

// replicaRows compare each replica count's cycles/s with the first's.
func (rp *report) replicaRows(cmp func(sc string, clients, held int, peer, scenario, metric, label string, latency bool, pick func(agg) spread)) {
	if len(rp.cfg.clients) == 0 || len(rp.cfg.replicas) < 2 {
		return
	}
	n := slices.Max(rp.cfg.clients)
	base := rp.cfg.replicas[0]
	rate := func(a agg) spread { return a.rate }
	for _, k := range rp.cfg.replicas[1:] {
		if k == base {
			continue
		}
		cmp(scReplicas, n, 0, sysReplicas(k)+" vs "+sysReplicas(base), fmt.Sprintf("shard core, %d clients spread over the replicas, distinct names", n),
			fmt.Sprintf("%d replicas vs %d: acquire+release cycles/s", k, base), fmt.Sprintf("replicas %d: %d vs %d, cycles/s", n, k, base), false, rate)
	}
}

// replicaTargets: 3 replicas keep 0.6x one replica's cycles/s (a call on
// another member's shard is a second RPC), and etcd's CPU per cycle does
// not depend on the number of replicas (within 1.2x from 1 to 8).
func (rp *report) replicaTargets() []target {
	if len(rp.cfg.clients) == 0 {
		return nil
	}
	n := slices.Max(rp.cfg.clients)
	var ts []target
	one, ok1 := rp.agg(scReplicas, n, 0, sysReplicas(1))
	three, ok3 := rp.agg(scReplicas, n, 0, sysReplicas(3))
	if ok1 && ok3 && one.rate.med > 0 {
		r := three.rate.med / one.rate.med
		m := fmt.Sprintf("%.2fx (%s vs %s cycles/s)", r, thousands(three.rate.med), thousands(one.rate.med))
		for _, k := range rp.cfg.replicas {
			if k == 1 || k == 3 {
				continue
			}
			if a, ok := rp.agg(scReplicas, n, 0, sysReplicas(k)); ok {
				m += fmt.Sprintf("; %d replicas: %.2fx (%s)", k, a.rate.med/one.rate.med, thousands(a.rate.med))
			}
		}
		ts = append(ts, target{goal: fmt.Sprintf("3 replicas, clients spread over them: uncontended %d clients >= 0.6x one replica's cycles/s", n),
			measured: m, met: r >= 0.6, known: true, speedup: r, need: 0.6})
	}
	var parts []string
	lo, hi := 0.0, 0.0
	var counts []int
	for _, k := range rp.cfg.replicas {
		w := rp.workAgg(scReplicas, n, 0, sysReplicas(k))
		if w.n == 0 || w.cpu.med <= 0 || slices.Contains(counts, k) {
			continue
		}
		counts = append(counts, k)
		parts = append(parts, fmt.Sprintf("%d: %s", k, us(w.cpu.med)))
		if lo == 0 || w.cpu.med < lo {
			lo = w.cpu.med
		}
		hi = max(hi, w.cpu.med)
	}
	if len(counts) >= 2 {
		r := hi / lo
		ts = append(ts, target{goal: fmt.Sprintf("etcd CPU per operation with %s replicas within 1.2x of each other", joinInts(counts)),
			measured: fmt.Sprintf("%.2fx, highest / lowest (%s per cycle)", r, strings.Join(parts, ", ")), met: r <= 1.2, known: true})
	}
	return ts
}

// joinInts is "1, 3 and 8".
func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}
