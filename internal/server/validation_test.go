package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/durationpb"

	coordinatorv1 "github.com/coordinatord/coordinatord/api/coordinator/v1"
)

func TestBadInputIsRefusedAndWritesNothing(t *testing.T) {
	e := newEnv(t, withMaxTTL(time.Minute))
	g := e.acquire("ok", 30*time.Second)
	long := strings.Repeat("n", 513)
	acq := func(r *coordinatorv1.AcquireRequest) func(context.Context) error {
		return func(ctx context.Context) error { _, err := e.lc.Acquire(ctx, r); return err }
	}
	cases := []struct {
		name  string
		call  func(context.Context) error
		field string
	}{
		{"acquire empty name", acq(&coordinatorv1.AcquireRequest{}), "name"},
		{"acquire oversized name", acq(&coordinatorv1.AcquireRequest{Name: long}), "name"},
		{"acquire control character", acq(&coordinatorv1.AcquireRequest{Name: "a\nb"}), "name"},
		{"acquire negative ttl", acq(&coordinatorv1.AcquireRequest{Name: "n", Ttl: dur(-time.Second)}), "ttl"},
		{"acquire zero ttl", acq(&coordinatorv1.AcquireRequest{Name: "n", Ttl: dur(0)}), "ttl"},
		{"acquire huge ttl", acq(&coordinatorv1.AcquireRequest{Name: "n", Ttl: dur(24 * time.Hour)}), "ttl"},
		{"acquire invalid duration", acq(&coordinatorv1.AcquireRequest{Name: "n", Ttl: &durationpb.Duration{Seconds: 1, Nanos: -5}}), "ttl"},
		{"acquire negative wait", acq(&coordinatorv1.AcquireRequest{Name: "n", Wait: dur(-time.Millisecond)}), "wait"},
		{"acquire oversized owner", acq(&coordinatorv1.AcquireRequest{Name: "n", Owner: strings.Repeat("o", 257)}), "owner"},
		{"release malformed handle", func(ctx context.Context) error {
			_, err := e.lc.Release(ctx, &coordinatorv1.ReleaseRequest{Name: "ok", Token: g.Token, Handle: "not-a-handle"})
			return err
		}, "handle"},
		{"release empty handle", func(ctx context.Context) error {
			_, err := e.lc.Release(ctx, &coordinatorv1.ReleaseRequest{Name: "ok", Token: g.Token})
			return err
		}, "handle"},
		{"release zero token", func(ctx context.Context) error {
			_, err := e.lc.Release(ctx, &coordinatorv1.ReleaseRequest{Name: "ok", Handle: g.Handle})
			return err
		}, "token"},
		{"release empty name", func(ctx context.Context) error {
			_, err := e.lc.Release(ctx, &coordinatorv1.ReleaseRequest{Token: g.Token, Handle: g.Handle})
			return err
		}, "name"},
		{"keepalive malformed handle", func(ctx context.Context) error {
			_, err := e.lc.KeepAlive(ctx, &coordinatorv1.KeepAliveRequest{Name: "ok", Token: g.Token, Handle: g.Handle + "x"})
			return err
		}, "handle"},
		{"keepalive negative token", func(ctx context.Context) error {
			_, err := e.lc.KeepAlive(ctx, &coordinatorv1.KeepAliveRequest{Name: "ok", Token: -1, Handle: g.Handle})
			return err
		}, "token"},
		{"validate zero token", func(ctx context.Context) error {
			_, err := e.lc.ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: "ok"})
			return err
		}, "token"},
		{"validate oversized name", func(ctx context.Context) error {
			_, err := e.lc.ValidateToken(ctx, &coordinatorv1.ValidateTokenRequest{Name: long, Token: 1})
			return err
		}, "name"},
		{"describe empty name", func(ctx context.Context) error {
			_, err := e.lc.Describe(ctx, &coordinatorv1.DescribeRequest{})
			return err
		}, "name"},
		{"list negative page size", func(ctx context.Context) error {
			_, err := e.lc.List(ctx, &coordinatorv1.ListRequest{PageSize: -1})
			return err
		}, "page_size"},
		{"list bad page token", func(ctx context.Context) error {
			_, err := e.lc.List(ctx, &coordinatorv1.ListRequest{PageToken: "!!"})
			return err
		}, "page_token"},
		{"list page token of another prefix", func(ctx context.Context) error {
			r, err := e.lc.List(ctx, &coordinatorv1.ListRequest{Prefix: "zzz", PageToken: "b2s"}) // "ok"
			_ = r
			return err
		}, "page_token"},
		{"acquire short request_id", acq(&coordinatorv1.AcquireRequest{Name: "n", RequestId: "abc"}), "request_id"},
		{"acquire request_id with a space", acq(&coordinatorv1.AcquireRequest{Name: "n", RequestId: "0123456789 abcdef"}), "request_id"},
		{"acquire zero max_hold", acq(&coordinatorv1.AcquireRequest{Name: "n", MaxHold: dur(0)}), "max_hold"},
		{"acquire max_hold above cap", acq(&coordinatorv1.AcquireRequest{Name: "n", MaxHold: dur(48 * time.Hour)}), "max_hold"},
		{"acquire negative lock_delay", acq(&coordinatorv1.AcquireRequest{Name: "n", LockDelay: dur(-time.Second)}), "lock_delay"},
		{"acquire lock_delay above cap", acq(&coordinatorv1.AcquireRequest{Name: "n", LockDelay: dur(time.Hour)}), "lock_delay"},
		{"acquire malformed session_handle", acq(&coordinatorv1.AcquireRequest{Name: "n", SessionHandle: "nope"}), "session_handle"},
		{"acquire ttl with session_handle", acq(&coordinatorv1.AcquireRequest{Name: "n", SessionHandle: g.Handle, Ttl: dur(time.Second)}), "ttl"},
		{"force release zero token", func(ctx context.Context) error {
			_, err := e.lc.ForceRelease(ctx, &coordinatorv1.ForceReleaseRequest{Name: "ok"})
			return err
		}, "token"},
		{"open session zero ttl", func(ctx context.Context) error {
			_, err := e.lc.OpenSession(ctx, &coordinatorv1.OpenSessionRequest{Ttl: dur(0)})
			return err
		}, "ttl"},
		{"open session huge ttl", func(ctx context.Context) error {
			_, err := e.lc.OpenSession(ctx, &coordinatorv1.OpenSessionRequest{Ttl: dur(time.Hour)})
			return err
		}, "ttl"},
		{"keepalive session malformed handle", func(ctx context.Context) error {
			_, err := e.lc.KeepAliveSession(ctx, &coordinatorv1.KeepAliveSessionRequest{Handle: "x"})
			return err
		}, "handle"},
		{"watch negative start_revision", func(ctx context.Context) error {
			w, err := e.lc.Watch(ctx, &coordinatorv1.WatchRequest{Name: "ok", StartRevision: -1})
			if err != nil {
				return err
			}
			_, err = w.Recv()
			return err
		}, "start_revision"},
		{"watch empty name", func(ctx context.Context) error {
			w, err := e.lc.Watch(ctx, &coordinatorv1.WatchRequest{})
			if err != nil {
				return err
			}
			_, err = w.Recv()
			return err
		}, "name"},
		{"hold starting with a heartbeat", func(ctx context.Context) error {
			h, err := e.lc.Hold(ctx)
			if err != nil {
				return err
			}
			_ = h.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Heartbeat{Heartbeat: &coordinatorv1.HoldHeartbeat{}}})
			_, err = h.Recv()
			return err
		}, "kind"},
		{"hold acquire with a bad name", func(ctx context.Context) error {
			h, err := e.lc.Hold(ctx)
			if err != nil {
				return err
			}
			_ = h.Send(&coordinatorv1.HoldRequest{Kind: &coordinatorv1.HoldRequest_Acquire{Acquire: &coordinatorv1.HoldAcquire{Request: &coordinatorv1.AcquireRequest{Name: ""}}}})
			_, err = h.Recv()
			return err
		}, "name"},
		{"acquire invalid UTF-8 name (raw wire)", rawCall(e, "Acquire", 1), "name"},
		{"acquire invalid UTF-8 owner (raw wire)", rawCall(e, "Acquire", 4), "owner"},
		{"validate invalid UTF-8 name (raw wire)", rawCall(e, "ValidateToken", 1), "name"},
		{"release invalid UTF-8 name (raw wire)", rawCall(e, "Release", 1), "name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := e.rev()
			err := tc.call(ctxT(t, 10*time.Second))
			if code(err) != codes.InvalidArgument {
				t.Fatalf("got %v, want INVALID_ARGUMENT", err)
			}
			if got := fieldOf(err); got != tc.field {
				t.Fatalf("BadRequest names field %q, want %q (%v)", got, tc.field, err)
			}
			if after := e.rev(); after != before {
				t.Fatalf("etcd revision moved from %d to %d: bad input was written", before, after)
			}
		})
	}
	if v := e.validate("ok", g.Token); !v.Valid {
		t.Fatalf("the bystander grant was disturbed: %v", v)
	}
}

// rawCall sends a request whose string field num holds invalid UTF-8, which
// no protobuf library would marshal: it is built on the wire by hand. The
// other fields are valid so only that field is at fault.
func rawCall(e *env, method string, num protowire.Number) func(context.Context) error {
	return func(ctx context.Context) error {
		var b []byte
		if num != 1 {
			b = protowire.AppendTag(b, 1, protowire.BytesType)
			b = protowire.AppendString(b, "valid-name")
		}
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendBytes(b, []byte{'a', 0xff, 0xfe})
		if method == "ValidateToken" || method == "Release" {
			b = protowire.AppendTag(b, 2, protowire.VarintType)
			b = protowire.AppendVarint(b, 7)
		}
		if method == "Release" {
			b = protowire.AppendTag(b, 3, protowire.BytesType)
			b = protowire.AppendString(b, "0000000000000001.AAAAAAAAAAAAAAAAAAAAAA")
		}
		var out []byte
		return e.conn.Invoke(ctx, "/coordinator.v1.LockService/"+method, &b, &out, grpc.ForceCodecV2(rawCodec{}))
	}
}

// rawCodec sends and receives *[]byte unchanged.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }
