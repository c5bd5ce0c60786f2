package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

// Finding 12 (lock API): owner accepted control characters, which forge
// rows and hide text in coordctl's tables. Every free-form string of the
// lock and session API refuses them as names do: INVALID_ARGUMENT naming
// the field, nothing written.
func TestFreeFormStringsRefuseControlCharacters(t *testing.T) {
	e := newEnv(t)
	acquire := func(r *coordinatorv1.AcquireRequest) func(context.Context) error {
		return func(ctx context.Context) error { _, err := e.lc.Acquire(ctx, r); return err }
	}
	hold := func(r *coordinatorv1.AcquireRequest) func(context.Context) error {
		return func(ctx context.Context) error {
			st, err := e.lc.Hold(ctx)
			if err != nil {
				return err
			}
			if err := st.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Acquire{Acquire: &coordinatorv1.HoldAcquire{Request: r}}}); err != nil {
				return err
			}
			_, err = st.Recv()
			return err
		}
	}
	openSession := func(owner string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := e.lc.OpenSession(ctx, &coordinatorv1.OpenSessionRequest{Owner: owner})
			return err
		}
	}
	cases := []struct {
		name  string
		call  func(context.Context) error
		field string
	}{
		{"acquire owner with a newline (a forged row)", acquire(&coordinatorv1.AcquireRequest{Name: "h", Owner: "me\nother-lock  42  root"}), "owner"},
		{"acquire owner with a carriage return", acquire(&coordinatorv1.AcquireRequest{Name: "h", Owner: "me\rroot"}), "owner"},
		{"acquire owner with an escape sequence", acquire(&coordinatorv1.AcquireRequest{Name: "h", Owner: "\x1b[2J\x1b[Hroot"}), "owner"},
		{"acquire owner with NUL", acquire(&coordinatorv1.AcquireRequest{Name: "h", Owner: "a\x00b"}), "owner"},
		{"acquire owner with a tab", acquire(&coordinatorv1.AcquireRequest{Name: "h", Owner: "a\tb"}), "owner"},
		{"acquire owner with DEL", acquire(&coordinatorv1.AcquireRequest{Name: "h", Owner: "a\x7fb"}), "owner"},
		{"acquire request_id with a control character", acquire(&coordinatorv1.AcquireRequest{Name: "h", RequestId: "0123456789abcdef\x1b"}), "request_id"},
		{"hold owner with an escape sequence", hold(&coordinatorv1.AcquireRequest{Name: "h", Owner: "\x1b]0;title\x07"}), "owner"},
		{"open session owner with a newline", openSession("batch\nforged"), "owner"},
		{"open session owner with an escape sequence", openSession("\x1b[31mred"), "owner"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := e.rev()
			err := tc.call(ctxT(t, 5*time.Second))
			if code(err) != codes.InvalidArgument || fieldOf(err) != tc.field {
				t.Fatalf("= %v (field %q), want INVALID_ARGUMENT on %q", err, fieldOf(err), tc.field)
			}
			if after := e.rev(); after != before {
				t.Fatalf("a refused request wrote to etcd (revision %d -> %d)", before, after)
			}
		})
	}
	// Printable text, spaces and other scripts remain welcome.
	if _, err := e.lc.Acquire(ctxT(t, 5*time.Second), &coordinatorv1.AcquireRequest{Name: "h", Owner: "pod web-7 (zone é, 日本)"}); err != nil {
		t.Fatalf("a printable owner: %v", err)
	}
}
