package fence

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/coordinatord/coordinatord/internal/embedetcd"
	"github.com/coordinatord/coordinatord/internal/lease"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/logutil.(*MergeLogger).outputLoop"),
	)
}

func setup(t *testing.T, opts ...Option) (*lease.Manager, *Validator) {
	t.Helper()
	return setupB(t, opts...)
}

// setupB is setup for tests and benchmarks.
func setupB(t testing.TB, opts ...Option) (*lease.Manager, *Validator) {
	t.Helper()
	e, err := embedetcd.Start(context.Background(), t.TempDir(), embedetcd.WithFastElection())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	m, err := lease.New(cli, lease.WithKeyPrefix("/t/"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m, New(cli, m.Keyspace(), opts...)
}

// The holder changes between the read that finds the token current and the
// transaction that would advance the mark: the transaction must fail (the
// queue compare), and the retry must refuse the token without moving the
// mark.
func TestMarkNotAdvancedWhenHolderChangesMidway(t *testing.T) {
	m, v := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := m.Acquire(ctx, "l", lease.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var b *lease.Grant
	testHookBeforeAdvance = func() {
		testHookBeforeAdvance = nil // once
		if ok, err := m.Release(ctx, "l", a.Token, a.Handle); !ok || err != nil {
			t.Errorf("release A: %v %v", ok, err)
		}
		if b, err = m.Acquire(ctx, "l", lease.WithTTL(5*time.Second)); err != nil {
			t.Errorf("acquire B: %v", err)
		}
	}
	defer func() { testHookBeforeAdvance = nil }()
	verdict, err := v.Validate(ctx, "l", a.Token, "r")
	if err != nil {
		t.Fatal(err)
	}
	if verdict.Valid || verdict.Reason != Superseded || b == nil || verdict.CurrentToken != b.Token {
		t.Fatalf("A validated while B took over: %+v; want superseded by B", verdict)
	}
	if _, err := v.GetMark(ctx, MarkID{Resource: "r"}); !errors.Is(err, ErrNoMark) {
		t.Fatalf("mark after a refused validation: %v, want ErrNoMark", err)
	}
	// Released between read and commit, nobody newer: the empty queue fails
	// the range compare too.
	testHookBeforeAdvance = func() {
		testHookBeforeAdvance = nil
		if ok, err := m.Release(ctx, "l", b.Token, b.Handle); !ok || err != nil {
			t.Errorf("release B: %v %v", ok, err)
		}
	}
	verdict, err = v.Validate(ctx, "l", b.Token, "r")
	if err != nil {
		t.Fatal(err)
	}
	if verdict.Valid || verdict.Reason != NotHeld {
		t.Fatalf("B validated after its release: %+v; want not held", verdict)
	}
	if _, err := v.GetMark(ctx, MarkID{Resource: "r"}); !errors.Is(err, ErrNoMark) {
		t.Fatalf("mark after a refused validation: %v, want ErrNoMark", err)
	}
}
