package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/coordinatord/coordinatord/internal/server"
)

// counterValue is the value of the counter name whose labels include
// labels, summed over the matching series; 0 if none.
func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// A request that is not protobuf answers INVALID_ARGUMENT (reason
// MALFORMED_MESSAGE), not INTERNAL, writes nothing, and is counted in the
// request metrics like any other refusal; on a stream as well.
func TestMalformedProtobufIsInvalidArgumentAndCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics := server.NewMetrics(reg)
	e := newEnvWith(t, []server.Option{metrics.Option()})
	var truncated, wrongType, badLength []byte
	truncated = protowire.AppendTag(truncated, 2, protowire.VarintType) // a tag, then no value
	wrongType = protowire.AppendTag(wrongType, 1, protowire.Fixed32Type)
	wrongType = append(wrongType, 1, 2) // 2 of 4 bytes
	badLength = protowire.AppendTag(badLength, 1, protowire.BytesType)
	badLength = protowire.AppendVarint(badLength, 50)
	badLength = append(badLength, "short"...)
	for _, tc := range []struct {
		name string
		b    []byte
	}{{"truncated varint", truncated}, {"truncated fixed32", wrongType}, {"length past the end", badLength}} {
		t.Run(tc.name, func(t *testing.T) {
			before, rev := counterValue(t, reg, "grpc_server_handled_total", map[string]string{"grpc_method": "Acquire", "grpc_code": "InvalidArgument"}), e.rev()
			b, out := tc.b, []byte(nil)
			err := e.conn.Invoke(ctxT(t, 10*time.Second), "/coordinator.v1.LockService/Acquire", &b, &out, grpc.ForceCodecV2(rawCodec{}))
			if code(err) != codes.InvalidArgument || reasonOf(err) != "MALFORMED_MESSAGE" {
				t.Fatalf("Acquire with malformed bytes: %v (reason %q), want INVALID_ARGUMENT MALFORMED_MESSAGE", err, reasonOf(err))
			}
			if got := counterValue(t, reg, "grpc_server_handled_total", map[string]string{"grpc_method": "Acquire", "grpc_code": "InvalidArgument"}); got != before+1 {
				t.Errorf("grpc_server_handled_total{Acquire,InvalidArgument} = %v, want %v", got, before+1)
			}
			if got := e.rev(); got != rev {
				t.Errorf("a malformed request wrote to etcd: revision %d -> %d", rev, got)
			}

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := e.conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/coordinator.v1.LockService/Hold", grpc.ForceCodecV2(rawCodec{}))
			if err != nil {
				t.Fatal(err)
			}
			if err := st.SendMsg(&b); err != nil {
				t.Fatal(err)
			}
			if err := st.RecvMsg(&out); code(err) != codes.InvalidArgument || reasonOf(err) != "MALFORMED_MESSAGE" {
				t.Fatalf("Hold with a malformed first message: %v (reason %q), want INVALID_ARGUMENT MALFORMED_MESSAGE", err, reasonOf(err))
			}
		})
	}
	if got := counterValue(t, reg, "grpc_server_handled_total", map[string]string{"grpc_method": "Hold", "grpc_code": "InvalidArgument"}); got != 3 {
		t.Errorf("grpc_server_handled_total{Hold,InvalidArgument} = %v, want 3", got)
	}
}
