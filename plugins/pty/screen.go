package pty

import (
	"sync"
	"sync/atomic"
	"time"
)

// feedChunk bounds the bytes the screen model takes from the ring at a
// time, so that it notices soon when it has fallen out of the ring.
const feedChunk = 16 << 10

// maxCatchUp bounds the bytes a snapshot feeds the model, and a rebuild
// takes from the ring (x/vt takes a few MB/s: docs/TERMINAL.md). A
// snapshot also never feeds more lines than the screen and its
// scrollback hold: a model further behind is rebuilt from the ring's
// tail instead (what scrolled out of the scrollback is not worth the
// emulation).
const maxCatchUp = 256 << 10

// feedShare is the share of a CPU the feeder takes at most while it
// catches up: after each chunk it pauses (1/feedShare - 1) times as long as
// the chunk took, so a flood of output leaves the pump and the Output
// stream the CPU they need (a snapshot catches up at full speed).
const feedShare = 0.2

// quietPeriod is how long output must pause before a model that fell out
// of the ring is rebuilt from it in the background (a snapshot rebuilds it
// at once).
const quietPeriod = 500 * time.Millisecond

// renderPause is how long the feeder waits, once the model has caught up
// with the ring, before it renders the snapshot an attach would take, so
// that the attach finds it ready (snapshot): output that keeps coming
// sooner than that is not rendered in the background at all.
const renderPause = 50 * time.Millisecond

// renderShare is the share of a CPU the feeder's background renders take
// at most: after a render it waits at least (1/renderShare - 1) times as
// long as the render took before the next one. A render is speculative
// (no attach may come) and takes 1-15 ms (BenchmarkSnapshot), so a PTY
// whose output pauses often, watched or not, costs little: 2 %.
const renderShare = 0.02

// sizeAt records that the bytes from offset on were written for a terminal
// of cols×rows.
type sizeAt struct {
	offset     int64
	cols, rows int
}

// screen is the screen model of one PTY: a terminal emulator fed with the
// PTY's output, off the drain's path. The drain only appends to the ring
// and wakes the feeder; the feeder copies from the ring what the model has
// not seen yet and feeds it outside rec.mu, so the model may lag behind
// the ring. A snapshot first catches the model up to the ring's end. A
// model that fell further behind than the ring's start has lost output:
// it is rebuilt from what the ring holds (counted in rebuilds) — at once
// for a snapshot, else once the output pauses for quietPeriod, so that a
// flood of output costs no emulation it would throw away.
//
// The snapshot last rendered is kept with the emulator and the count of
// its changes (term.gen) it was rendered from, and served as is while
// neither moved: the model's offset and size only change with them. The
// feeder renders it ahead once output pauses (renderPause), so that an
// attach seldom renders on its own path.
type screen struct {
	scrollback int
	wake       chan struct{} // capacity 1: the drain has appended output
	stop       chan struct{} // closed by finish: the feeder returns
	rebuilds   atomic.Int64  // times the model was rebuilt from the ring
	lagging    atomic.Bool   // the model is stale: the drain does not wake the feeder
	total      *atomic.Int64 // the backend's count of rebuilds, of every PTY

	mu    sync.Mutex // guards the fields below; taken before rec.mu
	t     *term      // nil once the PTY is done
	off   int64      // offset of the next byte the model takes
	stale bool       // fell out of the ring; waits for a pause or a snapshot

	// The snapshot of cacheTerm when its gen was cacheGen (nil: none).
	// Shared by every attach served from it: never modified.
	cache     []byte
	cacheTerm *term
	cacheGen  uint64
	renders   int // snapshots rendered (a test hook: a cache hit renders none)
}

func newScreen(cols, rows, scrollback int, total *atomic.Int64) *screen {
	return &screen{
		scrollback: scrollback,
		total:      total,
		wake:       make(chan struct{}, 1),
		stop:       make(chan struct{}),
		t:          newTerm(cols, rows, scrollback),
	}
}

// feed is the screen model's feeder goroutine: it catches the model up
// with the ring whenever the drain wakes it, until the PTY is finished,
// taking at most feedShare of a CPU. It lets go of m.mu after every chunk,
// so a snapshot never waits for more than one. While the model is stale
// (a flood left it behind) the drain does not wake it at all: it looks
// every quietPeriod whether the output has paused, and only then rebuilds
// the model from the ring's tail.
func (b *Backend) feed(rec *ptyRec) {
	defer b.wg.Done()
	m := rec.screen
	quiet := time.NewTimer(time.Hour)
	quiet.Stop()
	defer quiet.Stop()
	pause := time.NewTimer(time.Hour)
	pause.Stop()
	defer pause.Stop()
	render := time.NewTimer(time.Hour)
	render.Stop()
	defer render.Stop()
	var rendered time.Duration // how long the last background render took
	var seen int64             // the ring's end when the quiet timer was last armed
	for {
		rebuild := false
		select {
		case <-render.C:
			t0 := time.Now()
			m.mu.Lock()
			ok := rec.prerenderLocked()
			m.mu.Unlock()
			if ok {
				rendered = time.Since(t0)
			}
			continue
		case <-m.wake:
		case <-quiet.C:
			if end := rec.end(); end != seen {
				seen = end // still streaming
				quiet.Reset(quietPeriod)
				continue
			}
			rebuild = true
		case <-m.stop:
			return
		}
		target := int64(-1)
		for {
			t0 := time.Now()
			m.mu.Lock()
			more := rec.step(rebuild, false, &target)
			stale := m.stale
			m.mu.Unlock()
			if stale != m.lagging.Load() {
				m.lagging.Store(stale)
				if stale {
					seen = rec.end()
					quiet.Reset(quietPeriod)
				} else {
					// Output the drain appended while it did not wake
					// the feeder is picked up by one more pass.
					wake(m.wake)
				}
			}
			if !more {
				if !stale {
					// Caught up: render ahead once output pauses.
					render.Reset(max(renderPause, time.Duration(float64(rendered)*(1/renderShare-1))))
				}
				break
			}
			pause.Reset(time.Duration(float64(time.Since(t0)) * (1/feedShare - 1)))
			select {
			case <-pause.C:
			case <-m.stop:
				return
			}
		}
	}
}

// end is the ring's end offset.
func (rec *ptyRec) end() int64 {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.ring.EndOffset()
}

// catchUp feeds the model what it has not seen up to the ring's end, see
// step; m.mu is held.
func (rec *ptyRec) catchUp(rebuild, bounded bool) {
	target := int64(-1)
	for rec.step(rebuild, bounded, &target) {
	}
}

// step feeds the model one chunk of what it has not seen, up to *target
// (set to the ring's end on the first step, so that it does not chase
// output that keeps coming), and reports whether there is more to do. A
// model that fell out of the ring, is stale, or (bounded, for a snapshot)
// lags by more than the ring's tail (see maxCatchUp), is rebuilt from
// that tail when rebuild is set, else marked stale: the bytes before the
// tail are lost to it, modes and the alternate screen included. m.mu is
// held.
func (rec *ptyRec) step(rebuild, bounded bool, target *int64) bool {
	m := rec.screen
	if m.t == nil || m.stale && !rebuild {
		return false
	}
	rec.mu.Lock()
	start, end := rec.ring.StartOffset(), rec.ring.EndOffset()
	if *target < 0 {
		*target = end
	}
	tail := int64(-1)
	if bounded && *target-m.off > 0 {
		tail = rec.ring.LineStart(m.scrollback+rec.sizeLocked(end).rows, maxCatchUp)
	}
	if !bounded && !rebuild && end-m.off > maxCatchUp {
		// The feeder lags further than a snapshot would catch up: what it
		// would feed now is thrown away by the rebuild from the ring's
		// tail that a snapshot or the next pause makes, so a flood costs
		// no emulation at all.
		tail = end
	}
	if m.off < start || m.stale || m.off < tail {
		if !rebuild {
			rec.mu.Unlock()
			m.stale = true
			return false
		}
		from := rec.ring.LineStart(m.scrollback+rec.sizeLocked(end).rows, maxCatchUp)
		size := rec.sizeLocked(from)
		rec.mu.Unlock()
		rec.log.Debug().Int64("model", m.off).Int64("from", from).Int64("to", end).Msg("pty screen model rebuilt from the ring")
		m.t = newTerm(size.cols, size.rows, m.scrollback)
		m.off, m.stale = from, false
		m.cache, m.cacheTerm = nil, nil // let the old emulator go
		m.rebuilds.Add(1)
		m.total.Add(1)
		return true
	}
	if m.off >= *target {
		rec.mu.Unlock()
		return false
	}
	size := rec.sizeLocked(m.off)
	n := min(*target-m.off, feedChunk)
	if next, ok := rec.nextSizeLocked(m.off); ok && next < m.off+n {
		n = next - m.off
	}
	data, _, _ := rec.ring.ReadN(m.off, int(n))
	rec.mu.Unlock()

	m.t.resize(size.cols, size.rows)
	m.t.write(data)
	m.off += int64(len(data))
	return m.off < *target
}

// snapshot catches the model up with the ring's end, rebuilding it if it
// fell out of the ring, and returns its snapshot, the offset it stands at
// and its size.
func (rec *ptyRec) snapshot() (data []byte, off int64, cols, rows int) {
	m := rec.screen
	m.mu.Lock()
	defer m.mu.Unlock()
	rec.catchUp(true, true)
	if m.t == nil {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		size := rec.sizeLocked(rec.ring.EndOffset())
		return nil, rec.ring.EndOffset(), size.cols, size.rows
	}
	return m.renderLocked(rec), m.off, m.t.emu.Width(), m.t.emu.Height()
}

// renderLocked returns the snapshot of the model as it stands (m.t is not
// nil), rendered now or served from the cache if the model did not change
// since it was rendered. A size change recorded at the model's offset
// applies before the next byte, and to the snapshot too. m.mu is held.
func (m *screen) renderLocked(rec *ptyRec) []byte {
	rec.mu.Lock()
	size := rec.sizeLocked(m.off)
	rec.mu.Unlock()
	m.t.resize(size.cols, size.rows)
	if m.cache == nil || m.cacheTerm != m.t || m.cacheGen != m.t.gen {
		m.cache, m.cacheTerm, m.cacheGen = m.t.snapshot(nil), m.t, m.t.gen
		m.renders++
	}
	return m.cache
}

// prerenderLocked renders the snapshot ahead of an attach if the model
// has caught up with the ring's end (a model behind it, or stale, would be
// caught up by the attach first anyway), and reports whether it did.
// m.mu is held.
func (rec *ptyRec) prerenderLocked() bool {
	m := rec.screen
	if m.t == nil || m.stale || m.off != rec.end() {
		return false
	}
	n := m.renders
	m.renderLocked(rec)
	return m.renders != n
}

// close stops the feeder and drops the model: the PTY is done.
func (m *screen) close() {
	close(m.stop)
	m.mu.Lock()
	m.t = nil
	m.cache, m.cacheTerm = nil, nil
	m.mu.Unlock()
}

// sizeLocked is the terminal size the bytes at off were written for;
// rec.mu is held.
func (rec *ptyRec) sizeLocked(off int64) sizeAt {
	s := rec.sizes[0]
	for _, e := range rec.sizes[1:] {
		if e.offset > off {
			break
		}
		s = e
	}
	return s
}

// nextSizeLocked is the offset of the first size change after off;
// rec.mu is held.
func (rec *ptyRec) nextSizeLocked(off int64) (int64, bool) {
	for _, e := range rec.sizes {
		if e.offset > off {
			return e.offset, true
		}
	}
	return 0, false
}

// resizedLocked records a size change at the ring's end and forgets the
// changes the ring no longer needs; rec.mu is held. A change at the
// offset of the one before replaces it (no byte was written for that
// size), so resizes with no output between them cost nothing.
func (rec *ptyRec) resizedLocked(cols, rows int) {
	rec.cols, rec.rows = cols, rows
	end, start := rec.ring.EndOffset(), rec.ring.StartOffset()
	keep := 0 // the last change at or before start stays: it sizes a rebuild
	for i, e := range rec.sizes {
		if e.offset <= start {
			keep = i
		}
	}
	rec.sizes = rec.sizes[keep:]
	if last := len(rec.sizes) - 1; rec.sizes[last].offset == end {
		rec.sizes[last] = sizeAt{end, cols, rows}
		return
	}
	rec.sizes = append(rec.sizes, sizeAt{end, cols, rows})
}
