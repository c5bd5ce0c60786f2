package lease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestSemaphoreChurn is the permit bugs users keep reporting of other
// systems' semaphores (leaked or orphaned permits, missed wake-ups), as a
// test: 16 clients on two replicas take thousands of random steps on a
// semaphore of 3 (acquire and release, try-lock, give up while waiting,
// abandon one permit in 200 to expire), while a checker reads the queue every few
// milliseconds: never more than 3 granted, never two on one slot, tokens
// rising per slot, and never a free permit beside a waiter for more than a
// second. At the end, no permit is left behind.
func TestSemaphoreChurn(t *testing.T) {
	ms, cli := newReplicas(t, 2)
	const (
		name    = "churn"
		n       = 3
		workers = 16
		steps   = 3000
		budget  = 12 * time.Second
	)
	opts := []AcquireOption{WithLimit(n), WithTTL(2 * time.Second)}
	var (
		taken    atomic.Int64
		granted  atomic.Int64
		deadline = time.Now().Add(budget)
		wg       sync.WaitGroup
	)
	stopCheck, checked := checkPermits(t, cli, ms[0].Keyspace().Queue(name), n)
	for w := range workers {
		m := ms[w%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 15))
			for taken.Add(1) <= steps && time.Now().Before(deadline) {
				if churnStep(t, m, name, rng, opts) {
					granted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	failures := stopCheck()
	for _, f := range failures {
		t.Error(f)
	}
	t.Logf("%d steps, %d grants, %d queue reads checked", min(taken.Load(), steps), granted.Load(), checked())
	// Abandoned permits end with their leases: nothing is left behind.
	eventually(t, "every permit gone", func() bool {
		r, err := cli.Get(context.Background(), ms[0].Keyspace().Queue(name), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && r.Count == 0
	})
}

// churnStep takes one random step and reports whether it was granted.
func churnStep(t *testing.T, m *Manager, name string, rng *rand.Rand, opts []AcquireOption) bool {
	var (
		g   *Grant
		err error
	)
	switch p := rng.IntN(100); {
	case p < 20: // try once
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		g, err = m.Acquire(ctx, name, append(opts, WithWait(0))...)
		cancel()
	case p < 40: // give up while waiting (the client vanishes)
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+rng.IntN(30))*time.Millisecond)
		g, err = m.Acquire(ctx, name, opts...)
		cancel()
	default:
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		g, err = m.Acquire(ctx, name, opts...)
		cancel()
	}
	switch {
	case errors.Is(err, ErrNotGranted), errors.Is(err, context.DeadlineExceeded):
		return false
	case err != nil:
		t.Errorf("acquire: %v", err)
		return false
	}
	time.Sleep(time.Duration(rng.IntN(8)) * time.Millisecond)
	if rng.IntN(200) == 0 {
		return true // abandoned: the permit ends with its lease
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ok, err := m.Release(ctx, name, g.Token, g.Handle); err != nil || !ok {
		t.Errorf("release of a live permit: %v, %v", ok, err)
	}
	return true
}

// freeBound is how long a permit may stay free beside a waiter: a second,
// or, under the race detector (everything ~10x slower), a bound against a
// missed wake-up only.
var freeBound = map[bool]time.Duration{false: time.Second, true: 10 * time.Second}[raceEnabled]

// checkPermits reads the queue every 5 ms until stopped and returns what
// broke the semaphore's promises, and how many reads it checked. A permit
// (a slot) may be free beside a waiter while it passes on (the waiter
// wakes, reads, claims; grants are made in queue order, one at a time); it
// must not stay free so for a second while nothing moves at all (a missed
// wake-up), however slow a loaded machine makes each hand-off.
func checkPermits(t *testing.T, cli *clientv3.Client, queue string, n int) (stop func() []string, checked func() int64) {
	var (
		failures []string
		reads    atomic.Int64
		done     = make(chan struct{})
		finished = make(chan struct{})
	)
	go func() {
		defer close(finished)
		last := map[int32]int64{}
		freeSince := make([]time.Time, n) // per slot: since when it is free beside a waiter
		var (
			holders string    // the granted entries at the last read
			moved   time.Time // when they last changed
		)
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			r, err := cli.Get(context.Background(), queue, clientv3.WithPrefix(),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
			if err != nil {
				continue
			}
			reads.Add(1)
			held, waiting, bad := permitsAt(r, last, n)
			failures = append(failures, bad...)
			if h := fmt.Sprint(held); h != holders {
				holders, moved = h, time.Now()
			}
			for s := range freeSince {
				switch {
				case held[int32(s)] != 0 || !waiting:
					freeSince[s] = time.Time{}
				case freeSince[s].IsZero():
					freeSince[s] = time.Now()
				case time.Since(freeSince[s]) > freeBound && time.Since(moved) > freeBound:
					failures = append(failures, fmt.Sprintf("at revision %d: slot %d free beside a waiter, and no permit granted or ended, for over %v: %s",
						r.Header.Revision, s, freeBound, describeQueue(r)))
					freeSince[s] = time.Time{}
				}
			}
		}
	}()
	return func() []string { close(done); <-finished; return failures }, reads.Load
}

// permitsAt checks one read of the queue: at most n granted, each on a
// slot of its own, each slot's token above the last seen on it (last is
// updated). It returns the slots held and whether anyone waits.
func permitsAt(r *clientv3.GetResponse, last map[int32]int64, n int) (held map[int32]int64, waiting bool, bad []string) {
	held = map[int32]int64{}
	for _, kv := range r.Kvs {
		rec := decodeRecord(kv.Value)
		if rec.Acquired == 0 {
			waiting = true
			continue
		}
		if held[rec.Slot] != 0 {
			bad = append(bad, fmt.Sprintf("at revision %d: slot %d held twice: %s", r.Header.Revision, rec.Slot, describeQueue(r)))
		}
		held[rec.Slot] = kv.CreateRevision
		if kv.CreateRevision < last[rec.Slot] {
			bad = append(bad, fmt.Sprintf("at revision %d: slot %d held by %d after %d", r.Header.Revision, rec.Slot, kv.CreateRevision, last[rec.Slot]))
		}
		last[rec.Slot] = max(last[rec.Slot], kv.CreateRevision)
	}
	if len(held) > n {
		bad = append(bad, fmt.Sprintf("at revision %d: %d permits granted, limit %d", r.Header.Revision, len(held), n))
	}
	return held, waiting, bad
}

// describeQueue is a read of the queue for a failure message: each entry's
// token, granted or waiting, and slot.
func describeQueue(r *clientv3.GetResponse) string {
	var out []string
	for _, kv := range r.Kvs {
		rec := decodeRecord(kv.Value)
		state := "waiting"
		if rec.Acquired != 0 {
			state = fmt.Sprintf("slot %d", rec.Slot)
		}
		out = append(out, fmt.Sprintf("%d (%s, lease %x)", kv.CreateRevision, state, kv.Lease))
	}
	return strings.Join(out, ", ")
}
