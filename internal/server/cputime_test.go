package server

import (
	"syscall"
	"testing"
	"time"
)

// processCPU is the user and system CPU time the process used so far: per
// operation, it moves much less with the machine's load than ns/op does.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
