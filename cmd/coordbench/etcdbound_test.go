package main

import (
	"runtime"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestCPUsOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  []int
	}{{"none", nil}, {"one", []int{0}}, {"two", []int{0, 1}}, {"sparse, past the first word", []int{3, 70, 1000}}} {
		t.Run(tc.name, func(t *testing.T) {
			var s unix.CPUSet
			for _, c := range tc.set {
				s.Set(c)
			}
			if got := cpusOf(s); !slices.Equal(got, tc.set) {
				t.Errorf("cpusOf = %v, want %v", got, tc.set)
			}
		})
	}
}

// TestEtcdBoundSkipsOnOneCPU: on one CPU the scenario measures nothing and
// says why in the report, instead of pinning everything to the same CPU.
func TestEtcdBoundSkipsOnOneCPU(t *testing.T) {
	done := make(chan struct{})
	var (
		b   = &bench{}
		err error
	)
	go func() {
		defer close(done)
		// This thread alone gets one CPU; it stays locked, so the runtime
		// ends it with the goroutine instead of reusing it.
		runtime.LockOSThread()
		var all, one unix.CPUSet
		if err = unix.SchedGetaffinity(0, &all); err != nil {
			return
		}
		one.Set(cpusOf(all)[0])
		if err = unix.SchedSetaffinity(0, &one); err != nil {
			return
		}
		err = b.runEtcdBound(nil, nil)
	}()
	<-done
	if err != nil {
		t.Fatal(err)
	}
	if len(b.skipped) != 1 || !strings.Contains(b.skipped[0], "etcd-bound") {
		t.Errorf("skipped = %q, want one etcd-bound note", b.skipped)
	}
}
