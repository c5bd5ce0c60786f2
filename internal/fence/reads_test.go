package fence

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/coordinatord/coordinatord/internal/lease"
)

// Many concurrent validations share reads, every answer is right, and a
// validation that starts after a release never answers valid.
func TestBatchedValidationsStayLinearizable(t *testing.T) {
	m, v := setup(t)
	ctx := context.Background()
	const names = 8
	grants := make([]*lease.Grant, names)
	for i := range grants {
		g, err := m.Acquire(ctx, fmt.Sprint("b/", i), lease.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		grants[i] = g
	}
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 30 {
				g := grants[(w+i)%names]
				token := g.Token
				if i%2 == 1 {
					token-- // never current: a queue key was written after it, or none
				}
				got, err := v.Validate(ctx, g.Name, token, "")
				if err != nil || got.Valid != (i%2 == 0) {
					select {
					case errs <- fmt.Errorf("validate(%s, %d) = %+v, %w", g.Name, token, got, err):
					default:
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	if v.reads.inflight != 0 || len(v.reads.pending) != 0 {
		t.Fatalf("reads left in flight: %d inflight, %d pending", v.reads.inflight, len(v.reads.pending))
	}
	// Released, then validated under load: never valid again.
	for _, g := range grants {
		if ok, err := m.Release(ctx, g.Name, g.Token, g.Handle); err != nil || !ok {
			t.Fatalf("release: %v %v", ok, err)
		}
		var wg sync.WaitGroup
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if got, err := v.Validate(ctx, g.Name, g.Token, ""); err != nil || got.Valid {
					t.Errorf("validate after release = %+v, %v", got, err)
				}
			}()
		}
		wg.Wait()
	}
}
