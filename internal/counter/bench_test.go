package counter

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkHit is group-committed hits on a real (embedded) etcd, 64
// concurrent callers (as cmd/coordbench's counter scenario), every hit
// allowed and written: on one hot counter, and on 1,000 distinct counters.
// ns/op is per hit; hits/txn is how many one etcd Txn decided; cpu-ns/hit is
// the process's CPU per hit, etcd's included (steadier than ns/op on a
// shared machine). Compare runs of one machine, not absolute figures.
func BenchmarkHit(b *testing.B) {
	for _, counters := range []int{1, 1000} {
		b.Run(fmt.Sprintf("counters=%d", counters), func(b *testing.B) {
			s, _ := setup(b)
			var next atomic.Int64
			b.SetParallelism(32) // 64 on 2 cores
			b.ReportAllocs()
			ctx := context.Background()
			cpu0 := processCPU(b)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					name := fmt.Sprintf("bench/%d", next.Add(1)%int64(counters))
					if r, err := s.Hit(ctx, Hit{Name: name, Hits: 1, Limit: 1 << 40, Window: time.Hour}); err != nil || !r.Allowed {
						b.Errorf("hit: %+v %v", r, err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/hit")
			if st := s.Stats(); st.Txns > 0 {
				b.ReportMetric(float64(st.Hits)/float64(st.Txns), "hits/txn")
			}
		})
	}
}

// processCPU is the user and system CPU time the process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
