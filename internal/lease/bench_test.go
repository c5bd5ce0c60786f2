package lease

import (
	"strings"
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
