package server

import (
	"errors"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// codec is the proto codec with one difference: a request whose string
// fields hold invalid UTF-8 still reaches the handler, which refuses it with
// INVALID_ARGUMENT naming the field. grpc-go would otherwise answer Internal
// ("error unmarshalling request") and name nothing.
type codec struct{ encoding.CodecV2 }

func newCodec() codec { return codec{encoding.GetCodecV2("proto")} }

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
		return err
	}
	return nil
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
