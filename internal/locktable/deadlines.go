package locktable

import (
	"container/heap"
	"time"
)

// deadlines is a min-heap of the instants the table must look at again: a
// grant's expiry, a waiter's end of wait, a lock's end of lock-delay.
// Entries are not removed when they stop mattering (a renewal pushes a new
// one); Tick checks each popped entry against the current state.
type deadlines struct{ h timerHeap }

type timer struct {
	at time.Time
	g  *grant
	w  *waiter
	lk *lock
}

func (d *deadlines) push(at time.Time, g *grant, w *waiter, lk *lock) {
	heap.Push(&d.h, timer{at: at, g: g, w: w, lk: lk})
}

// popDue pops the earliest entry if it is due at now.
func (d *deadlines) popDue(now time.Time) (timer, bool) {
	if len(d.h) == 0 || d.h[0].at.After(now) {
		return timer{}, false
	}
	return heap.Pop(&d.h).(timer), true
}

// next is the earliest entry's instant, zero if none.
func (d *deadlines) next() time.Time {
	if len(d.h) == 0 {
		return time.Time{}
	}
	return d.h[0].at
}

type timerHeap []timer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = timer{}
	*h = old[:len(old)-1]
	return x
}
