package main

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// A locker is one lock system as the benchmark's workers see it. Worker w
// always uses the same connection and (for the etcd peers) the same lease.
type locker interface {
	// lock blocks until worker w holds name; the returned func releases it.
	// It also returns the fencing token (or, for the etcd peers, the key's
	// create revision) and the key to validate it by.
	lock(ctx context.Context, w int, name string) (held, error)
}

type held struct {
	token   int64
	key     string // etcd peers: the lock key
	release func(context.Context) error
}

// Names of the systems in the tables.
const (
	sysCoord  = "coordinatord"
	sysMutex  = "etcd Mutex"
	sysV3lock = "etcd v3lock"
	sysGet    = "etcd linearizable Get"
	// sysFloor is a no-op call to coordinatord (the standard health Check,
	// through the same connections and interceptors): the most calls/s any
	// coordinatord RPC can reach on the machine, whatever it does.
	sysFloor = "coordinatord no-op RPC (health Check)"
	// sysSem4 is coordinatord's counting semaphore of 4 permits: its
	// acquire/release cycles on a free name must cost what a mutex's do,
	// and its contended hand-offs are measured beside the mutex's.
	sysSem4 = "coordinatord semaphore (N=4)"
)

// semLimit is the number of permits of sysSem4.
const semLimit = 4

// holdersAllowed is how many holders of one name a system admits at once.
func holdersAllowed(system string) int32 {
	if system == sysSem4 {
		return semLimit
	}
	return 1
}

// clients are the shared connections of the load generator: a few gRPC
// connections to coordinatord and a few etcd clients, each shared by many
// workers (one HTTP/2 connection carries many concurrent calls).
type clients struct {
	coordConns []*grpc.ClientConn
	coord      []coordinatorv1.LockServiceClient
	counters   []coordinatorv1.CounterServiceClient
	health     []healthpb.HealthClient
	etcd       []*clientv3.Client
	sessions   []*concurrency.Session // one per worker: Mutex's recommended use
	leases     []clientv3.LeaseID     // one per worker, for v3lock
}

func dialClients(ctx context.Context, coordAddr, etcdURL string, conns, workers int) (*clients, error) {
	c := &clients{}
	for range conns {
		gc, err := grpc.NewClient(coordAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			c.close()
			return nil, err
		}
		c.coordConns = append(c.coordConns, gc)
		c.coord = append(c.coord, coordinatorv1.NewLockServiceClient(gc))
		c.counters = append(c.counters, coordinatorv1.NewCounterServiceClient(gc))
		c.health = append(c.health, healthpb.NewHealthClient(gc))
		ec, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdURL}, DialTimeout: 5 * time.Second})
		if err != nil {
			c.close()
			return nil, err
		}
		c.etcd = append(c.etcd, ec)
	}
	for w := range workers {
		cli := c.etcd[w%conns]
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(60))
		if err != nil {
			c.close()
			return nil, fmt.Errorf("mutex session: %w", err)
		}
		c.sessions = append(c.sessions, s)
		// The v3lock leases outlive the whole run (at most 30 minutes), so
		// nobody needs to renew them.
		lr, err := cli.Grant(ctx, 3600)
		if err != nil {
			c.close()
			return nil, fmt.Errorf("v3lock lease: %w", err)
		}
		c.leases = append(c.leases, lr.ID)
	}
	return c, nil
}

func (c *clients) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range c.sessions {
		_ = s.Close()
	}
	for i, id := range c.leases {
		_, _ = c.etcd[i%len(c.etcd)].Revoke(ctx, id)
	}
	for _, gc := range c.coordConns {
		_ = gc.Close()
	}
	for _, ec := range c.etcd {
		_ = ec.Close()
	}
}

// benchTTL is the lease TTL of every coordinatord grant the workers take.
const benchTTL = 30 * time.Second

type coordLocker struct{ c *clients }

func (l coordLocker) lock(ctx context.Context, w int, name string) (held, error) {
	lc := l.c.coord[w%len(l.c.coord)]
	g, err := lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: name, Ttl: durationpb.New(benchTTL)})
	if err != nil {
		return held{}, err
	}
	return held{token: g.GetToken(), release: func(ctx context.Context) error {
		r, err := lc.Release(ctx, &coordinatorv1.ReleaseRequest{Name: name, Token: g.GetToken(), Handle: g.GetHandle()})
		if err == nil && !r.GetReleased() {
			return fmt.Errorf("release of %q token %d: released=false", name, g.GetToken())
		}
		return err
	}}, nil
}

// semLocker acquires a permit of a semaphore of semLimit on coordinatord.
type semLocker struct{ c *clients }

func (l semLocker) lock(ctx context.Context, w int, name string) (held, error) {
	lc := l.c.coord[w%len(l.c.coord)]
	g, err := lc.Acquire(ctx, &coordinatorv1.AcquireRequest{Name: name, Ttl: durationpb.New(benchTTL), Limit: semLimit})
	if err != nil {
		return held{}, err
	}
	return held{token: g.GetToken(), release: func(ctx context.Context) error {
		r, err := lc.Release(ctx, &coordinatorv1.ReleaseRequest{Name: name, Token: g.GetToken(), Handle: g.GetHandle()})
		if err == nil && !r.GetReleased() {
			return fmt.Errorf("release of %q token %d: released=false", name, g.GetToken())
		}
		return err
	}}, nil
}

type mutexLocker struct{ c *clients }

func (l mutexLocker) lock(ctx context.Context, w int, name string) (held, error) {
	m := concurrency.NewMutex(l.c.sessions[w], "/bench/mutex/"+name)
	if err := m.Lock(ctx); err != nil {
		return held{}, err
	}
	return held{token: m.Header().Revision, key: m.Key(), release: m.Unlock}, nil
}

type v3lockLocker struct{ c *clients }

func (l v3lockLocker) lock(ctx context.Context, w int, name string) (held, error) {
	lc := v3lockpb.NewLockClient(l.c.etcd[w%len(l.c.etcd)].ActiveConnection())
	r, err := lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("/bench/v3lock/" + name), Lease: int64(l.c.leases[w])})
	if err != nil {
		return held{}, err
	}
	return held{token: r.GetHeader().GetRevision(), key: string(r.GetKey()), release: func(ctx context.Context) error {
		_, err := lc.Unlock(ctx, &v3lockpb.UnlockRequest{Key: r.GetKey()})
		return err
	}}, nil
}

// What-if systems (flag -whatif, uncontended scenario only): coordinatord's
// etcd recipe done directly by the client, without the coordinator hop, to
// separate what the recipe costs in etcd from what the extra hop costs, and
// to measure the recipe the proposals in docs/BENCHMARKS.md lead to.
const (
	sysRecipeNow  = "what-if: today's recipe, direct"
	sysRecipeNext = "what-if: reused lease + delete, direct"
)

// recipeNowLocker is today's Acquire/Release etcd calls: Grant, a Txn that
// joins the empty queue as holder; Get, Revoke. It only handles free names.
type recipeNowLocker struct{ c *clients }

func (l recipeNowLocker) lock(ctx context.Context, w int, name string) (held, error) {
	cli := l.c.etcd[w%len(l.c.etcd)]
	lr, err := cli.Grant(ctx, int64(benchTTL/time.Second))
	if err != nil {
		return held{}, err
	}
	queue := "/bench/whatif-now/" + name + "/"
	key := fmt.Sprintf("%s%016x", queue, uint64(lr.ID))
	r, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(queue), "=", 0).WithPrefix()).
		Then(clientv3.OpPut(key, `{"hh":"0123456789abcdef0123456789abcdef0123456789ab"}`, clientv3.WithLease(lr.ID))).Commit()
	if err == nil && !r.Succeeded {
		err = fmt.Errorf("what-if: %q is held", name)
	}
	if err != nil {
		return held{}, err
	}
	return held{token: r.Header.Revision, release: func(ctx context.Context) error {
		if _, err := cli.Get(ctx, key); err != nil {
			return err
		}
		_, err := cli.Revoke(ctx, lr.ID)
		return err
	}}, nil
}

// recipeNextLocker joins with the worker's long-lived lease (no Grant) and
// releases by deleting the key if it is still this grant's (no Revoke, so
// no forced etcd backend commit). It only handles free names.
type recipeNextLocker struct{ c *clients }

func (l recipeNextLocker) lock(ctx context.Context, w int, name string) (held, error) {
	cli := l.c.etcd[w%len(l.c.etcd)]
	id := l.c.leases[w]
	queue := "/bench/whatif-next/" + name + "/"
	key := fmt.Sprintf("%s%016x", queue, uint64(id))
	r, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(queue), "=", 0).WithPrefix()).
		Then(clientv3.OpPut(key, `{"hh":"0123456789abcdef0123456789abcdef0123456789ab"}`, clientv3.WithLease(id))).Commit()
	if err == nil && !r.Succeeded {
		err = fmt.Errorf("what-if: %q is held", name)
	}
	if err != nil {
		return held{}, err
	}
	token := r.Header.Revision
	return held{token: token, release: func(ctx context.Context) error {
		_, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", token)).Then(clientv3.OpDelete(key)).Commit()
		return err
	}}, nil
}

// sysRecipeBatch is recipeNext with group commit: concurrent joins (and
// concurrent releases) of different names share one etcd Txn, each as its
// own nested Txn with its own compare. A batch is sent as soon as the
// previous one of its loop has returned: no timer, no added latency for a
// lone client.
const sysRecipeBatch = "what-if: reused lease + delete + group commit, direct"

type batchReq struct {
	cmp  clientv3.Cmp
	op   clientv3.Op
	done chan batchResp
}

type batchResp struct {
	ok  bool
	rev int64
	err error
}

// batcher runs loops goroutines that each take every request waiting and
// commit them in one Txn, up to max per Txn.
type batcher struct {
	reqs chan batchReq
	stop chan struct{}
}

func newBatcher(cli *clientv3.Client, loops, max int) *batcher {
	b := &batcher{reqs: make(chan batchReq, 1024), stop: make(chan struct{})}
	for range loops {
		go func() {
			for {
				var batch []batchReq
				select {
				case r := <-b.reqs:
					batch = append(batch, r)
				case <-b.stop:
					return
				}
			more:
				for len(batch) < max {
					select {
					case r := <-b.reqs:
						batch = append(batch, r)
					default:
						break more
					}
				}
				ops := make([]clientv3.Op, len(batch))
				for i, r := range batch {
					ops[i] = clientv3.OpTxn([]clientv3.Cmp{r.cmp}, []clientv3.Op{r.op}, nil)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				resp, err := cli.Txn(ctx).Then(ops...).Commit()
				cancel()
				for i, r := range batch {
					if err != nil {
						r.done <- batchResp{err: err}
						continue
					}
					r.done <- batchResp{ok: resp.Responses[i].GetResponseTxn().GetSucceeded(), rev: resp.Header.Revision}
				}
			}
		}()
	}
	return b
}

func (b *batcher) do(ctx context.Context, cmp clientv3.Cmp, op clientv3.Op) (batchResp, error) {
	done := make(chan batchResp, 1)
	select {
	case b.reqs <- batchReq{cmp: cmp, op: op, done: done}:
	case <-ctx.Done():
		return batchResp{}, ctx.Err()
	}
	r := <-done
	return r, r.err
}

type recipeBatchLocker struct {
	c *clients
	b *batcher
}

func (l recipeBatchLocker) lock(ctx context.Context, w int, name string) (held, error) {
	id := l.c.leases[w]
	queue := "/bench/whatif-batch/" + name + "/"
	key := fmt.Sprintf("%s%016x", queue, uint64(id))
	r, err := l.b.do(ctx, clientv3.Compare(clientv3.CreateRevision(queue), "=", 0).WithPrefix(),
		clientv3.OpPut(key, `{"hh":"0123456789abcdef0123456789abcdef0123456789ab"}`, clientv3.WithLease(id)))
	if err == nil && !r.ok {
		err = fmt.Errorf("what-if: %q is held", name)
	}
	if err != nil {
		return held{}, err
	}
	return held{token: r.rev, release: func(ctx context.Context) error {
		_, err := l.b.do(ctx, clientv3.Compare(clientv3.CreateRevision(key), "=", r.rev), clientv3.OpDelete(key))
		return err
	}}, nil
}
