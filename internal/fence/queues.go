package fence

import (
	"strings"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// member is one key of a queue: the part after the queue prefix, and its
// create revision.
type member struct {
	suffix string
	rev    int64
	shape  keyspace.Shape // a semaphore's or a reader's entry (keyspace.ShapeOf)
}

// queueIndex is the view's copy of every queue's keys, by queue prefix.
// Nearly every queue has one key (its holder), so such a queue is one map
// entry holding its member inline, and its prefix and suffix share one
// copy of the key: one allocation per held lock (100,000 held locks: about
// 4 MiB less than a slice per queue; BenchmarkViewMemory). A queue with
// waiters or several holders moves to many, and back when one key is left.
type queueIndex struct {
	one  map[string]member   // queue prefix -> its only key
	many map[string][]member // queue prefix -> its keys (two or more)
}

func newQueueIndex(size int) queueIndex {
	return queueIndex{one: make(map[string]member, size), many: map[string][]member{}}
}

// put records key (of queue q) with create revision rev and shape.
func (x *queueIndex) put(q, key string, rev int64, shape keyspace.Shape) {
	suffix := key[len(q):]
	if ms, ok := x.many[q]; ok {
		for i := range ms {
			if ms[i].suffix == suffix {
				ms[i].rev, ms[i].shape = rev, shape
				return
			}
		}
		x.many[q] = append(ms, member{strings.Clone(suffix), rev, shape})
		return
	}
	if m, ok := x.one[q]; ok {
		if m.suffix == suffix {
			x.one[q] = member{m.suffix, rev, shape}
			return
		}
		delete(x.one, q)
		x.many[strings.Clone(q)] = []member{m, {strings.Clone(suffix), rev, shape}}
		return
	}
	// The first key of a queue: one copy of the key (not a slice of the
	// caller's, whose bytes can then go) holds both the prefix and suffix.
	key = strings.Clone(key)
	x.one[key[:len(q)]] = member{key[len(q):], rev, shape}
}

// del forgets key (of queue q).
func (x *queueIndex) del(q, key string) {
	suffix := key[len(q):]
	if m, ok := x.one[q]; ok {
		if m.suffix == suffix {
			delete(x.one, q)
		}
		return
	}
	ms := x.many[q]
	for i := range ms {
		if ms[i].suffix == suffix {
			ms[i] = ms[len(ms)-1]
			ms = ms[:len(ms)-1]
			break
		}
	}
	switch len(ms) {
	case 0:
		delete(x.many, q)
	case 1:
		delete(x.many, q)
		x.one[strings.Clone(q)] = ms[0]
	default:
		x.many[q] = ms
	}
}

// holders are the holders among queue q's keys (holdersIn).
func (x *queueIndex) holders(q string) holderSet {
	if m, ok := x.one[q]; ok {
		return holderSet{oldest: m.rev}
	}
	return holdersIn(x.many[q])
}

// len is the number of queues with at least one key.
func (x *queueIndex) len() int { return len(x.one) + len(x.many) }
