package chaos

import (
	"context"
	"time"
)

// sharedLoop is loop for a semaphore's or a read-write lock's name: a
// semaphore's holders and a reader validate and renew (their tokens order
// no writes), a writer writes the register as a mutex's holder does.
func (c *Client) sharedLoop(ctx context.Context) {
	kind := c.w.Kinds[c.name]
	for ctx.Err() == nil {
		c.shared = kind.ReadWrite && c.rng.IntN(2) == 0
		g, ok := c.Acquire(ctx)
		if !ok {
			sleep(ctx, time.Duration(c.rng.IntN(50))*time.Millisecond)
			continue
		}
		work := context.WithoutCancel(ctx)
		for range 1 + c.rng.IntN(3) {
			if kind.ReadWrite && !c.shared {
				if !c.Write(work, g.GetToken(), false) {
					break
				}
			} else if ok, _ := c.Validate(work, c.name, g.GetToken()); !ok {
				break
			}
			if c.KeepAlive(work, g) == Failed {
				break
			}
			time.Sleep(time.Duration(c.rng.IntN(100)) * time.Millisecond)
		}
		if c.rng.IntN(4) == 0 && g.GetToken() > 1 {
			c.Release(work, ReleaseOther, g.GetToken()-1, g.GetHandle())
		}
		c.Release(work, Release, g.GetToken(), g.GetHandle())
	}
}
