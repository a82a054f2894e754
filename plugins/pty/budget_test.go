package pty

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/tether-agent/tether/contract"
)

// TestModelSize: the table of PTY sizes and the model's, read as the
// rule: a PTY of at most modelCells cells is modelled whole; a larger one
// keeps its width and as many bottom rows as fit.
func TestModelSize(t *testing.T) {
	for _, tt := range []struct {
		name               string
		cols, rows         int
		wantCols, wantRows int
	}{
		{"80x24 whole", 80, 24, 80, 24},
		{"1x1 whole", 1, 1, 1, 1},
		{"512x256 is the budget exactly", 512, 256, 512, 256},
		{"512x257 loses a row", 512, 257, 512, 256},
		{"1000x1000, the default largest, keeps 131 rows", 1000, 1000, 1000, 131},
		{"300x100 whole", 300, 100, 300, 100},
		{"10000x10000 keeps 13 rows", 10000, 10000, 10000, 13},
		{"10000x1 whole", 10000, 1, 10000, 1},
		{"1x10000 whole", 1, 10000, 1, 10000},
		{"20x10000 keeps 6553 rows", 20, 10000, 20, 6553},
		{"65535x65535, a PTY's largest, keeps 2 rows", 65535, 65535, 65535, 2},
		{"0x0 is one cell", 0, 0, 1, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, r := modelSize(tt.cols, tt.rows)
			if c != tt.wantCols || r != tt.wantRows {
				t.Errorf("modelSize(%d, %d) = %dx%d, want %dx%d", tt.cols, tt.rows, c, r, tt.wantCols, tt.wantRows)
			}
			if c*r > modelCells && r > 1 {
				t.Errorf("modelSize(%d, %d) = %dx%d: %d cells, over the budget of %d", tt.cols, tt.rows, c, r, c*r, modelCells)
			}
		})
	}
}

// TestScrollbackLines: the configured lines while they fit the budget
// (scrollbackCells, or lines×80 when more), fewer on a wider model, at
// least one, none when none are configured.
func TestScrollbackLines(t *testing.T) {
	for _, tt := range []struct {
		name        string
		lines, cols int
		want        int
	}{
		{"default at 80 columns: all", 1000, 80, 1000},
		{"default at 131 columns: all", 1000, 131, 1000},
		{"default at 200 columns: 655", 1000, 200, 655},
		{"default at 1000 columns: 131", 1000, 1000, 131},
		{"default at 10000 columns: 13", 1000, 10000, 13},
		{"none configured: none", 0, 80, 0},
		{"a large setting keeps its lines at 80 columns", 100000, 80, 100000},
		{"a large setting at 10000 columns: what 80 would cost", 100000, 10000, 800},
		{"the largest setting at 65535 columns", 1 << 20, 65535, 1280},
		{"one line at any width", 1, 65535, 1},
		{"a model one column wide", 1000, 1, 1000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := scrollbackLines(tt.lines, tt.cols); got != tt.want {
				t.Errorf("scrollbackLines(%d, %d) = %d, want %d", tt.lines, tt.cols, got, tt.want)
			}
		})
	}
}

// liveHeap is the heap in use after the garbage is collected.
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// fillModel fills every cell of both of tm's screens with a character of
// two bytes (a string of its own in every cell), then scrolls enough
// lines of it off the primary screen to fill the scrollback.
func fillModel(tm *term) {
	w, h := tm.emu.Width(), tm.emu.Height()
	line := strings.Repeat("é", w)
	var b strings.Builder
	b.WriteString("\x1b[?1049h\x1b[H")
	for y := range h {
		fmt.Fprintf(&b, "\x1b[%d;1H%s", y+1, line)
	}
	b.WriteString("\x1b[?1049l\x1b[H")
	for range h + scrollbackLines(tm.lines, w) {
		b.WriteString(line + "\r\n")
	}
	tm.write([]byte(b.String()))
}

// TestModelMemory: what the model allocates is bounded whatever sizes it
// is given, with every cell of both screens and of the scrollback
// holding text: resizes to the largest sizes, and a model filled at
// 10000 columns then narrowed step by step (each width's scrollback kept
// would add up without the refit). Both what a resize allocates and what
// the full model then holds stay within the 64 MiB no resize may grow
// the plugin by; each step's figures are logged.
func TestModelMemory(t *testing.T) {
	const bound = 64 << 20
	base := liveHeap()
	tm := newTerm(DefaultCols, DefaultRows, DefaultScrollback)
	// The default largest; a tall one; the largest (after the tall
	// one, a resize that would widen all 256 rows before cutting them);
	// then narrower and narrower.
	steps := [][2]int{{1000, 1000}, {512, 256}, {10000, 10000}, {2500, 24}, {625, 24}, {156, 24}, {80, 24}}
	var most int64
	for _, s := range steps {
		// What the resize allocates, garbage included: x/vt's arrays
		// for sizes the model passes through on the way count too.
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		tm.resize(s[0], s[1])
		runtime.ReadMemStats(&after)
		allocated := int64(after.TotalAlloc - before.TotalAlloc)
		fillModel(tm)
		grown := liveHeap() - base
		most = max(most, grown)
		t.Logf("%5dx%-5d model %5dx%-4d scrollback %4d lines: %5.1f MiB in use, the resize allocated %5.1f MiB",
			s[0], s[1], tm.emu.Width(), tm.emu.Height(), tm.emu.ScrollbackLen(), float64(grown)/(1<<20), float64(allocated)/(1<<20))
		if grown > bound || allocated > bound {
			t.Errorf("a resize to %dx%d allocated %.1f MiB, and the full model then takes %.1f MiB; want at most %d MiB each",
				s[0], s[1], float64(allocated)/(1<<20), float64(grown)/(1<<20), bound>>20)
		}
	}
	runtime.KeepAlive(tm)
	t.Logf("most: %.1f MiB", float64(most)/(1<<20))
}

// TestClampedSnapshot: a model clamped to its budget still answers with a
// well-formed snapshot of its own size: its last rows and the scrollback
// its width keeps, which a fresh terminal of that size reproduces
// exactly; the lines before are what the clamp lost.
func TestClampedSnapshot(t *testing.T) {
	tm := newTerm(DefaultCols, DefaultRows, DefaultScrollback)
	tm.resize(10000, 10000)
	cols, rows := tm.emu.Width(), tm.emu.Height()
	if cols != 10000 || rows != 13 {
		t.Fatalf("model of 10000x10000: %dx%d, want 10000x13", cols, rows)
	}
	for i := range 100 {
		tm.write(fmt.Appendf(nil, "line%d %s\r\n", i, strings.Repeat("w", 9000)))
	}
	tm.write([]byte("\x1b]2;big\a$ ls"))
	snap := tm.snapshot(nil)
	// 13 lines of scrollback (line75-line87), then 12 rows of text and
	// the prompt's.
	for _, want := range []string{"line75 ", "line87 ", "line88 ", "line99 ", "$ ls", "\x1b]2;big\a"} {
		if !bytes.Contains(snap, []byte(want)) {
			t.Errorf("snapshot: want it to hold %q", want)
		}
	}
	if bytes.Contains(snap, []byte("line74 ")) {
		t.Errorf("snapshot holds line74: want only the 13 lines of scrollback 10000 columns keep")
	}
	noQueries(t, "snapshot", snap)
	fresh := newTerm(cols, rows, DefaultScrollback)
	fresh.write(snap)
	if again := fresh.snapshot(nil); !bytes.Equal(again, snap) {
		t.Errorf("a fresh %dx%d terminal fed the snapshot (%d bytes) snapshots %d other bytes", cols, rows, len(snap), len(again))
	}
	if p := fresh.emu.CursorPosition(); p.X != 4 || p.Y != rows-1 {
		t.Errorf("cursor of the reproduced terminal: %d,%d, want 4,%d", p.X, p.Y, rows-1)
	}
}

// TestRefitScrollback: narrowing a model cuts the lines its scrollback
// keeps to the new width (a wide character is not halved), and widening
// it keeps the newest lines that fit.
func TestRefitScrollback(t *testing.T) {
	tm := newTerm(1000, 24, DefaultScrollback)
	for i := range 200 {
		tm.write(fmt.Appendf(nil, "%03d%s日\r\n", i, strings.Repeat("x", 75)))
	}
	if n := tm.emu.ScrollbackLen(); n != 131 {
		t.Fatalf("scrollback at 1000 columns: %d lines, want 131", n)
	}
	tm.resize(79, 24)
	sb := tm.emu.Scrollback()
	if sb.Len() != 131 {
		t.Fatalf("scrollback narrowed to 79 columns: %d lines, want the 131 kept", sb.Len())
	}
	for i, l := range sb.Lines() {
		if len(l) > 78 {
			t.Errorf("scrollback line %d: %d cells, want at most 78 (79 without the halved 日)", i, len(l))
		}
	}
	tm.resize(10000, 24)
	if n := tm.emu.ScrollbackLen(); n != 13 {
		t.Errorf("scrollback widened to 10000 columns: %d lines, want 13", n)
	}
	if snap := tm.snapshot(nil); !bytes.Contains(snap, []byte("199"+strings.Repeat("x", 75))) {
		t.Errorf("snapshot after the refits: want the newest line")
	}
}

// TestResizeOverTheLargest: the backend refuses a resize or a new PTY
// over its largest size (MaxCols×MaxRows; 1000x1000 by default) with
// ErrInvalidArgument, and the PTY keeps its size; one within it is
// applied to the real PTY even where the model is clamped, and a
// snapshot then has the model's size.
func TestResizeOverTheLargest(t *testing.T) {
	ctx := context.Background()
	t.Run("default", func(t *testing.T) {
		b, _ := newBackend(t, contract.BackendConfig{Argv: sh("exec sleep 30")})
		if b.cfg.MaxCols != DefaultMaxCols || b.cfg.MaxRows != DefaultMaxRows {
			t.Fatalf("largest size by default: %dx%d, want %dx%d", b.cfg.MaxCols, b.cfg.MaxRows, DefaultMaxCols, DefaultMaxRows)
		}
		tok, w := token("default"), viewer(1)
		attach(t, b, contract.AttachRequest{Token: tok, Viewer: w})
		for _, size := range [][2]int{{1001, 50}, {50, 1001}, {10000, 10000}} {
			wantErr(t, fmt.Sprintf("Resize to %dx%d", size[0], size[1]), b.Resize(ctx, tok, w, size[0], size[1]), contract.ErrInvalidArgument)
		}
		if info, _ := listed(t, b, tok); info.Cols != DefaultCols || info.Rows != DefaultRows {
			t.Errorf("size after refused resizes: %dx%d, want %dx%d", info.Cols, info.Rows, DefaultCols, DefaultRows)
		}
		if err := b.Resize(ctx, tok, w, 1000, 1000); err != nil {
			t.Errorf("Resize to the largest: got %v, want nil", err)
		}
		_, err := b.Attach(ctx, contract.AttachRequest{Token: token("wide"), Viewer: viewer(2), Cols: 1001, Rows: 10})
		wantErr(t, "Attach of a new PTY 1001 wide", err, contract.ErrInvalidArgument)
		if _, ok := listed(t, b, token("wide")); ok {
			t.Error("a PTY over the largest size was spawned")
		}
	})
	t.Run("10000x10000 allowed", func(t *testing.T) {
		b, out := newBackend(t, contract.BackendConfig{MaxCols: 10000, MaxRows: 10000})
		tok, w := token("huge"), viewer(1)
		r := attach(t, b, contract.AttachRequest{Token: tok, Viewer: w, Argv: sh("read x; stty size; echo DONE; exec sleep 30")})
		if err := b.Resize(ctx, tok, w, 10000, 10000); err != nil {
			t.Fatalf("Resize to 10000x10000: got %v, want nil", err)
		}
		if err := b.Write(ctx, tok, w, []byte("\n")); err != nil {
			t.Fatal(err)
		}
		out.waitOutput(t, r.Epoch, "10000 10000\r\nDONE\r\n")
		snap := attach(t, b, contract.AttachRequest{Token: tok, Viewer: viewer(2), View: true})
		if !snap.Snapshot || snap.Cols != 10000 || snap.Rows != 13 || !bytes.Contains(snap.Replay, []byte("10000 10000")) {
			t.Errorf("snapshot of the 10000x10000 PTY: %dx%d, %q; want the model's 10000x13 with the output", snap.Cols, snap.Rows, snap.Replay)
		}
		if info, _ := listed(t, b, tok); info.Cols != 10000 || info.Rows != 10000 {
			t.Errorf("listed size: %dx%d, want the real PTY's 10000x10000", info.Cols, info.Rows)
		}
	})
	for _, cfg := range []contract.BackendConfig{{MaxCols: 10001}, {MaxRows: 10001}, {MaxCols: -1}, {MaxRows: -5}} {
		_, err := New(testLogger(t)).Start(ctx, cfg)
		wantErr(t, fmt.Sprintf("Start with largest size %dx%d", cfg.MaxCols, cfg.MaxRows), err, contract.ErrInvalidArgument)
	}
}

// TestResizesWithoutOutput: resizes with no output between them replace
// each other in the size history instead of growing it.
func TestResizesWithoutOutput(t *testing.T) {
	ctx := context.Background()
	b, out := newBackend(t, contract.BackendConfig{})
	tok, w := token("many"), viewer(1)
	r := attach(t, b, contract.AttachRequest{Token: tok, Viewer: w, Argv: sh("echo READY; exec sleep 30")})
	out.waitOutput(t, r.Epoch, "READY\r\n")
	for i := range 1000 {
		if err := b.Resize(ctx, tok, w, 100+i%2, 30); err != nil {
			t.Fatal(err)
		}
	}
	rec, _ := b.lookup("test", tok)
	rec.mu.Lock()
	n, last := len(rec.sizes), rec.sizes[len(rec.sizes)-1]
	rec.mu.Unlock()
	if n > 2 || last.cols != 101 || last.rows != 30 {
		t.Errorf("size history after 1000 resizes with no output: %d entries, last %dx%d; want at most 2, last 101x30", n, last.cols, last.rows)
	}
}
