package pty

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"pgregory.net/rapid"

	"github.com/tether-agent/tether/contract"
)

// newModelRec returns a PTY record with no child, no drain and no feeder:
// a ring of ringSize bytes and a screen model the test drives itself.
func newModelRec(ringSize, cols, rows, scrollback int) *ptyRec {
	return &ptyRec{
		ring:   newRing(ringSize),
		sizes:  []sizeAt{{0, cols, rows}},
		cols:   cols,
		rows:   rows,
		screen: newScreen(cols, rows, scrollback, new(atomic.Int64)),
		log:    zerolog.Nop(),
	}
}

// output is what TestSnapshotCacheProperty writes: text that wraps and
// scrolls, colours, erases, the alternate screen on and off, modes, the
// title, cursor moves and a scroll region.
var output = []string{
	"hello ", "a longer line of text that wraps at a narrow width\r\n", "\r\n", "\n",
	"\x1b[31m", "\x1b[42;1m", "\x1b[m", "\x1b[2J", "\x1b[3J", "\x1b[K",
	"\x1b[?1049h", "\x1b[?1049l", "\x1b[?2004h", "\x1b[?1h", "\x1b[?25l", "\x1b[?25h",
	"\x1b]2;title\a", "\x1b[5;3H", "\x1b[2;5r", "\x1b[r", "\x1b[4h", "\x1b[4l", "界x",
}

// TestSnapshotCacheProperty: at every attach the snapshot, served from the
// cache or not, equals a fresh render of the model at the offset the
// attach is given, whatever output, resizes, alternate screen switches,
// partial feeding, background renders and rebuilds (a small ring) came
// before.
func TestSnapshotCacheProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rec := newModelRec(rapid.SampledFrom([]int{1 << 10, 64 << 10}).Draw(t, "ring"), 40, 10, 50)
		m := rec.screen
		for i := range rapid.IntRange(1, 60).Draw(t, "steps") {
			switch rapid.IntRange(0, 5).Draw(t, "op") {
			case 0, 1: // output
				var p []byte
				for range rapid.IntRange(1, 8).Draw(t, "pieces") {
					p = append(p, rapid.SampledFrom(output).Draw(t, "piece")...)
				}
				rec.append(p)
			case 2: // a resize
				rec.mu.Lock()
				rec.resizedLocked(rapid.IntRange(1, 90).Draw(t, "cols"), rapid.IntRange(1, 30).Draw(t, "rows"))
				rec.mu.Unlock()
			case 3: // the feeder takes one chunk
				target := int64(-1)
				m.mu.Lock()
				rec.step(false, false, &target)
				m.mu.Unlock()
			case 4: // the feeder renders ahead
				m.mu.Lock()
				rec.prerenderLocked()
				m.mu.Unlock()
			case 5: // an attach
				snap, off, cols, rows := rec.snapshot()
				m.mu.Lock()
				fresh := m.t.snapshot(nil)
				w, h := m.t.emu.Width(), m.t.emu.Height()
				moff := m.off
				m.mu.Unlock()
				if off != moff || cols != w || rows != h {
					t.Fatalf("step %d: snapshot at %d, %dx%d; the model stands at %d, %dx%d", i, off, cols, rows, moff, w, h)
				}
				if end := rec.end(); off != end {
					t.Fatalf("step %d: snapshot at %d, want the ring's end %d", i, off, end)
				}
				if !bytes.Equal(snap, fresh) {
					t.Fatalf("step %d: snapshot at %d\n got %q\nwant %q (a fresh render)", i, off, snap, fresh)
				}
			}
		}
	})
}

// TestSnapshotCacheServed: a snapshot of a model that did not change
// since the last one is served from the cache without a render; output,
// a resize and a rebuild each make the next attach render once.
func TestSnapshotCacheServed(t *testing.T) {
	rec := newModelRec(4<<10, 80, 24, 100)
	m := rec.screen
	renders := func() int {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.renders
	}
	want := func(what string, n int) {
		t.Helper()
		if got := renders(); got != n {
			t.Errorf("%s: %d renders, want %d", what, got, n)
		}
	}
	rec.append([]byte("$ ls\r\nfile\r\n$ "))
	first, _, _, _ := rec.snapshot()
	want("first attach", 1)
	again, _, _, _ := rec.snapshot()
	want("second attach, nothing moved", 1)
	if !bytes.Equal(first, again) {
		t.Errorf("cached snapshot %q, want %q", again, first)
	}
	m.mu.Lock()
	if rec.prerenderLocked() {
		t.Error("prerenderLocked rendered a snapshot the cache holds")
	}
	m.mu.Unlock()
	want("background render, nothing moved", 1)

	rec.mu.Lock()
	rec.resizedLocked(80, 24) // the same size: no change recorded
	rec.mu.Unlock()
	rec.snapshot()
	want("attach after a resize to the same size", 1)

	rec.append([]byte("x"))
	m.mu.Lock()
	target := int64(-1)
	rec.step(false, false, &target) // the feeder catches up
	if !rec.prerenderLocked() {
		t.Error("prerenderLocked did not render after output")
	}
	m.mu.Unlock()
	want("background render after output", 2)
	if snap, _, _, _ := rec.snapshot(); !bytes.Contains(snap, []byte("$ x")) {
		t.Errorf("snapshot %q after output: want it to show %q", snap, "$ x")
	}
	want("attach after the background render", 2)

	rec.mu.Lock()
	rec.resizedLocked(100, 30)
	rec.mu.Unlock()
	rec.snapshot()
	want("attach after a resize", 3)

	rec.append(bytes.Repeat([]byte("y"), 8<<10)) // out of the ring: a rebuild
	rec.snapshot()
	want("attach after a rebuild", 4)
	rec.snapshot()
	want("attach after that", 4)
}

// TestSnapshotRenderedAhead: once output pauses the feeder renders the
// snapshot, and an attach is served it without rendering.
func TestSnapshotRenderedAhead(t *testing.T) {
	b, out := newBackend(t, contract.BackendConfig{})
	r := attach(t, b, contract.AttachRequest{Token: token("ahead"), Viewer: viewer(1), Cols: 80, Rows: 24,
		Argv: sh("echo READY; exec sleep 30")})
	out.waitOutput(t, r.Epoch, "READY\r\n")
	b.mu.Lock()
	rec := b.ptys[token("ahead")]
	b.mu.Unlock()
	m := rec.screen
	renders := func() int {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.renders
	}
	deadline := time.Now().Add(10 * time.Second)
	for renders() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no snapshot rendered ahead in 10 s")
		}
		time.Sleep(time.Millisecond) // polling a condition, with a deadline
	}
	for i := range 2 {
		snap := attach(t, b, contract.AttachRequest{Token: token("ahead"), Viewer: viewer(uint64(2 + i)), View: true})
		if !snap.Snapshot || !bytes.Contains(snap.Replay, []byte("READY")) {
			t.Errorf("attach %d: snapshot %q, want it to show READY", i, snap.Replay)
		}
	}
	if n := renders(); n != 1 {
		t.Errorf("%d renders after two attaches, want the 1 rendered ahead", n)
	}
	if err := b.Close(context.Background(), token("ahead")); err != nil {
		t.Fatal(err)
	}
	out.waitExit(t, r.Epoch)
}

// TestSnapshotRenderedAheadAfterResize: a resize the child draws nothing
// after (sleep) still gets its snapshot rendered ahead, of the new size.
func TestSnapshotRenderedAheadAfterResize(t *testing.T) {
	b, out := newBackend(t, contract.BackendConfig{})
	r := attach(t, b, contract.AttachRequest{Token: token("resized"), Viewer: viewer(1), Cols: 80, Rows: 24,
		Argv: sh("echo READY; exec sleep 30")})
	out.waitOutput(t, r.Epoch, "READY\r\n")
	b.mu.Lock()
	m := b.ptys[token("resized")].screen
	b.mu.Unlock()
	waitRenders := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			m.mu.Lock()
			got := m.renders
			m.mu.Unlock()
			if got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d snapshots rendered ahead in 10 s, want %d", got, n)
			}
			time.Sleep(time.Millisecond) // polling a condition, with a deadline
		}
	}
	waitRenders(1)
	if err := b.Resize(context.Background(), token("resized"), viewer(1), 100, 30); err != nil {
		t.Fatal(err)
	}
	waitRenders(2)
	snap := attach(t, b, contract.AttachRequest{Token: token("resized"), Viewer: viewer(2), View: true})
	if snap.Cols != 100 || snap.Rows != 30 || !bytes.Contains(snap.Replay, []byte("READY")) {
		t.Errorf("snapshot %dx%d %q, want 100x30 showing READY", snap.Cols, snap.Rows, snap.Replay)
	}
	m.mu.Lock()
	n := m.renders
	m.mu.Unlock()
	if n != 2 {
		t.Errorf("%d renders after the attach, want the 2 rendered ahead", n)
	}
	if err := b.Close(context.Background(), token("resized")); err != nil {
		t.Fatal(err)
	}
	out.waitExit(t, r.Epoch)
}
