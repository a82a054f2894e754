package pty

import "bytes"

// ring is a byte ring buffer that numbers bytes by absolute offset: the
// n-th byte ever appended (counting from 0) has offset n. It keeps the last
// size bytes, the window [StartOffset, EndOffset). Its memory grows with
// the bytes held, up to size. It is not safe for concurrent use.
type ring struct {
	size int
	buf  []byte // len(buf) bytes held; grows up to size, then circular
	head int    // index in buf of the byte at StartOffset
	end  int64  // offset one past the last byte appended
}

// ringInitialCap is the first allocation of a ring's buffer.
const ringInitialCap = 4 << 10

// newRing returns an empty ring that keeps up to size bytes (none when
// size <= 0).
func newRing(size int) *ring {
	return &ring{size: max(size, 0)}
}

// StartOffset is the offset of the oldest byte held.
func (r *ring) StartOffset() int64 { return r.end - int64(len(r.buf)) }

// EndOffset is the offset the next appended byte will get.
func (r *ring) EndOffset() int64 { return r.end }

// Append adds p after the last byte, dropping the oldest bytes beyond size.
func (r *ring) Append(p []byte) {
	r.end += int64(len(p))
	if len(p) == 0 || r.size == 0 {
		return
	}
	if len(p) >= r.size {
		p = p[len(p)-r.size:]
		if cap(r.buf) < r.size {
			r.buf = make([]byte, r.size)
		}
		r.buf = r.buf[:r.size]
		copy(r.buf, p)
		r.head = 0
		return
	}
	if n := len(r.buf); n < r.size {
		// Still filling: the bytes are in order from index 0.
		k := min(len(p), r.size-n)
		if cap(r.buf) < n+k {
			nb := make([]byte, n, min(r.size, max(n+k, 2*cap(r.buf), ringInitialCap)))
			copy(nb, r.buf)
			r.buf = nb
		}
		r.buf = append(r.buf, p[:k]...)
		p = p[k:]
		if len(p) == 0 {
			return
		}
	}
	// Full: overwrite the oldest bytes, which start at head.
	n := copy(r.buf[r.head:], p)
	copy(r.buf, p[n:])
	r.head = (r.head + len(p)) % r.size
}

// Read returns a copy of the bytes [from, EndOffset) and the window. A from
// before the window is moved to its start; a from past its end reads
// nothing.
func (r *ring) Read(from int64) (p []byte, start, end int64) {
	return r.ReadN(from, -1)
}

// ReadN is Read limited to at most limit bytes (no limit when negative).
func (r *ring) ReadN(from int64, limit int) (p []byte, start, end int64) {
	start, end = r.StartOffset(), r.end
	from = min(max(from, start), end)
	n := int(end - from)
	if limit >= 0 {
		n = min(n, limit)
	}
	p = make([]byte, n)
	if n == 0 {
		return p, start, end
	}
	i := (r.head + int(from-start)) % len(r.buf)
	c := copy(p, r.buf[i:])
	copy(p[c:], r.buf)
	return p, start, end
}

// Discard drops every byte held and frees the buffer; the offsets stay.
func (r *ring) Discard() {
	r.buf = nil
	r.head = 0
}

// LineStart returns the offset just after the newline that begins the
// last lines lines held, looking back at most limit bytes from the end;
// the start of what it looked at when fewer newlines are there.
func (r *ring) LineStart(lines, limit int) int64 {
	start := max(r.StartOffset(), r.end-int64(limit))
	if start == r.end {
		return start
	}
	// [start, end) is at most two runs of buf: first [i, i+n1), then
	// [0, n-n1). Search the newer one first.
	n := int(r.end - start)
	i := (r.head + int(start-r.StartOffset())) % len(r.buf)
	n1 := min(n, len(r.buf)-i)
	runs := []struct {
		p   []byte
		off int64 // offset of p[0]
	}{{r.buf[:n-n1], start + int64(n1)}, {r.buf[i : i+n1], start}}
	for _, run := range runs {
		p := run.p
		for {
			j := bytes.LastIndexByte(p, '\n')
			if j < 0 {
				break
			}
			if lines--; lines < 0 {
				return run.off + int64(j) + 1
			}
			p = p[:j]
		}
	}
	return start
}
