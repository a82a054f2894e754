package pty

import (
	"bytes"
	"encoding/binary"
	"math"
	"testing"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire"
)

// fuzzRingMax bounds the ring size a fuzz input can ask for.
const fuzzRingMax = 1 << 12

// fuzzScript reads a fuzz input as a little program of operations.
type fuzzScript struct{ b []byte }

func (s *fuzzScript) done() bool { return len(s.b) == 0 }

func (s *fuzzScript) byte() byte {
	if len(s.b) == 0 {
		return 0
	}
	c := s.b[0]
	s.b = s.b[1:]
	return c
}

func (s *fuzzScript) bytes(n int) []byte {
	n = min(n, len(s.b))
	p := s.b[:n]
	s.b = s.b[n:]
	return p
}

// int64 takes 8 bytes (fewer at the end of the input) as a signed offset.
func (s *fuzzScript) int64() int64 {
	var buf [8]byte
	copy(buf[:], s.bytes(8))
	return int64(binary.LittleEndian.Uint64(buf[:]))
}

// FuzzRingOffsets runs a fuzz-chosen sequence of appends, reads (from any
// offset: negative, before the window, inside it, past its end, extreme)
// and discards against a ring of a fuzz-chosen size, and checks it against
// a model that keeps the whole history: the window is the last size bytes
// since the last discard, every byte keeps its absolute offset, a read
// returns exactly the history from its clamped offset, and the ring never
// holds more than size bytes.
func FuzzRingOffsets(f *testing.F) {
	f.Add(uint16(8), []byte("\x00\x05hello\x01\x00\x00\x00\x00\x00\x00\x00\x00\xff"))
	f.Add(uint16(4), []byte("\x00\x0a0123456789\x01\x03\x00\x00\x00\x00\x00\x00\x00\x02\x02\x00\x01x\x01\x00\x00\x00\x00\x00\x00\x00\x00\x05"))
	f.Add(uint16(1), []byte("\x00\x03abc\x00\x01d\x01\xff\xff\xff\xff\xff\xff\xff\xff\x01"))
	f.Add(uint16(0), []byte("\x00\x03abc\x01\x01\x00\x00\x00\x00\x00\x00\x00\xff"))
	f.Add(uint16(16), []byte("\x00\x10aaaaaaaaaaaaaaaa\x00\x10bbbbbbbbbbbbbbbb\x01\x10\x00\x00\x00\x00\x00\x00\x00\x08"))
	f.Add(uint16(3), []byte("\x01\xff\xff\xff\xff\xff\xff\xff\x7f\xff"))
	f.Fuzz(func(t *testing.T, size uint16, script []byte) {
		size %= fuzzRingMax + 1
		r := newRing(int(size))
		var hist []byte // every byte ever appended
		var floor int64 // end offset at the last discard
		s := fuzzScript{script}
		for !s.done() {
			switch s.byte() % 4 {
			case 0: // append n bytes of the script
				p := s.bytes(int(s.byte()) * (1 + int(size)/64))
				r.Append(p)
				hist = append(hist, p...)
			case 1, 3: // read from an offset, with a limit
				from := s.int64()
				limit := int(int8(s.byte())) // -128..127: negative is no limit
				if from < 0 && from != math.MinInt64 && s.byte()%2 == 0 {
					// Mostly offsets near the window rather than far away.
					from = int64(len(hist)) + from%int64(2*int(size)+3)
				}
				end := int64(len(hist))
				wantStart := max(floor, end-int64(size))
				p, start, gotEnd := r.ReadN(from, limit)
				if start != wantStart || gotEnd != end {
					t.Fatalf("ReadN(%d, %d) window [%d, %d), want [%d, %d)", from, limit, start, gotEnd, wantStart, end)
				}
				lo := min(max(from, wantStart), end)
				hi := end
				if limit >= 0 {
					hi = min(hi, lo+int64(limit))
				}
				if !bytes.Equal(p, hist[lo:hi]) {
					t.Fatalf("ReadN(%d, %d): got %q, want history[%d:%d] = %q", from, limit, p, lo, hi, hist[lo:hi])
				}
			case 2:
				r.Discard()
				floor = int64(len(hist))
			}
			if got, want := r.EndOffset(), int64(len(hist)); got != want {
				t.Fatalf("EndOffset %d, want %d", got, want)
			}
			if got, want := r.StartOffset(), max(floor, int64(len(hist))-int64(size)); got != want {
				t.Fatalf("StartOffset %d, want %d", got, want)
			}
			if cap(r.buf) > int(size) {
				t.Fatalf("ring holds a buffer of %d bytes, over its size %d", cap(r.buf), size)
			}
		}
	})
}

// FuzzReplayCursor fuzzes the replay-cursor decision of an attach
// (docs/PROTOCOL.md, 13.3) through Backend.attachLocked over a real ring: a PTY has written
// `written` bytes into a ring of `size`, and a client attaches with an
// arbitrary cursor (offset, epoch, or none). The answer must be exactly:
//   - resume (reset false) iff the cursor has this PTY's epoch and
//     start_offset ≤ offset ≤ end_offset, and then the replay is exactly
//     the bytes [offset, end): what the client had plus the replay is
//     every byte of the window with none twice;
//   - otherwise reset true, the reason the first that applies of initial
//     (no cursor), invalid_cursor (negative offset or empty epoch),
//     epoch_mismatch, offset_rolled_out, offset_ahead, and the replay the
//     whole window [start_offset, end_offset).
//
// ReplayEnd is always end_offset.
func FuzzReplayCursor(f *testing.F) {
	const epoch = "0123456789abcdef"
	f.Add(uint16(64), uint32(100), true, int64(50), epoch)              // resume inside
	f.Add(uint16(64), uint32(100), true, int64(36), epoch)              // resume at start
	f.Add(uint16(64), uint32(100), true, int64(100), epoch)             // resume at end
	f.Add(uint16(64), uint32(100), true, int64(35), epoch)              // rolled out
	f.Add(uint16(64), uint32(100), true, int64(101), epoch)             // ahead
	f.Add(uint16(64), uint32(100), true, int64(-1), epoch)              // invalid
	f.Add(uint16(64), uint32(100), true, int64(50), "")                 // no epoch
	f.Add(uint16(64), uint32(100), true, int64(50), "fedcba9876543210") // other epoch
	f.Add(uint16(64), uint32(100), false, int64(50), epoch)             // no cursor
	f.Add(uint16(0), uint32(5), true, int64(5), epoch)                  // empty ring
	f.Add(uint16(64), uint32(0), true, int64(0), epoch)                 // nothing written
	f.Add(uint16(64), uint32(10), true, int64(math.MaxInt64), epoch)
	f.Add(uint16(64), uint32(10), true, int64(math.MinInt64), epoch)
	f.Fuzz(func(t *testing.T, size uint16, written uint32, hasCursor bool, offset int64, cursorEpoch string) {
		size %= fuzzRingMax + 1
		written %= 4 * fuzzRingMax
		hist := make([]byte, written)
		for i := range hist {
			hist[i] = byte(i*31 + i>>8)
		}
		rec := &ptyRec{
			token:   "fuzz_0123456789abcdef",
			epoch:   epoch,
			log:     zerolog.Nop(),
			ring:    newRing(int(size)),
			viewers: make(map[contract.TransportID]struct{}),
		}
		// Appended in uneven chunks, as a drain would.
		for p := hist; len(p) > 0; {
			n := min(len(p), 1+len(p)%97)
			rec.ring.Append(p[:n])
			p = p[n:]
		}
		b := New(zerolog.Nop())
		req := contract.AttachRequest{
			Token:     rec.token,
			Viewer:    contract.TransportID{Instance: "fuzz", Conn: 1},
			HasCursor: hasCursor,
			Offset:    offset,
			Epoch:     cursorEpoch,
		}
		resp := b.attachLocked(rec, req, false)

		end := int64(written)
		start := max(0, end-int64(size))
		if resp.StartOffset != start || resp.ReplayEnd != end || resp.Epoch != epoch {
			t.Fatalf("window [%d, %d) epoch %q, want [%d, %d) %q", resp.StartOffset, resp.ReplayEnd, resp.Epoch, start, end, epoch)
		}
		var want string
		switch {
		case !hasCursor:
			want = wire.ReasonInitial
		case offset < 0 || cursorEpoch == "":
			want = wire.ReasonInvalidCursor
		case cursorEpoch != epoch:
			want = wire.ReasonEpochMismatch
		case offset < start:
			want = wire.ReasonOffsetRolledOut
		case offset > end:
			want = wire.ReasonOffsetAhead
		default:
			want = wire.ReasonResume
		}
		if resp.Reason != want || resp.Reset != (want != wire.ReasonResume) {
			t.Fatalf("cursor (%v, %d, %q) on [%d, %d): reason %q reset %v, want %q reset %v",
				hasCursor, offset, cursorEpoch, start, end, resp.Reason, resp.Reset, want, want != wire.ReasonResume)
		}
		// A reset gets no raw bytes here: Attach adds the snapshot.
		from := end
		if !resp.Reset {
			from = offset
		}
		if !bytes.Equal(resp.Replay, hist[from:end]) {
			t.Fatalf("replay of %d bytes, want history[%d:%d] (%d bytes)", len(resp.Replay), from, end, end-from)
		}
		if !resp.Reset {
			// Exactly once: what the client had up to its offset plus the
			// replay is the history up to the end.
			if got := append(bytes.Clone(hist[:offset]), resp.Replay...); !bytes.Equal(got, hist) {
				t.Fatalf("cursor %d: had + replay is not the history", offset)
			}
		}
		if rec.writer != req.Viewer {
			t.Fatalf("writer %v after a writer attach, want %v", rec.writer, req.Viewer)
		}
	})
}
