package client_test

import (
	"context"
	"fmt"
	"time"

	"github.com/coordinatord/coordinatord/client"
)

// A grant can outlive the process that acquired it: AcquireGrant starts no
// heartbeat, and whoever is given the GrantRef (name, token, secret handle)
// renews it or gives it up, as coordctl's keepalive and release do.
func ExampleClient_AcquireGrant() {
	c, err := client.Dial(coordinatorAddr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx := context.Background()

	g, err := c.AcquireGrant(ctx, "batch/export", client.WithTTL(10*time.Second), client.WithOwner("cron"))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("granted for", g.TTL)

	// Later, maybe in another process: the three values are enough.
	ref := client.GrantRef{Name: g.Name, Token: g.Token, Handle: g.Handle}
	r, err := c.KeepAlive(ctx, ref)
	fmt.Println("renewed for", r.TTL, err)
	released, err := c.Release(ctx, ref)
	fmt.Println("released:", released, err)
	released, err = c.Release(ctx, ref) // not yours any more: false, not an error
	fmt.Println("released again:", released, err)
	// Output:
	// granted for 10s
	// renewed for 10s <nil>
	// released: true <nil>
	// released again: false <nil>
}

// Describe shows who holds a lock and who waits for it; List pages through
// the held locks under a prefix.
func ExampleClient_Describe() {
	c, err := client.Dial(coordinatorAddr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx := context.Background()

	lock, err := c.Acquire(ctx, "ops/report-a", client.WithOwner("host-a"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() {
		if err := lock.Release(ctx); err != nil {
			fmt.Println(err)
		}
	}()
	d, err := c.Describe(ctx, "ops/report-a")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("held by", d.Holder.Owner, "token ok:", d.Holder.Token == lock.Token(), "waiters:", len(d.Waiters))
	d, _ = c.Describe(ctx, "ops/report-b")
	fmt.Println("free:", d.Holder == nil)
	// Output:
	// held by host-a token ok: true waiters: 0
	// free: true
}

// List yields every held lock under a prefix, fetching page after page.
func ExampleClient_List() {
	c, err := client.Dial(coordinatorAddr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx := context.Background()

	for _, name := range []string{"shards/1", "shards/2", "shards/3"} {
		lock, err := c.Acquire(ctx, name)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer func() {
			if err := lock.Release(ctx); err != nil {
				fmt.Println(err)
			}
		}()
	}
	for h, err := range c.List(ctx, "shards/", client.WithPageSize(2)) {
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(h.Name)
	}
	// Output:
	// shards/1
	// shards/2
	// shards/3
}

// Watch streams a lock's state, then each change; ForceRelease ends a
// stuck holder's grant (admins only), which its watchers see.
func ExampleClient_Watch() {
	c, err := client.Dial(coordinatorAddr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	w, err := c.Watch(ctx, "leader/scheduler")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer w.Close()
	ev, err := w.Next()
	fmt.Println(ev.Kind, "free:", ev.Holder == nil, err)

	g, err := c.AcquireGrant(ctx, "leader/scheduler", client.WithOwner("node-1"))
	if err != nil {
		fmt.Println(err)
		return
	}
	ev, _ = w.Next()
	fmt.Println(ev.Kind, ev.Holder.Owner)
	released, err := c.ForceRelease(ctx, "leader/scheduler", g.Token)
	fmt.Println("force-released:", released, err)
	ev, _ = w.Next()
	fmt.Println(ev.Kind, ev.Holder.Token == g.Token)
	// Output:
	// current free: true <nil>
	// acquired node-1
	// force-released: true <nil>
	// force-released true
}

// A session is one lease for many locks: one KeepAlive renews them all,
// and Close releases them all.
func ExampleClient_OpenSession() {
	c, err := client.Dial(coordinatorAddr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctx := context.Background()

	s, err := c.OpenSession(ctx, client.WithSessionTTL(10*time.Second), client.WithSessionOwner("worker-7"))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, name := range []string{"partitions/a", "partitions/b"} {
		if _, err := s.Acquire(ctx, name); err != nil {
			fmt.Println(err)
			return
		}
	}
	_, held, err := s.KeepAlive(ctx)
	fmt.Println("renewed locks:", len(held), err)
	closed, released, err := s.Close(ctx)
	fmt.Println("closed:", closed, "released:", len(released), err)
	// Output:
	// renewed locks: 2 <nil>
	// closed: true released: 2 <nil>
}
