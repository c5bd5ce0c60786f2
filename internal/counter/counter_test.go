package counter

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func fw(name string, limit int64, window time.Duration) Hit {
	return Hit{Name: name, Hits: 1, Limit: limit, Window: window}
}

// A request id is the caller's own: the same id from two identities is two
// hits; from one identity, one.
func TestRequestIDIsKeyedByIdentity(t *testing.T) {
	s, _ := setup(t)
	h := fw("c", 10, time.Minute)
	h.RequestID = "same-id-0123456789"
	for i, id := range []string{"alice", "alice", "bob", "bob", "alice"} {
		h.Identity = id
		r, err := s.Hit(ctxT(t), h)
		want := map[int]int64{0: 1, 1: 1, 2: 2, 3: 2, 4: 1}[i]
		if err != nil || r.Count != want || r.Replayed != (i == 1 || i == 3 || i == 4) {
			t.Fatalf("hit %d by %s: %+v, %v; want count %d", i, id, r, err, want)
		}
	}
	h.Identity, h.Limit = "alice", 11
	if _, err := s.Hit(ctxT(t), h); !errors.Is(err, ErrRequestIDReused) {
		t.Fatalf("same id, other limit: %v", err)
	}
}

// The counter key rides on a cleanup lease, set when the window is created
// and kept by later hits (WithIgnoreLease: a plain Put would detach it);
// the key is gone once its lease ends after the window, and Reset deletes it.
func TestCounterKeyLeaseAndReset(t *testing.T) {
	s, cli := setup(t, WithLeaseSpan(100*time.Millisecond, 500*time.Millisecond))
	key := s.Keyspace().Counter("l")
	leaseOf := func() clientv3.LeaseID {
		r, err := cli.Get(ctxT(t), key)
		if err != nil || len(r.Kvs) == 0 {
			t.Fatalf("get %s: %v, %d keys", key, err, len(r.Kvs))
		}
		return clientv3.LeaseID(r.Kvs[0].Lease)
	}
	if _, err := s.Hit(ctxT(t), fw("l", 5, 300*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	first := leaseOf()
	if first == 0 {
		t.Fatal("the counter key has no lease: it could outlive every window")
	}
	if _, err := s.Hit(ctxT(t), fw("l", 5, 300*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if l := leaseOf(); l != first {
		t.Fatalf("the second hit moved the key from lease %x to %x", first, l)
	}
	c, err := s.Get(ctxT(t), "l")
	if err != nil || !c.Exists || c.Count != 2 || c.Limit != 5 {
		t.Fatalf("Get = %+v, %v", c, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := cli.Get(ctxT(t), key, clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if r.Count == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the counter key outlived its window and lease by 10s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := s.Hit(ctxT(t), fw("l", 5, time.Minute)); err != nil {
		t.Fatal(err)
	}
	if existed, err := s.Reset(ctxT(t), "l"); err != nil || !existed {
		t.Fatalf("Reset = %v, %v", existed, err)
	}
	if c, err := s.Get(ctxT(t), "l"); err != nil || c.Exists {
		t.Fatalf("Get after Reset = %+v, %v", c, err)
	}
	if r, err := s.Hit(ctxT(t), fw("l", 5, time.Minute)); err != nil || r.Count != 1 {
		t.Fatalf("hit after Reset = %+v, %v; want a fresh count", r, err)
	}
}

// Concurrent hits share transactions: on one counter (one write for many
// hits) and on many counters (nested transactions of one Txn); the counts
// stay exact.
func TestConcurrentHitsShareTransactions(t *testing.T) {
	for _, tc := range []struct {
		name     string
		counters int
	}{{"one counter", 1}, {"64 counters", 64}} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := setup(t)
			const callers, rounds = 64, 4
			var wg sync.WaitGroup
			for i := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range rounds {
						if _, err := s.Hit(ctxT(t), fw(fmt.Sprint("c", i%tc.counters), 1000, time.Minute)); err != nil {
							t.Error(err)
						}
					}
				}()
			}
			wg.Wait()
			var total int64
			for i := range tc.counters {
				c, err := s.Get(ctxT(t), fmt.Sprint("c", i))
				if err != nil {
					t.Fatal(err)
				}
				total += c.Count
			}
			st := s.Stats()
			t.Logf("%d hits in %d transactions", st.Hits, st.Txns)
			if total != callers*rounds || st.Hits != callers*rounds {
				t.Fatalf("counted %d, decided %d; want %d", total, st.Hits, callers*rounds)
			}
			if !raceEnabled && st.Txns >= callers*rounds/2 {
				t.Fatalf("%d transactions for %d concurrent hits: not batched", st.Txns, st.Hits)
			}
		})
	}
}
