package keyspace

import "testing"

func TestHolders(t *testing.T) {
	mutex, reader, sem3, sem2 := Shape{}, Shape{Shared: true}, Shape{Limit: 3}, Shape{Limit: 2}
	for _, c := range []struct {
		name   string
		queue  []Shape
		wanted int
	}{
		{"free", nil, 0},
		{"a mutex holds alone", []Shape{mutex, mutex, mutex}, 1},
		{"readers overlap", []Shape{reader, reader, reader}, 3},
		{"a writer excludes", []Shape{mutex, reader, reader}, 1},
		{"a reader behind a waiting writer waits", []Shape{reader, reader, mutex, reader}, 2},
		{"a semaphore admits its limit", []Shape{sem3, sem3, sem3, sem3, sem3}, 3},
		{"fewer than the limit", []Shape{sem3, sem3}, 2},
		{"a mismatched limit blocks", []Shape{sem3, sem2, sem3}, 1},
		{"a mutex behind a semaphore waits", []Shape{sem3, mutex}, 1},
		{"a semaphore behind a mutex waits", []Shape{mutex, sem3}, 1},
		{"a reader behind a semaphore waits", []Shape{sem3, reader}, 1},
		{"a semaphore behind readers waits", []Shape{reader, sem3}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Holders(c.queue); got != c.wanted {
				t.Fatalf("Holders = %d, want %d", got, c.wanted)
			}
		})
	}
}

func TestShapeOf(t *testing.T) {
	for _, c := range []struct {
		value string
		shape Shape
		slot  int32
	}{
		{`{"hh":"x","since":1}`, Shape{}, 0},
		{`{"hh":"x","lim":4,"slot":3}`, Shape{Limit: 4}, 3},
		{`{"hh":"x","sh":true}`, Shape{Shared: true}, 0},
		{`not json "lim"`, Shape{}, 0},
	} {
		s, slot := ShapeOf([]byte(c.value))
		if s != c.shape || slot != c.slot {
			t.Errorf("ShapeOf(%s) = %+v, %d; want %+v, %d", c.value, s, slot, c.shape, c.slot)
		}
	}
}
