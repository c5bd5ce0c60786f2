package client_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/coordinatord/coordinatord/client"
)

// Acquire a lock, work under it while it is held, and release it. Check
// Done before each step, and send the token with every write so that the
// resource can refuse a write made after a pause.
func Example() {
	c, err := client.Dial(coordinatorAddr) // e.g. "127.0.0.1:7070"
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx := context.Background()

	lock, err := c.Acquire(ctx, "reports/nightly", client.WithTTL(10*time.Second), client.WithOwner("example"))
	if err != nil {
		fmt.Println("acquire:", err)
		return
	}
	for step := range 3 {
		select {
		case <-lock.Done():
			fmt.Println("stop at once, the lock is gone:", lock.Err())
			return
		default:
		}
		// write(ctx, data, lock.Token()) — see package fence for the resource side.
		fmt.Printf("step %d under the lock\n", step)
	}
	if err := lock.Release(ctx); err != nil {
		fmt.Println("release:", err)
	}
	fmt.Println("released:", errors.Is(lock.Err(), client.ErrReleased))
	// Output:
	// step 0 under the lock
	// step 1 under the lock
	// step 2 under the lock
	// released: true
}

// TryAcquire does not wait: a held lock answers ErrLockHeld at once, with
// the holder's token.
func ExampleClient_TryAcquire() {
	c, err := client.Dial(coordinatorAddr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx := context.Background()

	first, err := c.Acquire(ctx, "jobs/compaction")
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = c.TryAcquire(ctx, "jobs/compaction")
	var held *client.HeldError
	fmt.Println("held:", errors.Is(err, client.ErrLockHeld))
	fmt.Println("by the first holder:", errors.As(err, &held) && held.HolderToken == first.Token())
	_ = first.Release(ctx)
	// Output:
	// held: true
	// by the first holder: true
}

// A worker stops as soon as the lock is lost, whether the coordinator said
// so or the safe-until time passed without a renewal (e.g. after a pause).
func ExampleLock_Done() {
	c, err := client.Dial(coordinatorAddr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx := context.Background()

	lock, err := c.Acquire(ctx, "jobs/indexer", client.WithTTL(5*time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}
	work := time.NewTicker(10 * time.Millisecond)
	defer work.Stop()
	for i := 0; ; i++ {
		select {
		case <-lock.Done():
			fmt.Println("stopped:", errors.Is(lock.Err(), client.ErrReleased))
			return
		case <-work.C:
			if i == 3 { // done with the work: give the lock up
				_ = lock.Release(ctx)
			}
		}
	}
	// Output:
	// stopped: true
}
