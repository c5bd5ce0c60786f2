package lease

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Hot-path micro-benchmarks: every Acquire, Release, KeepAlive and
// ValidateToken validates a name and encodes its queue key; Acquire makes a
// handle and Release/KeepAlive parse one. Run with
// go test -run '^$' -bench . ./internal/lease

var (
	benchNames = map[string]string{
		"short":   "reports/nightly",
		"unicode": "jobs/日本/ü-42",
		"max":     strings.Repeat("x", MaxNameLen),
	}
	sinkErr    error
	sinkString string
	sinkID     clientv3.LeaseID
	sinkSum    []byte
)

func BenchmarkValidateName(b *testing.B) {
	for label, name := range benchNames {
		b.Run(label, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sinkErr = ValidateName("name", name, false)
			}
			if sinkErr != nil {
				b.Fatal(sinkErr)
			}
		})
	}
}

func BenchmarkEscape(b *testing.B) {
	for label, name := range map[string]string{"plain": "reports-nightly", "slashes": "a/b/c%d/e"} {
		b.Run(label, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sinkString = escape(name)
			}
		})
	}
}

func BenchmarkKeyspaceQueue(b *testing.B) {
	ks := NewKeyspace("/coordinatord/")
	b.ReportAllocs()
	for b.Loop() {
		sinkString = ks.Queue("reports/nightly")
	}
}

func BenchmarkKeyspaceKey(b *testing.B) {
	ks := NewKeyspace("/coordinatord/")
	b.ReportAllocs()
	for b.Loop() {
		sinkString = ks.key("reports/nightly", 0x1234abcd5678ef01)
	}
}

func BenchmarkNewHandle(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		sinkString, sinkSum = newHandle(0x1234abcd5678ef01)
	}
}

func BenchmarkParseHandle(b *testing.B) {
	h, _ := newHandle(0x1234abcd5678ef01)
	b.ReportAllocs()
	for b.Loop() {
		sinkID, sinkSum, sinkErr = parseHandle(h)
	}
	if sinkErr != nil {
		b.Fatal(sinkErr)
	}
}

// BenchmarkBatcher is group commit on a real (embedded) etcd: 64
// concurrent conditional puts of distinct keys, each its own nested Txn, as
// joins and releases of distinct locks are. ns/op is per transaction; the
// txns/commit metric is how many shared one etcd Txn.
func BenchmarkBatcher(b *testing.B) {
	cli := testEtcd(b) // etcd's default timings, as the daemon runs it
	var commits atomic.Int64
	bt := &batcher{cli: cli, spawn: func(f func()) { commits.Add(1); go f() }}
	var id atomic.Int64
	b.SetParallelism(32) // 64 on 2 cores
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		key := fmt.Sprintf("/bench/batch/%d", id.Add(1))
		for pb.Next() {
			res := bt.do(context.Background(), key,
				[]clientv3.Cmp{clientv3.Compare(clientv3.Version(key), ">", -1)},
				[]clientv3.Op{clientv3.OpPut(key, "v")}, nil)
			if res.err != nil || !res.ok {
				b.Errorf("txn: %v %v", res.ok, res.err)
				return
			}
		}
	})
	if c := commits.Load(); c > 0 {
		b.ReportMetric(float64(b.N)/float64(c), "txns/commit")
	}
}
