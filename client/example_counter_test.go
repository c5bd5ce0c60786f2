package client_test

import (
	"context"
	"fmt"
	"time"

	"github.com/coordinatord/coordinatord/client"
)

// A Limiter is a rate limiter shared by every process that names the same
// counter: here at most 3 sends per minute, whichever replica or process
// asks. Allow counts one hit and answers whether it may go ahead.
func ExampleLimiter_Allow() {
	c, err := client.Dial(coordinatorAddr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx := context.Background()

	sends := c.Limiter("example-counters/emails/user-42", 3, time.Minute)
	for i := range 5 {
		fmt.Println("send", i, "allowed:", sends.Allow(ctx))
	}
	// Hit says more: the count, what remains, when the window ends.
	r, err := c.Hit(ctx, "example-counters/emails/user-42", 3, time.Minute, client.WithHits(0)) // a peek
	fmt.Println("count", r.Count, "remaining", r.Remaining, "resets within a minute:", time.Until(r.ResetAt) <= time.Minute, err)
	// Output:
	// send 0 allowed: true
	// send 1 allowed: true
	// send 2 allowed: true
	// send 3 allowed: false
	// send 4 allowed: false
	// count 3 remaining 0 resets within a minute: true <nil>
}
