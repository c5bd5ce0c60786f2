package lease

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A waiter's admission and a pending lock-delay key. Group commit can put
// another grant's claim, which writes that grant's lock-delay key, in the
// same transaction as a waiter's join: the key then has the waiter's
// create revision. It is still the other grant's delay and must block the
// waiter once the holder is gone; only a delay key on the entry's own
// lock-delay lease is its own.
func TestAdmissionWaitsForAnotherGrantsDelay(t *testing.T) {
	m, cli := newTestManager(t)
	ctx := context.Background()
	lease := func() clientv3.LeaseID {
		t.Helper()
		l, err := cli.Grant(ctx, 60)
		if err != nil {
			t.Fatal(err)
		}
		return l.ID
	}
	tests := []struct {
		name      string
		sameTxn   bool // the delay key is written in the waiter's join transaction
		ownDelay  bool // the delay key is on the waiter's own lock-delay lease
		wantBlock bool
	}{
		{"another grant's delay, written in the waiter's join transaction", true, false, true},
		{"another grant's delay, written before the waiter joined", false, false, true},
		{"the waiter's own delay", true, true, false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := "delayed/" + string(rune('a'+i))
			holder, waiter, delay := lease(), lease(), lease()
			q := m.admission(name)
			if tt.ownDelay {
				q.ownDelay = delay
			}
			if _, err := cli.Put(ctx, m.ks.key(name, holder), "", clientv3.WithLease(holder)); err != nil {
				t.Fatal(err)
			}
			putDelay := clientv3.OpPut(q.delay, "", clientv3.WithLease(delay))
			join := clientv3.OpPut(m.ks.key(name, waiter), "", clientv3.WithLease(waiter))
			if !tt.sameTxn {
				if _, err := cli.Do(ctx, putDelay); err != nil {
					t.Fatal(err)
				}
			}
			ops := []clientv3.Op{join}
			if tt.sameTxn {
				ops = append(ops, putDelay)
			}
			tr, err := cli.Txn(ctx).Then(ops...).Commit()
			if err != nil {
				t.Fatal(err)
			}
			token := tr.Header.Revision
			// The holder's lease expires: its key goes, its lock-delay stays.
			if _, err := cli.Revoke(ctx, holder); err != nil {
				t.Fatal(err)
			}
			got, _, op, err := q.blocker(ctx, cli, token)
			if err != nil {
				t.Fatalf("%s: %v", op, err)
			}
			if blocked := got.key == q.delay; blocked != tt.wantBlock || (!blocked && got.key != "") {
				t.Fatalf("blocker = %q, want the lock-delay key: %v", got.key, tt.wantBlock)
			}
		})
	}
}
