package lease

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Issue 14.4: the max wait is the lease manager's cap, no longer a server
// interceptor rewriting requests: an unset wait waits at most the cap, a
// longer one is a *FieldError on "wait" with nothing written.
func TestMaxWaitCapsTheQueueWait(t *testing.T) {
	const maxWait = 300 * time.Millisecond
	ms, cli := newReplicas(t, 1, WithMaxWait(maxWait))
	m := ms[0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := m.Acquire(ctx, "capped"); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name      string
		opts      []AcquireOption
		wantField string // "" : not granted within the (capped) wait
	}{
		{"unset wait: waits the cap", nil, ""},
		{"wait within the cap", []AcquireOption{WithWait(maxWait / 2)}, ""},
		{"try once", []AcquireOption{WithWait(0)}, ""},
		{"wait above the cap", []AcquireOption{WithWait(time.Hour)}, "wait"},
		{"above the cap wins over a bad ttl", []AcquireOption{WithWait(time.Hour), WithTTL(-time.Second)}, "wait"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before, err := cli.Get(ctx, "/")
			if err != nil {
				t.Fatal(err)
			}
			_, err = m.Acquire(ctx, "capped", tc.opts...)
			if tc.wantField != "" {
				var fe *FieldError
				if !errors.As(err, &fe) || fe.Field != tc.wantField {
					t.Fatalf("= %v, want a FieldError on %q", err, tc.wantField)
				}
				after, err := cli.Get(ctx, "/")
				if err != nil {
					t.Fatal(err)
				}
				if after.Header.Revision != before.Header.Revision {
					t.Fatalf("a refused Acquire wrote to etcd (revision %d -> %d)", before.Header.Revision, after.Header.Revision)
				}
				return
			}
			var ng *NotGrantedError
			if !errors.As(err, &ng) {
				t.Fatalf("= %v, want a NotGrantedError (the wait capped, not the 30s deadline)", err)
			}
		})
	}
	if _, err := New(cli, WithMaxWait(-time.Second)); err == nil {
		t.Fatal("New with a negative max wait: no error")
	}
}
