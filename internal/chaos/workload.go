package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// Workload drives clients against the coordinator replicas and records
// every operation.
type Workload struct {
	// Replicas are the coordinator endpoints; client c starts on c%len and
	// moves to the next one when a call is ambiguous.
	Replicas []coordinatorv1.LockServiceClient
	// Names are the lock names; ClientsPerName clients contend for each
	// (keep it at most 8 so that checking stays fast).
	Names          []string
	ClientsPerName int
	// TTL of every grant (default 2s); Wait of every Acquire (default 1s).
	TTL, Wait time.Duration
	// PauseOneIn: one grant in PauseOneIn is held by a "paused" holder that
	// stops renewing for 2*TTL+1s and then writes with its stale token (0:
	// never).
	PauseOneIn int
	// CallTimeout bounds every call (default 3s).
	CallTimeout time.Duration
	// Seed makes the clients' choices reproducible (not the faults' timing).
	Seed uint64

	// Compacted, if set, is the highest revision compacted so far
	// (Compactor.Compacted): the watchers then check that a compacted
	// start_revision answers OUT_OF_RANGE.
	Compacted func() int64

	// Kinds makes names semaphores or read-write locks (unlisted: mutexes).
	// Their holders validate and renew but do not write the register, and
	// no watcher follows them; a read-write lock's writers write as a
	// mutex's holders do.
	Kinds map[string]NameKind

	// NoWatch leaves the watchers out.
	NoWatch bool
	// HoldOn, if set, picks the replica a Hold stream on name goes to (an
	// index into Replicas; negative: the client's own).
	HoldOn func(name string) int

	Rec *Recorder
	Reg *Register

	watches watchReports
	paused  atomic.Int64
	holds   atomic.Int64
	once    sync.Once
}

// NameKind is how a name's acquisitions share it: a semaphore of Limit
// (> 1), or a read-write lock (ReadWrite: each acquisition a reader or a
// writer at random).
type NameKind struct {
	Limit     int32
	ReadWrite bool
}

// defaults fills the unset fields, once (Run and Client may race to it).
func (w *Workload) defaults() { w.once.Do(w.setDefaults) }

func (w *Workload) setDefaults() {
	if w.TTL == 0 {
		w.TTL = 2 * time.Second
	}
	if w.Wait == 0 {
		w.Wait = time.Second
	}
	if w.CallTimeout == 0 {
		w.CallTimeout = 3 * time.Second
	}
	if w.ClientsPerName == 0 {
		w.ClientsPerName = 3
	}
	if w.Rec == nil {
		w.Rec = NewRecorder()
	}
	if w.Reg == nil {
		w.Reg = NewRegister()
	}
}

// Client returns a recorded client on name, starting on replica 0 (ids of
// Run's clients start at 0: use ids from 1000 to keep them apart).
func (w *Workload) Client(id int, name string) *Client {
	w.defaults()
	return &Client{w: w, id: id, name: name, rng: mrand.New(mrand.NewPCG(w.Seed, uint64(id)))}
}

// Holds is how many rounds ran on a Hold stream.
func (w *Workload) Holds() int64 { return w.holds.Load() }

// Paused is how many paused holders ran.
func (w *Workload) Paused() int64 { return w.paused.Load() }

// Run runs every client until ctx ends, then returns once they stopped (a
// client finishes its current call first, each bounded by CallTimeout).
func (w *Workload) Run(ctx context.Context) {
	w.defaults()
	var wg sync.WaitGroup
	id := 0
	for _, name := range w.Names {
		for range w.ClientsPerName {
			c := &Client{w: w, id: id, name: name, home: id % len(w.Replicas), rng: mrand.New(mrand.NewPCG(w.Seed, uint64(id)))}
			id++
			wg.Go(func() { c.loop(ctx) })
		}
	}
	// One watcher per mutex's name (ids from 500), resuming its Watch
	// streams.
	for i, name := range w.Names {
		if _, shaped := w.Kinds[name]; shaped || w.NoWatch {
			continue
		}
		id := 500 + i
		wt := &watcher{w: w, c: &Client{w: w, id: id, name: name, home: id % len(w.Replicas)}, rng: mrand.New(mrand.NewPCG(w.Seed, uint64(id)))}
		wg.Go(func() { wt.loop(ctx) })
	}
	wg.Wait()
}

// Client is one recorded client of the workload, also usable on its own
// for a scenario's targeted steps.
type Client struct {
	// Wait, TTL override the workload's Acquire wait and TTL when set;
	// Timeout overrides an Acquire's deadline (by default the wait + 2s);
	// CallTimeout overrides the workload's CallTimeout for the client's
	// other calls.
	Wait, TTL, Timeout, CallTimeout time.Duration

	w    *Workload
	id   int
	name string
	home int
	rng  *mrand.Rand
	// shared: the client's current acquisition is a reader's (recorded
	// with every operation on it, as is the name's limit).
	shared bool
}

// Use makes the client call replica i (modulo the number of replicas).
func (c *Client) Use(i int) { c.home = i }

// LC is the replica the client calls now.
func (c *Client) LC() coordinatorv1.LockServiceClient {
	return c.w.Replicas[c.home%len(c.w.Replicas)]
}

// reply is what a call learned: the granted token (Acquire), its outcome,
// and the answer's safe_until (Acquire, KeepAlive; zero if none).
type reply struct {
	token     int64
	out       Outcome
	safeUntil time.Time
}

// call runs f with a bounded context and records it.
func (c *Client) call(ctx context.Context, kind Kind, token int64, f func(context.Context) (reply, error)) (int64, Outcome) {
	timeout := c.w.CallTimeout
	if c.CallTimeout > 0 {
		timeout = c.CallTimeout
	}
	return c.callT(ctx, timeout, kind, token, f)
}

func (c *Client) callT(ctx context.Context, timeout time.Duration, kind Kind, token int64, f func(context.Context) (reply, error)) (int64, Outcome) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	op := Op{Client: c.id, Name: c.name, Kind: kind, Token: token, Call: c.w.Rec.Now(), Limit: c.w.Kinds[c.name].Limit, Shared: c.shared}
	r, err := f(cctx)
	return r.token, c.record(op, r, err)
}

// record completes op (invoked at op.Call) with what the call learned and
// adds it to the history; it returns the outcome.
func (c *Client) record(op Op, r reply, err error) Outcome {
	op.Return = c.w.Rec.Now()
	out := r.out
	if err != nil {
		out = Classify(err)
		op.Err = err.Error()
		op.Code = Code(err)
	} else if !r.safeUntil.IsZero() {
		op.SafeUntil = c.w.Rec.At(r.safeUntil)
	}
	if op.Kind == Acquire {
		op.Token = r.token
	}
	op.Outcome = out
	c.w.Rec.Add(op)
	if out == Ambiguous {
		c.home++ // try another replica next
	}
	return out
}

// RequestID returns a fresh random request id.
func RequestID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Acquire asks for the lock with a fresh request id, retrying an ambiguous
// answer with the same id (on the next replica) up to 3 times.
func (c *Client) Acquire(ctx context.Context) (*coordinatorv1.AcquireResponse, bool) {
	resp, out := c.AcquireID(ctx, RequestID(), 3)
	return resp, out == OK
}

// AcquireID asks for the lock with request id rid, up to tries times while
// the answer is ambiguous (moving to the next replica each time), and
// returns the last outcome.
func (c *Client) AcquireID(ctx context.Context, rid string, tries int) (*coordinatorv1.AcquireResponse, Outcome) {
	wait := c.w.Wait
	if c.Wait > 0 {
		wait = c.Wait
	}
	ttl := c.w.TTL
	if c.TTL > 0 {
		ttl = c.TTL
	}
	timeout := max(c.w.CallTimeout, wait+2*time.Second)
	if c.Timeout > 0 {
		timeout = c.Timeout
	}
	out := Ambiguous
	for range tries {
		if ctx.Err() != nil {
			return nil, out
		}
		var resp *coordinatorv1.AcquireResponse
		_, out = c.callT(ctx, timeout, Acquire, 0, func(cctx context.Context) (reply, error) {
			req := &coordinatorv1.AcquireRequest{
				Name: c.name, Ttl: durationpb.New(ttl), Wait: durationpb.New(wait),
				Owner: fmt.Sprintf("client-%d", c.id), RequestId: rid, Limit: c.w.Kinds[c.name].Limit,
			}
			if c.shared {
				req.Mode = coordinatorv1.LockMode_LOCK_MODE_SHARED
			}
			r, err := c.LC().Acquire(cctx, req)
			if err != nil {
				return reply{}, err
			}
			resp = r
			return reply{token: r.GetToken(), out: OK, safeUntil: r.GetSafeUntil().AsTime()}, nil
		})
		if out != Ambiguous {
			return resp, out
		}
		sleep(ctx, 50*time.Millisecond)
	}
	return nil, out
}

// Validate is ValidateToken without a resource.
func (c *Client) Validate(ctx context.Context, name string, token int64) (bool, error) {
	return c.validate(ctx, Validate, name, token)
}

// ValidateResource is ValidateToken with the resource "res/"+name, whose
// high-water mark the coordinator keeps.
func (c *Client) ValidateResource(ctx context.Context, name string, token int64) (bool, error) {
	return c.validate(ctx, ValidateResource, name, token)
}

func (c *Client) validate(ctx context.Context, kind Kind, name string, token int64) (bool, error) {
	var verr error
	_, out := c.call(ctx, kind, token, func(cctx context.Context) (reply, error) {
		req := &coordinatorv1.ValidateTokenRequest{Name: name, Token: token}
		if kind == ValidateResource {
			req.Resource = "res/" + name
		}
		r, err := c.LC().ValidateToken(cctx, req)
		if err != nil {
			verr = err
			return reply{}, err
		}
		if r.GetValid() {
			return reply{out: OK}, nil
		}
		return reply{out: Failed}, nil
	})
	return out == OK, verr
}

// KeepAlive renews g.
func (c *Client) KeepAlive(ctx context.Context, g *coordinatorv1.AcquireResponse) Outcome {
	_, out := c.call(ctx, KeepAlive, g.GetToken(), func(cctx context.Context) (reply, error) {
		r, err := c.LC().KeepAlive(cctx, &coordinatorv1.KeepAliveRequest{Name: c.name, Token: g.GetToken(), Handle: g.GetHandle()})
		if err != nil {
			return reply{}, err
		}
		return reply{out: OK, safeUntil: r.GetSafeUntil().AsTime()}, nil
	})
	return out
}

// Release releases token with handle; kind is Release or ReleaseOther.
func (c *Client) Release(ctx context.Context, kind Kind, token int64, handle string) Outcome {
	_, out := c.call(ctx, kind, token, func(cctx context.Context) (reply, error) {
		r, err := c.LC().Release(cctx, &coordinatorv1.ReleaseRequest{Name: c.name, Token: token, Handle: handle})
		if err != nil {
			return reply{}, err
		}
		if r.GetReleased() {
			return reply{out: OK}, nil
		}
		return reply{out: Failed}, nil
	})
	return out
}

// Write writes to the register with token (validated through the client's
// replica); stale marks a paused holder's write.
func (c *Client) Write(ctx context.Context, token int64, stale bool) bool {
	validate := c.Validate
	if c.rng.IntN(2) == 0 {
		validate = c.ValidateResource // half the writes use the coordinator's own mark too
	}
	return c.w.Reg.Write(ctx, c.id, c.name, token, stale, validate)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (c *Client) loop(ctx context.Context) {
	if _, shaped := c.w.Kinds[c.name]; shaped {
		c.sharedLoop(ctx)
		return
	}
	for ctx.Err() == nil {
		if c.rng.IntN(4) == 0 {
			c.w.holds.Add(1)
			c.holdRound(ctx) // one round in four on a Hold stream
			continue
		}
		g, ok := c.Acquire(ctx)
		if !ok {
			sleep(ctx, time.Duration(c.rng.IntN(50))*time.Millisecond)
			continue
		}
		// Work under the lock even if ctx ended: the history stays whole.
		work := context.WithoutCancel(ctx)
		if c.w.PauseOneIn > 0 && c.rng.IntN(c.w.PauseOneIn) == 0 {
			c.w.paused.Add(1)
			// A paused holder: no renewal past the TTL, then a write with
			// the stale token. The register must refuse it.
			c.Write(work, g.GetToken(), false)
			time.Sleep(2*c.w.TTL + time.Second)
			c.Write(work, g.GetToken(), true)
			c.Release(work, Release, g.GetToken(), g.GetHandle())
			continue
		}
		for range 1 + c.rng.IntN(3) {
			if !c.Write(work, g.GetToken(), false) {
				break
			}
			if c.KeepAlive(work, g) == Failed {
				break
			}
			time.Sleep(time.Duration(c.rng.IntN(100)) * time.Millisecond)
		}
		if c.rng.IntN(4) == 0 && g.GetToken() > 1 {
			// Someone else's token with this client's handle: never released.
			c.Release(work, ReleaseOther, g.GetToken()-1, g.GetHandle())
		}
		c.Release(work, Release, g.GetToken(), g.GetHandle())
	}
}
