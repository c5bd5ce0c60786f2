package fence

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/coordinatord/coordinatord/internal/keyspace"
	"github.com/coordinatord/coordinatord/internal/lease"
)

// BenchmarkViewHolder is the in-memory part of a validation answered from
// the holder view: finding a queue's holder among 100,000 queues, once the
// view has reached the barrier. Run with
// go test -run '^$' -bench . ./internal/fence
func BenchmarkViewHolder(b *testing.B) {
	w := newView(nil, "/p/locks/")
	w.live, w.rev = true, 10
	for i := range 100_000 {
		q := fmt.Sprintf("/p/locks/lock-%d/", i)
		w.queues.put(q, q+"b", int64(2*i+2), keyspace.Shape{})
		w.queues.put(q, q+"a", int64(2*i+1), keyspace.Shape{})
	}
	ctx := context.Background()
	q := "/p/locks/lock-4242/"
	for b.Loop() {
		if hs, ok := w.holders(ctx, q, 10); !ok || hs.oldest != 2*4242+1 || hs.all != nil {
			b.Fatalf("holders = %v, %v", hs, ok)
		}
	}
}

// BenchmarkValidateAtMark is a validation with a resource in the steady
// state of a writer: the holder's token at its own mark (one read-only
// transaction, no write), on a real embedded etcd.
func BenchmarkValidateAtMark(b *testing.B) {
	m, v := setupB(b)
	ctx := context.Background()
	g, err := m.Acquire(ctx, "l", lease.WithTTL(time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	if verdict, err := v.Validate(ctx, "l", g.Token, "r"); err != nil || !verdict.Valid {
		b.Fatalf("first validation: %+v, %v", verdict, err)
	}
	for b.Loop() {
		if verdict, err := v.Validate(ctx, "l", g.Token, "r"); err != nil || !verdict.Valid {
			b.Fatalf("validation: %+v, %v", verdict, err)
		}
	}
}

// BenchmarkViewMemory is what the holder view keeps per held lock: 100,000
// queues of one key each (the common case), as the watch delivers them (the
// keys in fresh memory, as decoded). It reports live heap bytes per lock.
func BenchmarkViewMemory(b *testing.B) {
	const n = 100_000
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		w := newView(nil, "/coordinatord/locks/")
		w.live = true
		for i := range n {
			key := fmt.Sprintf("/coordinatord/locks/orders-%08d/%016x", i, 0x694d7a2e1f3c0000+i)
			w.queues.put(queueOf(key), key, int64(i+1), keyspace.Shape{})
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/lock")
		runtime.KeepAlive(w)
	}
}
