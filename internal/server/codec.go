package server

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// codec is the proto codec with two differences, both so that bad input
// gets INVALID_ARGUMENT through the interceptors (logged and counted in the
// request metrics) where grpc-go would answer INTERNAL ("error unmarshalling
// request") before any interceptor runs:
//   - a request whose string fields hold invalid UTF-8 still reaches the
//     handler, which refuses it naming the field;
//   - a request that is not protobuf at all decodes as an empty message
//     recorded in bad, which the malformed interceptors refuse.
type codec struct {
	encoding.CodecV2
	bad *badMessages
}

func newCodec() codec { return codec{CodecV2: encoding.GetCodecV2("proto"), bad: &badMessages{}} }

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	m, ok := v.(proto.Message)
	if err == nil || !ok {
		return err
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	proto.Reset(m)
	if lerr := lenient(buf.ReadOnlyData(), m.ProtoReflect()); lerr != nil {
		proto.Reset(m)
		c.bad.put(m, err)
	}
	return nil
}

// badMessages hands the messages that did not decode from the codec to the
// interceptors, keyed by the message itself: grpc-go decodes a unary request
// and then always runs the interceptor chain with it, and a stream message
// is decoded inside the RecvMsg that the stream interceptor wraps, so every
// entry is taken right after it is put.
// n counts the entries, so that take skips the map while none is left: a
// put happens before its take, in the same goroutine.
type badMessages struct {
	m sync.Map // proto.Message -> error
	n atomic.Int64
}

func (b *badMessages) put(m proto.Message, err error) {
	b.n.Add(1)
	b.m.Store(m, err)
}

// take returns INVALID_ARGUMENT (reason MALFORMED_MESSAGE) if m did not
// decode, and forgets it.
func (b *badMessages) take(m any) error {
	if b.n.Load() == 0 {
		return nil
	}
	v, ok := b.m.LoadAndDelete(m)
	if !ok {
		return nil
	}
	b.n.Add(-1)
	name := string(m.(proto.Message).ProtoReflect().Descriptor().FullName())
	return errMalformedMessage(name, v)
}

// interceptors refuse requests that did not decode, before authentication
// (which would judge an empty message) and after metrics and logging.
func (b *badMessages) interceptors() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	unary := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := b.take(req); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return h(srv, &badMessageStream{ServerStream: ss, bad: b})
	}
	return unary, stream
}

type badMessageStream struct {
	grpc.ServerStream
	bad *badMessages
}

func (s *badMessageStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.bad.take(m)
}

var errWire = errors.New("malformed wire data")

// lenient unmarshals b into m, storing the bytes of singular string fields
// unchecked; everything else goes through the strict unmarshaller.
func lenient(b []byte, m protoreflect.Message) error {
	fields := m.Descriptor().Fields()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errWire
		}
		tag := b[:n]
		b = b[n:]
		fd := fields.ByNumber(num)
		if fd != nil && typ == protowire.BytesType && fd.Cardinality() != protoreflect.Repeated {
			switch fd.Kind() {
			case protoreflect.StringKind:
				v, n := protowire.ConsumeBytes(b)
				if n < 0 {
					return errWire
				}
				m.Set(fd, protoreflect.ValueOfString(string(v)))
				b = b[n:]
				continue
			case protoreflect.MessageKind:
				v, n := protowire.ConsumeBytes(b)
				if n < 0 {
					return errWire
				}
				if err := lenient(v, m.Mutable(fd).Message()); err != nil {
					return err
				}
				b = b[n:]
				continue
			}
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return errWire
		}
		field := append(append([]byte(nil), tag...), b[:n]...)
		if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(field, m.Interface()); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}
