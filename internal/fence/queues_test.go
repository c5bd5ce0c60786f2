package fence

import (
	"testing"

	"github.com/coordinatord/coordinatord/internal/keyspace"
)

// The index keeps a queue's keys whichever way it stores them: a queue
// moves from one key inline to several and back as keys come and go, and
// its holders are the same as a plain slice of its members would give.
func TestQueueIndexKeepsEveryKey(t *testing.T) {
	sem := keyspace.Shape{Limit: 2}
	type op struct {
		del   bool
		key   string
		rev   int64
		shape keyspace.Shape
	}
	tests := []struct {
		name    string
		ops     []op
		oldest  int64
		all     []int64 // nil: a mutex's holder set
		queues  int
		oneKeys int // queues stored inline
	}{
		{"one key", []op{{key: "q/a", rev: 5}}, 5, nil, 1, 1},
		{"rewritten in place", []op{{key: "q/a", rev: 5}, {key: "q/a", rev: 5, shape: sem}}, 5, nil, 1, 1},
		{"a waiter joins", []op{{key: "q/a", rev: 5}, {key: "q/b", rev: 7}}, 5, nil, 1, 0},
		{"the holder leaves, the waiter is alone again", []op{{key: "q/a", rev: 5}, {key: "q/b", rev: 7}, {del: true, key: "q/a"}}, 7, nil, 1, 1},
		{"the waiter leaves", []op{{key: "q/a", rev: 5}, {key: "q/b", rev: 7}, {del: true, key: "q/b"}}, 5, nil, 1, 1},
		{"three, then one left", []op{{key: "q/a", rev: 5}, {key: "q/b", rev: 7}, {key: "q/c", rev: 9}, {del: true, key: "q/a"}, {del: true, key: "q/c"}}, 7, nil, 1, 1},
		{"the last key leaves", []op{{key: "q/a", rev: 5}, {del: true, key: "q/a"}}, 0, nil, 0, 0},
		{"an unknown key leaves", []op{{key: "q/a", rev: 5}, {del: true, key: "q/x"}}, 5, nil, 1, 1},
		{"an unknown key of a queue of several leaves", []op{{key: "q/a", rev: 5}, {key: "q/b", rev: 7}, {del: true, key: "q/x"}}, 5, nil, 1, 0},
		{"a semaphore's two holders", []op{{key: "q/a", rev: 5, shape: sem}, {key: "q/b", rev: 7, shape: sem}, {key: "q/c", rev: 9, shape: sem}}, 5, []int64{5, 7}, 1, 0},
		{"another queue is apart", []op{{key: "q/a", rev: 5}, {key: "r/a", rev: 6}}, 5, nil, 2, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newQueueIndex(0)
			for _, o := range tt.ops {
				if o.del {
					x.del(queueOf(o.key), o.key)
				} else {
					x.put(queueOf(o.key), o.key, o.rev, o.shape)
				}
			}
			hs := x.holders("q/")
			if hs.oldest != tt.oldest || len(hs.all) != len(tt.all) {
				t.Fatalf("holders = %+v, want oldest %d, all %v", hs, tt.oldest, tt.all)
			}
			for i := range tt.all {
				if hs.all[i] != tt.all[i] {
					t.Fatalf("holders = %+v, want all %v", hs, tt.all)
				}
			}
			if x.len() != tt.queues || len(x.one) != tt.oneKeys {
				t.Fatalf("%d queues (%d inline), want %d (%d inline)", x.len(), len(x.one), tt.queues, tt.oneKeys)
			}
		})
	}
}
