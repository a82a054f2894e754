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
type term struct {
	emu   *vt.Emulator
	scrs  *[2]vt.Screen // the emulator's primary and alternate screens
	modes map[ansi.Mode]bool
	title string
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

// defaultModes are the modes a new emulator starts with set.
var defaultModes = map[ansi.Mode]bool{ansi.ModeAutoWrap: true, ansi.ModeTextCursorEnable: true}

// newTerm returns a blank terminal of cols×rows that keeps up to
// scrollback lines that scrolled off the primary screen.
func newTerm(cols, rows, scrollback int) *term {
	e := vt.NewEmulator(cols, rows)
	t := &term{emu: e, modes: make(map[ansi.Mode]bool, len(defaultModes))}
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
		e.SetScrollbackSize(scrollback)
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
func (t *term) write(p []byte) { _, _ = t.emu.Write(p) }

// resize resizes the terminal. Like xterm.js, a primary screen whose
// cursor would fall off the bottom scrolls up into the scrollback first,
// so the lines around the cursor stay on screen (x/vt cuts the bottom).
func (t *term) resize(cols, rows int) {
	if cols == t.emu.Width() && rows == t.emu.Height() {
		return
	}
	if !t.emu.IsAltScreen() {
		if p := t.emu.CursorPosition(); p.Y >= rows {
			k := p.Y - rows + 1
			t.write(fmt.Appendf(nil, "\x1b[r\x1b[%d;1H%s\x1b[%d;%dH", t.emu.Height(), strings.Repeat("\n", k), p.Y-k+1, p.X+1))
		}
	}
	t.emu.Resize(cols, rows)
}
