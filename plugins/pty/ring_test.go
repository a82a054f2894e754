package pty

import (
	"bytes"
	"testing"

	"pgregory.net/rapid"
)

// TestRingModel checks the ring against a model that keeps the whole
// history: the window is the last size bytes since the last Discard, and
// a read returns exactly the history from the (clamped) offset.
func TestRingModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		size := rapid.IntRange(0, 64).Draw(t, "size")
		r := newRing(size)
		var hist []byte // every byte ever appended
		var floor int64 // end offset at the last Discard

		t.Repeat(map[string]func(*rapid.T){
			"append": func(t *rapid.T) {
				p := rapid.SliceOfN(rapid.Byte(), 0, 3*size+3).Draw(t, "p")
				r.Append(p)
				hist = append(hist, p...)
			},
			"discard": func(t *rapid.T) {
				r.Discard()
				floor = int64(len(hist))
			},
			"read": func(t *rapid.T) {
				end := int64(len(hist))
				from := rapid.Int64Range(-2, end+2).Draw(t, "from")
				limit := rapid.IntRange(-1, size+2).Draw(t, "limit")
				p, start, gotEnd := r.ReadN(from, limit)
				wantStart := max(floor, end-int64(size))
				if start != wantStart || gotEnd != end {
					t.Fatalf("ReadN window: got [%d, %d), want [%d, %d)", start, gotEnd, wantStart, end)
				}
				lo := min(max(from, wantStart), end)
				hi := end
				if limit >= 0 {
					hi = min(hi, lo+int64(limit))
				}
				if want := hist[lo:hi]; !bytes.Equal(p, want) {
					t.Fatalf("ReadN(%d, %d): got %q, want %q", from, limit, p, want)
				}
				if limit < 0 {
					if q, _, _ := r.Read(from); !bytes.Equal(q, p) {
						t.Fatalf("Read(%d): got %q, want %q", from, q, p)
					}
				}
			},
			"": func(t *rapid.T) {
				end := int64(len(hist))
				if got := r.EndOffset(); got != end {
					t.Fatalf("EndOffset: got %d, want %d", got, end)
				}
				if got, want := r.StartOffset(), max(floor, end-int64(size)); got != want {
					t.Fatalf("StartOffset: got %d, want %d", got, want)
				}
				if cap(r.buf) > size {
					t.Fatalf("buffer capacity %d over size %d", cap(r.buf), size)
				}
			},
		})
	})
}
