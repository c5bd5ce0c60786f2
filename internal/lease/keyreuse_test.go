package lease

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A queue key is named by its lease, and a released grant's lease is pooled
// for the next Acquire: the same key name can be a waiter's predecessor and,
// a moment later, an entry behind it. These tests write it again in the gap
// between the read that names a waiter's blocker and the waiter's watch.

// A waiter's predecessor key can be written again, behind the waiter: a
// released grant's lease is pooled and reused by its next Acquire, and a
// queue key is named by its lease, so the holder that released and joined
// again at once has the same key, now newer than the waiter. The waiter
// heads the queue; waiting for that key to go (it waits for the waiter)
// deadlocked the queue until the callers gave up (coordbench's contended
// cell saw no cycle in a window).
func TestPredecessorKeyWrittenAgainBehindTheWaiter(t *testing.T) {
	m, cli := newTestManager(t)
	ctx := context.Background()
	o, err := m.acquireOptions("reborn", []AcquireOption{WithTTL(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	join := func() *attempt {
		t.Helper()
		p, err := m.join(ctx, ctx, "reborn", o)
		if err != nil || p.grant != nil || p.waiter == nil {
			t.Fatalf("join: %v %v %v; want a queued attempt", p.waiter, p.grant, err)
		}
		return p.waiter
	}
	holder, err := m.Acquire(ctx, "reborn", WithTTL(30*time.Second), WithWait(0))
	if err != nil {
		t.Fatal(err)
	}
	b := join()
	// The read a waiter makes once its watch exists shows the predecessor
	// as present while it is (a keys-only read carries create revisions).
	if r, err := cli.Get(ctx, b.pred.key, clientv3.WithKeysOnly()); err != nil || !b.pred.present(r.Kvs) {
		t.Fatalf("the holder's entry %+v is not present to its waiter: %v %v", b.pred, r, err)
	}
	if ok, err := m.Release(ctx, holder.Name, holder.Token, holder.Handle); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	again := join() // on the holder's pooled lease: the holder's key, behind b
	if again.key != b.pred.key || again.token < b.token {
		t.Fatalf("the join after the release is %q at %d; the test needs the released key %q again, behind %d", again.key, again.token, b.pred.key, b.token)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := m.wait(wctx, wctx, b, nil); err != nil {
		t.Fatalf("the waiter that heads the queue: wait = %v, want admitted", err)
	}
	if b.rec.Acquired == 0 {
		t.Fatal("the waiter heads the queue but did not claim the lock")
	}
	m.withdraw(b)
	if err := m.wait(wctx, wctx, again, nil); err != nil {
		t.Fatalf("the next waiter after the head left: wait = %v, want admitted", err)
	}
	m.withdraw(again)
}

// The same race where the blocker is read, not taken from the join: the
// entry a waiter reads as its blocker (a mutex's predecessor, a reader's
// nearest older writer) is released and written again under its pooled
// lease, behind the waiter, before the waiter's watch of it exists. The
// watch then finds another entry under that name, and the waiter looks
// again instead of waiting for it.
func TestBlockerWrittenAgainBeforeItsWatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode Mode // the waiter's
	}{
		{"mutex predecessor", ModeUnspecified},
		{"reader's older writer", ModeShared},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := newTestManager(t)
			ctx := context.Background()
			lock := "reborn/" + tc.name
			joinAs := func(mode Mode) *attempt {
				t.Helper()
				o, err := m.acquireOptions(lock, []AcquireOption{WithTTL(30 * time.Second), WithMode(mode)})
				if err != nil {
					t.Fatal(err)
				}
				p, err := m.join(ctx, ctx, lock, o)
				if err != nil || p.grant != nil || p.waiter == nil {
					t.Fatalf("join: %v %v %v; want a queued attempt", p.waiter, p.grant, err)
				}
				return p.waiter
			}
			holder, err := m.Acquire(ctx, lock, WithTTL(30*time.Second), WithWait(0))
			if err != nil {
				t.Fatal(err)
			}
			b := joinAs(tc.mode)
			defer m.withdraw(b)
			blocker, _, _, err := m.admissionOf(b).blocker(ctx, m.cli, b.token)
			if err != nil || blocker.key == "" || blocker.created != holder.Token {
				t.Fatalf("blocker = %+v, %v; want the holder's entry (token %d)", blocker, err, holder.Token)
			}
			if ok, err := m.Release(ctx, holder.Name, holder.Token, holder.Handle); err != nil || !ok {
				t.Fatalf("release: %v %v", ok, err)
			}
			again := joinAs(ModeUnspecified) // a writer on the pooled lease, behind b
			defer m.withdraw(again)
			if again.key != blocker.key || again.token < b.token {
				t.Fatalf("the join after the release is %q at %d; the test needs %q again, behind %d", again.key, again.token, blocker.key, b.token)
			}
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			w, stop := m.startWaiter(wctx, wctx, b)
			defer stop()
			if err := w.watchGone(blocker, time.After(5*time.Second)); err != nil {
				t.Fatalf("watch of a blocker written again behind the waiter = %v, want nil (look again)", err)
			}
			next, _, _, err := m.admissionOf(b).blocker(ctx, m.cli, b.token)
			if err != nil || next.key != "" {
				t.Fatalf("after looking again, blocker = %+v, %v; want none (b heads the queue)", next, err)
			}
		})
	}
}
