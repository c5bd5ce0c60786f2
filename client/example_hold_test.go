package client_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/coordinatord/coordinatord/client"
)

// Hold keeps the lock over one stream: when an operator force-releases it,
// the coordinator says so on the stream and the lock ends at once, without
// waiting for the next heartbeat.
func ExampleClient_Hold() {
	c, err := client.Dial(coordinatorAddr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx := context.Background()

	lock, err := c.Hold(ctx, "example/hold", client.WithTTL(30*time.Second))
	if err != nil {
		fmt.Println("hold:", err)
		return
	}
	// An operator, elsewhere (coordctl force-release):
	released, err := c.ForceRelease(ctx, "example/hold", lock.Token())
	fmt.Println("force-released:", released, err)

	select {
	case <-lock.Done():
		fmt.Println("lost:", errors.Is(lock.Err(), client.ErrLost))
	case <-time.After(5 * time.Second): // the next heartbeat is ~9s away
		fmt.Println("the loss was not pushed")
	}
	_ = lock.Release(ctx) // stops nothing more: the lock is gone
	// Output:
	// force-released: true <nil>
	// lost: true
}

// Context is cancelled when the lock is lost or released, with Err as its
// cause: hand it to the work done under the lock.
func ExampleLock_Context() {
	c, err := client.Dial(coordinatorAddr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx := context.Background()

	lock, err := c.Hold(ctx, "example/context", client.WithTTL(10*time.Second))
	if err != nil {
		fmt.Println("hold:", err)
		return
	}
	work := lock.Context()
	fmt.Println("while held:", work.Err())

	_ = lock.Release(ctx)
	<-work.Done()
	fmt.Println("after release:", work.Err(), "cause released:", errors.Is(context.Cause(work), client.ErrReleased))
	// Output:
	// while held: <nil>
	// after release: context canceled cause released: true
}

// Pages reads the held locks one page per call, each call with its own
// context (and so its own deadline).
func ExampleClient_Pages() {
	c, err := client.Dial(coordinatorAddr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx := context.Background()

	for _, name := range []string{"pages/a", "pages/b", "pages/c"} {
		g, err := c.AcquireGrant(ctx, name, client.WithTTL(10*time.Second))
		if err != nil {
			fmt.Println(err)
			return
		}
		defer func() { _, _ = c.Release(ctx, g.GrantRef) }()
	}
	p := c.Pages("pages/", client.WithPageSize(2))
	for page := 1; p.More(); page++ {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		holders, err := p.Next(pctx)
		cancel()
		if err != nil {
			fmt.Println(err)
			return
		}
		for _, h := range holders {
			fmt.Println("page", page, h.Name)
		}
	}
	// Output:
	// page 1 pages/a
	// page 1 pages/b
	// page 2 pages/c
}

// ForceRelease ends a grant whatever its holder does, for an operator; it
// names the grant by its token, so it never ends the grant of a later
// holder by mistake.
func ExampleClient_ForceRelease() {
	c, err := client.Dial(coordinatorAddr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx := context.Background()

	stuck, err := c.AcquireGrant(ctx, "example/stuck", client.WithTTL(time.Minute))
	if err != nil {
		fmt.Println(err)
		return
	}
	d, err := c.Describe(ctx, "example/stuck")
	if err != nil {
		fmt.Println(err)
		return
	}
	released, err := c.ForceRelease(ctx, "example/stuck", d.Holder.Token)
	fmt.Println("released:", released, err)
	again, err := c.ForceRelease(ctx, "example/stuck", stuck.Token)
	fmt.Println("again:", again, err)
	// Output:
	// released: true <nil>
	// again: false <nil>
}
