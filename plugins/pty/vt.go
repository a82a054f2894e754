package pty

import (
	"fmt"
	"io"
	"reflect"
	"strings"
	"unsafe"

	uv "github.com/charmbracelet/ultraviolet"
	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/vt"
)

// term is one VT emulator (github.com/charmbracelet/x/vt) with the glue
// a screen model needs around it: replies to terminal queries go nowhere,
// the alternate screen keeps no scrollback, the primary screen stays
// readable while the alternate one is shown, the input modes and the title
// are recorded as they change, and a few sequences behave as in xterm.js
// (docs/TERMINAL.md lists them). It is not safe for concurrent use.
//
// Its size is the model's (modelSize): a PTY too large for the model's
// budget is modelled with its bottom rows only, and its scrollback keeps
// fewer lines the wider it is (scrollbackLines).
type term struct {
	emu   *vt.Emulator
	scrs  *[2]vt.Screen // the emulator's primary and alternate screens
	lines int           // the scrollback lines configured (0: none)
	modes map[ansi.Mode]bool
	title string
	gen   uint64 // counts the changes write and resize made: a snapshot is a function of (t, gen)
}

// screensOffset is where vt.Emulator keeps its two screens. The emulator
// shows only the active one; a snapshot of the alternate screen needs the
// primary one under it too, and the pen's background for an erase. The
// layout is checked once, against the version go.mod pins, so that a
// changed library fails loudly (every pty test) instead of reading garbage.
var screensOffset = func() uintptr {
	f, ok := reflect.TypeFor[vt.Emulator]().FieldByName("scrs")
	if !ok || f.Type != reflect.TypeFor[[2]vt.Screen]() {
		panic("pty: github.com/charmbracelet/x/vt changed: vt.Emulator has no scrs [2]vt.Screen")
	}
	return f.Offset
}()

// screenBufOffset is where vt.Screen keeps its cells: a resize to a
// smaller size keeps the larger one's arrays (x/vt reslices them), which
// compact lets go of. Checked as screensOffset is.
var screenBufOffset = func() uintptr {
	f, ok := reflect.TypeFor[vt.Screen]().FieldByName("buf")
	if !ok || f.Type != reflect.TypeFor[*uv.RenderBuffer]() {
		panic("pty: github.com/charmbracelet/x/vt changed: vt.Screen has no buf *uv.RenderBuffer")
	}
	return f.Offset
}()

// defaultModes are the modes a new emulator starts with set.
var defaultModes = map[ansi.Mode]bool{ansi.ModeAutoWrap: true, ansi.ModeTextCursorEnable: true}

// newTerm returns a blank terminal that models a cols×rows one (of the
// model's size: modelSize) and keeps up to scrollback lines that
// scrolled off the primary screen (fewer on a wide one:
// scrollbackLines).
func newTerm(cols, rows, scrollback int) *term {
	cols, rows = modelSize(cols, rows)
	e := vt.NewEmulator(cols, rows)
	t := &term{emu: e, lines: max(scrollback, 0), modes: make(map[ansi.Mode]bool, len(defaultModes))}
	for m, v := range defaultModes {
		t.modes[m] = v
	}
	t.scrs = (*[2]vt.Screen)(unsafe.Add(unsafe.Pointer(e), screensOffset))
	// The emulator writes its answers to queries (DA, DSR, OSC 11 ?, ...)
	// into a pipe that blocks until read; closed, the writes fail at once
	// and Write never waits (charmbracelet/x#939).
	if c, ok := e.InputPipe().(io.Closer); ok {
		_ = c.Close()
	}
	if scrollback > 0 {
		e.SetScrollbackSize(scrollbackLines(scrollback, cols))
	} else {
		t.scrs[0].SetScrollback(nil) // none (a size of 0 means x/vt's default)
	}
	t.scrs[1].SetScrollback(nil) // the alternate screen has none (charmbracelet/x#947)
	e.SetCallbacks(vt.Callbacks{
		Title:       func(s string) { t.title = s },
		EnableMode:  func(m ansi.Mode) { t.modes[m] = true },
		DisableMode: func(m ansi.Mode) { t.modes[m] = false },
	})
	// As in xterm.js: ED 2 erases the screen with the pen's background
	// and keeps it out of the scrollback; ED 3 erases only the scrollback.
	e.RegisterCsiHandler('J', func(params ansi.Params) bool {
		switch n, _, _ := params.Param(0, 0); n {
		case 2:
			s := t.active()
			blank := uv.EmptyCell
			blank.Style.Bg = s.Cursor().Pen.Bg
			s.FillArea(&blank, s.Bounds())
			return true
		case 3:
			e.ClearScrollback()
			return true
		}
		return false
	})
	// As in xterm.js, a DECSTBM bottom margin below the screen is the
	// screen's bottom row: x/vt keeps it, and the next line feed in the
	// region indexes past the screen's rows and panics (the feeder, and
	// the plugin with it). params is the parser's own buffer, which the
	// handler after this one reads the bottom margin from.
	e.RegisterCsiHandler('r', func(params ansi.Params) bool {
		if len(params) > 1 {
			if bottom, _, _ := params.Param(1, 0); bottom > e.Height() {
				params[1] = ansi.Param(e.Height())
			}
		}
		return false // x/vt's handler sets the margins
	})
	// SCORC (CSI u) restores what CSI s saved (x/vt saves, never restores).
	e.RegisterCsiHandler('u', func(params ansi.Params) bool {
		if len(params) > 0 {
			return false
		}
		t.active().RestoreCursor()
		return true
	})
	return t
}

// active is the screen shown.
func (t *term) active() *vt.Screen {
	if t.emu.IsAltScreen() {
		return &t.scrs[1]
	}
	return &t.scrs[0]
}

// write feeds p to the emulator.
func (t *term) write(p []byte) {
	t.gen++
	_, _ = t.emu.Write(p)
}

// resize resizes the terminal to model a cols×rows one (modelSize).
// Like xterm.js, a primary screen whose cursor would fall off the bottom
// scrolls up into the scrollback first, so the lines around the cursor
// stay on screen (x/vt cuts the bottom). The cells a larger size had are
// let go of, and a change of width refits the scrollback.
func (t *term) resize(cols, rows int) {
	cols, rows = modelSize(cols, rows)
	width := t.emu.Width()
	if cols == width && rows == t.emu.Height() {
		return
	}
	t.gen++
	if !t.emu.IsAltScreen() {
		if p := t.emu.CursorPosition(); p.Y >= rows {
			k := p.Y - rows + 1
			t.write(fmt.Appendf(nil, "\x1b[r\x1b[%d;1H%s\x1b[%d;%dH", t.emu.Height(), strings.Repeat("\n", k), p.Y-k+1, p.X+1))
		}
	}
	// What shrinks first: x/vt widens every row it has before it drops
	// rows, so 512x256 to 10000x13 in one step would allocate 256 rows
	// of 10000 cells.
	if h := t.emu.Height(); rows < h || cols < width {
		t.emu.Resize(min(cols, width), min(rows, h))
		t.compact()
	}
	t.emu.Resize(cols, rows)
	t.compact()
	if cols != width {
		t.fitScrollback()
	}
}

// compact makes each screen hold only the cells of its size: x/vt
// shrinks a screen by reslicing its lines, so the arrays of the largest
// size it ever had would stay. (A line that grew has at most append's
// rounding spare: it is left as it is.)
func (t *term) compact() {
	for i := range t.scrs {
		rb := *(**uv.RenderBuffer)(unsafe.Add(unsafe.Pointer(&t.scrs[i]), screenBufOffset))
		if rb == nil || rb.Buffer == nil {
			continue
		}
		ls := rb.Lines
		clear(ls[len(ls):cap(ls)]) // rows cut off the bottom
		for y, l := range ls {
			if cap(l)-len(l) > len(l)/8 {
				ls[y] = append(make(uv.Line, 0, len(l)), l...)
			}
		}
	}
}

// fitScrollback refits the scrollback to the screen's width: a new one
// of as many lines as that width keeps (scrollbackLines), with the newest
// lines of the old one cut to the width. So the scrollback never holds
// more than scrollbackLines(lines, width)×width cells, whatever widths
// its lines were written at.
func (t *term) fitScrollback() {
	old := t.scrs[0].Scrollback()
	if old == nil {
		return
	}
	width := t.emu.Width()
	n := scrollbackLines(t.lines, width)
	lines := old.Lines()
	sb := vt.NewScrollback(n)
	for _, l := range lines[max(0, len(lines)-n):] {
		cut := min(len(l), width)
		if cut > 0 && cut-1+l[cut-1].Width > width {
			cut-- // a wide character the width would halve
		}
		sb.Push(l[:cut]) // a copy
	}
	t.scrs[0].SetScrollback(sb)
}
