package keyspace

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
)

// Shape is what the queue's admission rule needs to know of one entry: the
// number of holders its queue admits (Limit, 0 or 1 for a mutex and a
// read-write lock) and whether it is a reader of a read-write lock
// (Shared). internal/lease writes it into every queue entry's record;
// internal/fence reads it back to tell holders apart from waiters.
type Shape struct {
	Limit  int32
	Shared bool
}

// MaxLimit is the largest semaphore limit: the claim reads the older
// entries of the queue, at most this many.
const MaxLimit = 1000

// Semaphore reports whether the entry is a counting semaphore's (limit > 1).
func (s Shape) Semaphore() bool { return s.Limit > 1 }

// Plain reports whether the entry is a mutex's (or a read-write lock's
// writer): admitted only at the head of its queue.
func (s Shape) Plain() bool { return s.Limit <= 1 && !s.Shared }

// EffectiveLimit is the entry's limit as a number of holders: 1 for a
// mutex and a read-write lock.
func (s Shape) EffectiveLimit() int32 { return max(s.Limit, 1) }

// shapeFields are the record fields (JSON names) a Shape is read from.
type shapeFields struct {
	Limit  int32 `json:"lim,omitempty"`
	Shared bool  `json:"sh,omitempty"`
	Slot   int32 `json:"slot,omitempty"`
}

// ShapeOf reads the shape (and a semaphore holder's slot) of a queue
// entry's value. A mutex's record has neither field, and reads without
// decoding: the holder view decodes every queue write.
func ShapeOf(value []byte) (Shape, int32) {
	if !bytes.Contains(value, []byte(`"lim"`)) && !bytes.Contains(value, []byte(`"sh"`)) {
		return Shape{}, 0
	}
	var f shapeFields
	_ = json.Unmarshal(value, &f) // a foreign value reads as a mutex's
	return Shape{Limit: f.Limit, Shared: f.Shared}, f.Slot
}

// Admitted is the queue's admission rule as a function of position: whether
// an entry of shape me, behind the older entries older (any order), is one
// of the queue's holders once every older entry ahead of it is granted.
//
//   - a mutex or a writer (Plain): only at the head (no older entry);
//   - a reader (Shared): when every older entry is a reader (the longest
//     run of readers at the head; a reader behind a waiting writer waits);
//   - a semaphore of limit N: among the N oldest, every older entry with
//     the same limit (a mismatched entry is refused and withdrawn: until
//     then, it blocks rather than shares).
func Admitted(older []Shape, me Shape) bool {
	switch {
	case me.Semaphore():
		if len(older) >= int(me.Limit) {
			return false
		}
		for _, o := range older {
			if o.Limit != me.Limit || o.Shared {
				return false
			}
		}
		return true
	case me.Shared:
		for _, o := range older {
			if !o.Shared || o.Semaphore() {
				return false
			}
		}
		return true
	}
	return len(older) == 0
}

// Holders returns, of a queue's entries in create-revision order (oldest
// first), how many from the head are holders by Admitted: the holders are
// always a prefix of the queue.
func Holders(shapes []Shape) int {
	for i := range shapes {
		if !Admitted(shapes[:i], shapes[i]) {
			return i
		}
	}
	return len(shapes)
}

// SlotMark is the high-water mark key of a semaphore's slot of a resource:
// one mark per (resource, slot), beside (never equal to) the resource's
// own mark key, since an escaped resource holds no '/'.
func (k Keyspace) SlotMark(resource string, slot int32) string {
	return k.Mark(resource) + "/" + strconv.Itoa(int(slot))
}

// MarkOf names the mark whose key is key, one Mark or SlotMark wrote: its
// resource and, for a slot's mark (perSlot), the slot.
func (k Keyspace) MarkOf(key string) (resource string, slot int32, perSlot bool) {
	esc, s, perSlot := strings.Cut(strings.TrimPrefix(key, k.Marks()), "/")
	if perSlot {
		n, _ := strconv.ParseInt(s, 10, 32) // SlotMark wrote a number
		slot = int32(n)
	}
	return Unescape(esc), slot, perSlot
}

// SlotDelay is the lock-delay key of a semaphore's slot: slot 0's is the
// lock's own (Delay), so that a free queue's join sees it.
func (k Keyspace) SlotDelay(name string, slot int32) string {
	if slot == 0 {
		return k.Delay(name)
	}
	return k.Delay(name) + "/" + strconv.Itoa(int(slot))
}
