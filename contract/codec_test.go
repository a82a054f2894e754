package contract

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/tether-agent/tether/contract/proto/tetherv1"
)

// piece is an AttachPiece carrying n bytes of replay.
func piece(n int) *tetherv1.AttachPiece {
	return &tetherv1.AttachPiece{Replay: bytes.Repeat([]byte("x"), n)}
}

// TestPoolCodec checks that the plugin connections' codec writes the
// bytes gRPC's own protobuf codec writes (a peer with that codec, in Go
// or in another language, reads them as its own), reads them back, and
// takes a buffer of about the message's size, not gRPC's 1 MiB one for
// everything between 32 KiB and 1 MiB.
func TestPoolCodec(t *testing.T) {
	for _, n := range []int{0, 100, 40 << 10, 47_000, 70 << 10, 300 << 10, 2 << 20} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			m := piece(n)
			want, err := proto.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			data, err := poolCodec{}.Marshal(m)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			defer data.Free()
			if got := data.Materialize(); !bytes.Equal(got, want) {
				t.Fatalf("Marshal: %d bytes, want proto.Marshal's %d, the same", len(got), len(want))
			}
			if len(data) != 1 {
				t.Fatalf("Marshal: %d buffers, want 1", len(data))
			}
			if c := cap(data[0].ReadOnlyData()); len(want) > 1<<15 && len(want) <= 1<<20 && c > 2*len(want) {
				t.Errorf("Marshal: a %d-byte message took a %d-byte buffer, want at most twice its size", len(want), c)
			}

			// Decoded from one buffer and from many (as it comes off
			// the wire in HTTP/2 frames).
			var split mem.BufferSlice
			for rest := want; len(rest) > 0; {
				k := min(len(rest), 16<<10)
				split = append(split, mem.SliceBuffer(rest[:k]))
				rest = rest[k:]
			}
			for _, in := range []mem.BufferSlice{{mem.SliceBuffer(want)}, split} {
				var got tetherv1.AttachPiece
				if err := (poolCodec{}).Unmarshal(in, &got); err != nil {
					t.Fatalf("Unmarshal of %d buffers: %v", len(in), err)
				}
				if !proto.Equal(&got, m) {
					t.Fatalf("Unmarshal of %d buffers: got %d replay bytes, want %d", len(in), len(got.Replay), n)
				}
			}
		})
	}
	if got := (poolCodec{}).Name(); got != encoding.GetCodecV2("proto").Name() {
		t.Errorf("Name: got %q, want gRPC's %q", got, "proto")
	}
}

// TestPoolCodecRefuses checks that what is not a protobuf message, or
// bytes that do not decode, are an error, ErrInvalidArgument for the
// former, and never a panic.
func TestPoolCodecRefuses(t *testing.T) {
	if _, err := (poolCodec{}).Marshal("not a message"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Marshal of a string: got %v, want ErrInvalidArgument", err)
	}
	var s string
	if err := (poolCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{1})}, &s); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Unmarshal into a string: got %v, want ErrInvalidArgument", err)
	}
	var p tetherv1.AttachPiece
	if err := (poolCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x12, 0x7f, 1})}, &p); err == nil {
		t.Error("Unmarshal of a truncated message: got nil, want an error")
	}
}

// BenchmarkCodec compares the plugin connections' codec with gRPC's own
// for a message of a snapshot's size (47 KB, an 80×24 screen with its
// scrollback is 58 KB): encoded, then decoded from 16 KiB frames.
func BenchmarkCodec(b *testing.B) {
	m := piece(47_000)
	for _, c := range []encoding.CodecV2{encoding.GetCodecV2("proto"), poolCodec{}} {
		name := "grpc"
		if _, ok := c.(poolCodec); ok {
			name = "pool"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				data, err := c.Marshal(m)
				if err != nil {
					b.Fatal(err)
				}
				wire := data.Materialize()
				data.Free()
				var split mem.BufferSlice
				for rest := wire; len(rest) > 0; rest = rest[min(len(rest), 16<<10):] {
					split = append(split, mem.SliceBuffer(rest[:min(len(rest), 16<<10)]))
				}
				var got tetherv1.AttachPiece
				if err := c.Unmarshal(split, &got); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
