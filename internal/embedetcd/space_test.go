package embedetcd

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// Issue 13 row 8: the member never compacted, so history filled its quota
// and every write failed until an operator compacted, defragmented and
// disarmed the NOSPACE alarm. Now a store filled by history (a few keys
// rewritten, with auto-compaction off so that only the keeper can help)
// refuses writes with etcd's NOSPACE error for a moment and takes them
// again by itself, over and over under sustained load.
func TestFullStoreRecoversByItself(t *testing.T) {
	const quota = 4 << 20
	s, err := Start(context.Background(), t.TempDir(), WithFastElection(), WithLogger(testLogger(t)),
		WithAutoCompaction("revision", "0"), WithQuota(quota), WithSpaceCheck(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := dial(t, s.Endpoints())

	value := strings.Repeat("x", 100<<10)
	var full, recovered int
	fullSince := time.Time{}
	// A bound against a hang, not a speed target: three cycles take ~1.6 s
	// on a quiet machine, ~4 s under -race, and far longer on a loaded one
	// (CI failed it at 20 s while other builds ran).
	const bound = 90 * time.Second
	deadline := time.Now().Add(bound)
	for i := 0; recovered < 3 && time.Now().Before(deadline); i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.Put(ctx, "/locks/k"+string(rune('a'+i%4)), value)
		cancel()
		switch {
		case err == nil:
			if !fullSince.IsZero() {
				recovered++
				t.Logf("writes accepted again after %v", time.Since(fullSince).Round(time.Millisecond))
				fullSince = time.Time{}
			}
		case errors.Is(err, rpctypes.ErrNoSpace):
			if fullSince.IsZero() {
				full++
				fullSince = time.Now()
			}
			time.Sleep(20 * time.Millisecond)
		default:
			t.Fatalf("put %d: %v", i, err)
		}
	}
	if full == 0 || recovered < 3 {
		t.Fatalf("store filled %d times and recovered %d times in %v; want it to fill and recover by itself 3 times", full, recovered, bound)
	}
	if n := s.etcd.Server.Backend().Size(); n >= quota {
		t.Fatalf("file is %d bytes after recovery, quota %d", n, quota)
	}
}

// testLogger logs the keeper's decisions (and etcd's warnings) into the
// test's output, shown when it fails.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
