package client_test

import (
	"context"
	"fmt"

	"github.com/coordinatord/coordinatord/client"
)

// A resource's high-water mark is raised by every valid ValidateToken that
// names it; GetMark and Marks show it, and an admin rebinds it to another
// lock (a job renamed its lock) or deletes it (the resource is gone).
func ExampleClient_GetMark() {
	c, err := client.Dial(coordinatorAddr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx := context.Background()

	g, err := c.AcquireGrant(ctx, "example-marks/job")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _, _ = c.Release(ctx, client.GrantRef{Name: g.Name, Token: g.Token, Handle: g.Handle}) }()
	if _, err := c.ValidateToken(ctx, g.Name, g.Token, "example-marks/bucket"); err != nil {
		fmt.Println(err)
		return
	}

	m, err := c.GetMark(ctx, "example-marks/bucket")
	fmt.Println(m.Lock, m.Token == g.Token, err)
	for m, err := range c.Marks(ctx, "example-marks/") {
		fmt.Println("listed:", m.Resource, err)
	}
	m, err = c.RebindMark(ctx, "example-marks/bucket", "example-marks/job-v2")
	fmt.Println("rebound to", m.Lock, err)
	m, err = c.DeleteMark(ctx, "example-marks/bucket")
	fmt.Println("deleted, it was owned by", m.Lock, err)
	// Output:
	// example-marks/job true <nil>
	// listed: example-marks/bucket <nil>
	// rebound to example-marks/job-v2 <nil>
	// deleted, it was owned by example-marks/job-v2 <nil>
}
