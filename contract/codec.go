package contract

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
)

// DialOptions are the gRPC options of the host's side of a plugin's
// connection (plugin.ClientConfig.GRPCDialOptions): the codec and buffer
// pool the plugin's side uses too (see bufferPool).
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		experimental.WithBufferPool(bufferPool),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(poolCodec{})),
	}
}

// serverOptions are DialOptions' counterparts on the plugin's side.
func serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{experimental.BufferPool(bufferPool), grpc.ForceServerCodecV2(poolCodec{})}
}

// bufferPool is the gRPC buffer pool of both sides of a plugin's
// connection. gRPC's default pool has no size between 32 KiB and 1 MiB,
// so each message in between (a screen snapshot, a replay piece, a batch
// of frames) took a 1 MiB buffer and cleared all of it, when it was
// encoded and again when it was decoded: a tenth of the PTY plugin's CPU
// and of the host's in a run of fresh attaches. Here every power of two
// up to 1 MiB is a size of its own.
var bufferPool = mustPool(mem.NewBinaryTieredBufferPool(8, 10, 12, 13, 14, 15, 16, 17, 18, 19, 20))

func mustPool(p mem.BufferPool, err error) mem.BufferPool {
	if err != nil {
		panic(fmt.Sprintf("contract: gRPC buffer pool: %v", err))
	}
	return p
}

// poolCodec is gRPC's protobuf codec ("proto", the same bytes on the
// wire) with bufferPool in place of gRPC's default pool, which its own
// codec always takes. It is forced on tether's plugin connections only;
// the process's registered "proto" codec is left as it is.
type poolCodec struct{}

var _ encoding.CodecV2 = poolCodec{}

// Marshal encodes v into one buffer of bufferPool (or a plain slice when
// it is too small to be worth pooling).
func (poolCodec) Marshal(v any) (mem.BufferSlice, error) {
	m := messageOf(v)
	if m == nil {
		return nil, fmt.Errorf("proto: cannot marshal %T, want a proto.Message: %w", v, ErrInvalidArgument)
	}
	size := proto.Size(m)
	opts := proto.MarshalOptions{UseCachedSize: true} // Size just ran
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("proto: marshal %T: %w", v, err)
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf := bufferPool.Get(size)
	b, err := opts.MarshalAppend((*buf)[:0], m)
	if err != nil {
		bufferPool.Put(buf)
		return nil, fmt.Errorf("proto: marshal %T: %w", v, err)
	}
	*buf = b
	return mem.BufferSlice{mem.NewBuffer(buf, bufferPool)}, nil
}

// Unmarshal decodes data into v, gathering it into one buffer of
// bufferPool first when it came in more than one.
func (poolCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m := messageOf(v)
	if m == nil {
		return fmt.Errorf("proto: cannot unmarshal into %T, want a proto.Message: %w", v, ErrInvalidArgument)
	}
	buf := data.MaterializeToBuffer(bufferPool)
	defer buf.Free()
	if err := proto.Unmarshal(buf.ReadOnlyData(), m); err != nil {
		return fmt.Errorf("proto: unmarshal %T: %w", v, err)
	}
	return nil
}

// messageOf is v as a protobuf message, whichever API generated it
// (go-plugin's own services may use the older one), or nil.
func messageOf(v any) proto.Message {
	switch v := v.(type) {
	case protoadapt.MessageV2:
		return v
	case protoadapt.MessageV1:
		return protoadapt.MessageV2Of(v)
	}
	return nil
}

// Name is "proto": the content-subtype is unchanged, so a peer with
// gRPC's own codec reads these messages as its own.
func (poolCodec) Name() string { return "proto" }
