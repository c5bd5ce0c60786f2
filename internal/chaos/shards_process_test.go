package chaos_test

import (
	"context"
	"fmt"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
	"github.com/coordinatord/coordinatord/internal/chaos"
	"github.com/coordinatord/coordinatord/internal/shard"
)

// daemonShards is the shard count of a coordinatord process (its default;
// the daemon has no flag for it): the in-process members beside it use
// the same, as a cluster must.
const daemonShards = 256

// TestShardOwnerSIGSTOPPedPastItsTTL is the stale-lease-read pitfall
// (docs/SHARDS.md; Jepsen on etcd and Consul, 2014) on the shard
// core: a coordinatord process P (-core shard, member lease 2s) owns the
// shard of a name and serves a holder H; P is SIGSTOPped, past its lease
// TTL; the other member R takes the shard over and grants the lock to a
// new holder N (TTL 30s), whose token validates; then P is resumed
// (SIGCONT). Every answer P gives afterwards about that name — calls sent
// to it while it was frozen and answered when it thaws, and calls made
// for 5s after — is UNAVAILABLE or consistent with R's state: the old
// token never valid (with or without a resource), never renewed, Describe
// never showing H, no try-lock granted while N holds, N's token valid.
// A light workload runs on two other names (one on each member) through
// both, and the whole history is checked as every scenario's.
//
// Two variants: "daemon", P the coordinatord binary as deployed, where the
// epoch keeper's check, stale after the pause (3 intervals of 1s), answers
// EPOCH_PAUSED first and the shard lease next; and "lease-only", P the
// test binary as a member process (shards_child_test.go) whose epoch
// keeper checks once an hour, so that only the shard lease (S2) stands
// between the resumed process and a stale answer.
func TestShardOwnerSIGSTOPPedPastItsTTL(t *testing.T) {
	scenario(t, false)
	const ttl = 2 * time.Second // the member lease, P's and R's
	t.Run("daemon", func(t *testing.T) {
		sigstopOwner(t, ttl, func(e *chaos.Env) (*exec.Cmd, string) {
			return startDaemon(t, e.Cluster.ClientURLs(), "--core", "shard", "--shard-lease-ttl", ttl.String())
		})
	})
	t.Run("lease-only", func(t *testing.T) {
		sigstopOwner(t, ttl, func(e *chaos.Env) (*exec.Cmd, string) {
			return startShardChild(t, e.Cluster.ClientURLs(), ttl, daemonShards, time.Hour)
		})
	})
}

// sigstopOwner is TestShardOwnerSIGSTOPPedPastItsTTL with P started by
// start.
func sigstopOwner(t *testing.T, ttl time.Duration, start func(e *chaos.Env) (*exec.Cmd, string)) {
	e := newShardEnv(t, []chaos.ShardConfig{{Shards: daemonShards, LeaseTTL: ttl}})
	r := e.Replicas[0]
	cmd, pAddr := start(e)
	conn, err := grpc.NewClient(pAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const viaP, viaR = 0, 1
	lcP := coordinatorv1.NewLockServiceClient(conn)
	lcs := []coordinatorv1.LockServiceClient{lcP, r.Client()}
	work := context.Background()

	// P joins: R's view names P's address as the owner of some shards.
	ownerAddr := func(name string) string {
		o := r.Owner()
		if o == nil {
			return ""
		}
		_, addr, _ := o.Ownership().Owner(shard.ShardOf(name, daemonShards))
		return addr
	}
	nameOn := func(prefix, addr string) string {
		for i := range 100000 {
			if n := fmt.Sprintf("%s%d", prefix, i); ownerAddr(n) == addr {
				return n
			}
		}
		return ""
	}
	var name, onP, onR string
	eventually(t, 30*time.Second, "P owns shards in R's view", func() bool {
		name, onP, onR = nameOn("s", pAddr), nameOn("a", pAddr), nameOn("b", r.Addr())
		return name != "" && onP != "" && onR != ""
	})
	t.Logf("P at %s owns %q (and the workload's %q); R owns %q", pAddr, name, onP, onR)

	w := &chaos.Workload{Replicas: lcs, Names: []string{onP, onR}, ClientsPerName: 3, PauseOneIn: 4, NoWatch: true,
		Compacted: e.Compactor.Compacted, HoldOn: func(n string) int {
			switch ownerAddr(n) {
			case pAddr:
				return viaP
			case r.Addr():
				return viaR
			}
			return -1
		}}
	wctx, wcancel := context.WithTimeout(work, scale(25*time.Second))
	defer wcancel()
	bg := make(chan struct{})
	go func() { defer close(bg); w.Run(wctx) }()

	// H acquires through P (P decides: it owns the shard) and writes.
	h, n := w.Client(1000, name), w.Client(1001, name)
	h.Use(viaP)
	var g *coordinatorv1.AcquireResponse
	eventually(t, 15*time.Second, "H granted through P", func() bool {
		var out chaos.Outcome
		g, out = h.AcquireID(work, chaos.RequestID(), 1)
		h.Use(viaP)
		return out == chaos.OK
	})
	if !h.Write(work, g.GetToken(), false) {
		t.Fatal("H's write through P refused")
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "P is stopped", func() bool { return processState(cmd.Process.Pid) == 'T' })
	stopped := time.Now()

	// The answers P gives once it thaws, about name.
	var (
		mu      sync.Mutex
		answers = map[string]int{}
		bad     []string
	)
	note := func(what string, err error, ok bool, detail string) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("%s: %s (%v after the SIGSTOP)", what, detail, time.Since(stopped).Round(time.Millisecond)))
			answers[what+": WRONG"]++
		case err != nil:
			answers[fmt.Sprintf("%s: %v %s", what, status.Code(err), reasonOf(err))]++
		default:
			answers[what+": "+detail]++
		}
	}
	var newToken int64 // N's, once granted (read under mu)
	current := func() int64 {
		mu.Lock()
		defer mu.Unlock()
		return newToken
	}
	// ask makes one round of calls to P about name, each bounded by d,
	// recorded in the history where the model knows the call (each from a
	// client of its own, so that one round's calls run concurrently).
	var askers sync.WaitGroup
	round := 0
	ask := func(d time.Duration) {
		round++
		base := 2000 + 10*round
		nt := current()
		for i, kind := range []chaos.Kind{chaos.Validate, chaos.ValidateResource} {
			askers.Go(func() {
				c := w.Client(base+i, name)
				c.Use(viaP)
				c.CallTimeout = d
				var ok bool
				var err error
				if kind == chaos.Validate {
					ok, err = c.Validate(work, name, g.GetToken())
				} else {
					ok, err = c.ValidateResource(work, name, g.GetToken())
				}
				note(fmt.Sprintf("%v of H's token", kind), err, !ok || err != nil, fmt.Sprintf("valid=%v", ok))
			})
		}
		askers.Go(func() {
			c := w.Client(base+2, name)
			c.Use(viaP)
			c.CallTimeout = d
			ka := c.KeepAlive(work, g)
			note("KeepAlive of H's grant", nil, ka != chaos.OK, ka.String())
		})
		askers.Go(func() {
			c := w.Client(base+3, name)
			c.Use(viaP)
			c.Wait, c.Timeout, c.TTL = time.Millisecond, d, time.Second
			tg, out := c.AcquireID(work, chaos.RequestID(), 1)
			if out == chaos.OK {
				c.Release(work, chaos.Release, tg.GetToken(), tg.GetHandle())
				// Every answer of P comes after the SIGCONT, when N holds.
				note("try-lock", nil, false, fmt.Sprintf("granted token %d while N holds %d", tg.GetToken(), current()))
				return
			}
			note("try-lock", nil, true, out.String())
		})
		askers.Go(func() {
			cctx, cancel := context.WithTimeout(work, d)
			defer cancel()
			resp, err := lcP.Describe(cctx, &coordinatorv1.DescribeRequest{Name: name})
			if err != nil {
				note("Describe", err, status.Code(err) == codes.Unavailable || status.Code(err) == codes.DeadlineExceeded, err.Error())
				return
			}
			ht := resp.GetHolder().GetToken()
			note("Describe", nil, ht == current(), fmt.Sprintf("holder %d (N's: %d)", ht, current()))
		})
		if nt != 0 {
			askers.Go(func() {
				c := w.Client(base+4, name)
				c.Use(viaP)
				c.CallTimeout = d
				ok, err := c.Validate(work, name, nt)
				note("Validate of N's token", err, ok || err != nil, fmt.Sprintf("valid=%v", ok))
			})
		}
	}
	// Calls sent to the frozen P while it still owned the shard in etcd:
	// answered when it thaws.
	ask(30 * time.Second)

	// R takes the shard over once P's lease has expired, honours H's grant
	// for a TTL, then grants N.
	eventually(t, 20*time.Second, "R owns the shard", func() bool { return r.Owns(name) })
	t.Logf("R took the shard over %v after the SIGSTOP", time.Since(stopped).Round(time.Millisecond))
	n.Use(viaR)
	n.TTL, n.Wait = 30*time.Second, 15*time.Second
	g2, out := n.AcquireID(work, chaos.RequestID(), 1)
	if out != chaos.OK || g2.GetToken() <= g.GetToken() {
		t.Fatalf("N through R: %v token %d after %d", out, g2.GetToken(), g.GetToken())
	}
	if ok, err := n.Validate(work, name, g2.GetToken()); !ok || err != nil {
		t.Fatalf("N's token %d not valid through R: %v", g2.GetToken(), err)
	}
	if !n.Write(work, g2.GetToken(), false) {
		t.Fatal("N's write refused")
	}
	mu.Lock()
	newToken = g2.GetToken()
	mu.Unlock()
	// More calls queued at the frozen P, now that N holds the lock.
	ask(30 * time.Second)
	time.Sleep(time.Until(stopped.Add(2*ttl + time.Second)))

	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	thawed := time.Now()
	for time.Since(thawed) < 5*time.Second {
		ask(3 * time.Second)
		time.Sleep(100 * time.Millisecond)
	}
	askers.Wait()
	// H's stale write through the resumed P is refused.
	h.Use(viaP)
	if h.Write(work, g.GetToken(), true) {
		t.Error("H's stale write through the resumed P accepted")
	}
	mu.Lock()
	t.Logf("P's answers about %q after the SIGCONT (%d rounds): %v", name, round, answers)
	for _, b := range bad {
		t.Errorf("the resumed owner answered: %s", b)
	}
	mu.Unlock()
	if answers["validate of H's token: valid=false"]+answers["validate-resource of H's token: valid=false"] == 0 {
		t.Error("void run: the resumed P never answered a validation of H's token (all UNAVAILABLE)")
	}
	if n.Release(work, chaos.Release, g2.GetToken(), g2.GetHandle()) == chaos.Failed {
		t.Error("N's release through R failed")
	}
	<-wctx.Done()
	<-bg
	check(t, w, true)
}

// reasonOf is a status's ErrorInfo reason ("" if none).
func reasonOf(err error) string {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}
