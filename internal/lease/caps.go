package lease

import (
	"fmt"
	"time"
)

// caps are the manager's bounds on what one acquisition may ask for that
// the options of New do not already hold.
type caps struct {
	maxWait time.Duration // WithMaxWait; 0: none
}

// WithMaxWait caps the queue wait of an Acquire (the daemon's --max-wait);
// 0, the default, leaves it uncapped. An Acquire without a wait waits at
// most d (then *NotGrantedError), and one asking for more fails with a
// *FieldError on "wait", nothing written, as a TTL above the max TTL does.
// Without a cap a forgotten client deadline keeps a queue entry, and its
// lease renewals, for as long as the client lives.
func WithMaxWait(d time.Duration) Option { return func(o *options) { o.caps.maxWait = d } }

func (c caps) validate() error {
	if c.maxWait < 0 {
		return fmt.Errorf("lease: max wait %v must not be negative", c.maxWait)
	}
	return nil
}

// capWait applies the wait cap to an acquisition's options: an unset wait
// becomes the cap, a longer one is refused.
func (c caps) capWait(o *acquireOptions) error {
	switch {
	case c.maxWait <= 0:
	case !o.hasWait:
		o.wait, o.hasWait = c.maxWait, true
	case o.wait > c.maxWait:
		return fieldErr("wait", "is %v; the server allows at most %v (--max-wait)", o.wait, c.maxWait)
	}
	return nil
}
