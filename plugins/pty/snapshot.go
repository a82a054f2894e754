package pty

import (
	"strconv"
	"strings"
	"unicode"

	uv "github.com/charmbracelet/ultraviolet"
	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/vt"
)

// snapshotModes are the modes a snapshot restores when they differ from a
// fresh terminal's: what the terminal must know to send the right input
// (cursor and keypad keys, paste, mouse and focus reports) and the two
// that change how output lands (autowrap, insert, newline). The alternate
// screen and cursor visibility are restored on their own.
var snapshotModes = []ansi.Mode{
	ansi.ModeCursorKeys,       // DECCKM ?1
	ansi.ModeAutoWrap,         // DECAWM ?7
	ansi.ModeMouseX10,         // ?9
	ansi.ModeMouseNormal,      // ?1000
	ansi.ModeMouseButtonEvent, // ?1002
	ansi.ModeMouseAnyEvent,    // ?1003
	ansi.ModeFocusEvent,       // ?1004
	ansi.ModeMouseExtUtf8,     // ?1005
	ansi.ModeMouseExtSgr,      // ?1006
	ansi.ModeMouseExtUrxvt,    // ?1015
	ansi.ModeBracketedPaste,   // ?2004
	ansi.ModeInsertReplace,    // IRM 4
	ansi.ModeLineFeedNewLine,  // LNM 20
}

// snapshot appends to b an escape-sequence stream that, written to a fresh
// terminal of the same size, reproduces t: every scrollback line, the
// primary screen, the alternate screen over it when it is shown, the scroll
// region, the input modes, the title, the cursor's style, visibility, pen
// and position. It holds text, SGR, cursor moves and mode settings only —
// never a sequence a terminal answers.
func (t *term) snapshot(b []byte) []byte {
	e := t.emu
	cols, rows := e.Width(), e.Height()
	prim := &t.scrs[0]
	var pen uv.Style
	var link uv.Link

	if sb := e.Scrollback(); sb != nil {
		for _, line := range sb.Lines() {
			b = appendCells(b, &pen, &link, len(line), func(x int) *uv.Cell { return &line[x] })
			b = appendNewline(b, &pen, &link)
		}
	}
	for y := range rows {
		b = appendCells(b, &pen, &link, cols, func(x int) *uv.Cell { return prim.CellAt(x, y) })
		if y < rows-1 {
			b = appendNewline(b, &pen, &link)
		}
	}
	b = appendReset(b, &pen, &link)

	s := prim
	if e.IsAltScreen() {
		// The primary screen's cursor is the one ?1049h saves and ?1049l
		// brings back.
		b = appendCursor(b, prim, false)
		b = append(b, "\x1b[?1049h"...)
		s = &t.scrs[1]
		for y := range rows {
			b = appendCUP(b, y+1, 1)
			b = appendCells(b, &pen, &link, cols, func(x int) *uv.Cell { return s.CellAt(x, y) })
		}
		b = appendReset(b, &pen, &link)
	}

	if r := s.ScrollRegion(); r.Min.Y > 0 || r.Max.Y < rows {
		b = append(b, "\x1b["...)
		b = strconv.AppendInt(b, int64(r.Min.Y+1), 10)
		b = append(b, ';')
		b = strconv.AppendInt(b, int64(r.Max.Y), 10)
		b = append(b, 'r')
	}
	for _, m := range snapshotModes {
		if set := t.modes[m]; set != defaultModes[m] {
			if set {
				b = append(b, ansi.SetMode(m)...)
			} else {
				b = append(b, ansi.ResetMode(m)...)
			}
		}
	}
	if t.modes[ansi.ModeNumericKeypad] {
		b = append(b, ansi.DECKPAM...)
	}
	if title := cleanTitle(t.title); title != "" {
		b = append(b, "\x1b]2;"...)
		b = append(b, title...)
		b = append(b, '\a')
	}
	if style, blink := e.CursorStyle(); style != vt.CursorBlock || !blink {
		n := 2*int(style) + 1 // DECSCUSR: 1 blinking block, 2 steady block, 3 blinking underline ...
		if !blink {
			n++
		}
		b = append(b, ansi.SetCursorStyle(n)...)
	}
	return appendCursor(b, s, t.modes[ansi.ModeOrigin])
}

// appendCursor appends what puts the cursor of s back: its pen, origin
// mode, visibility and position.
func appendCursor(b []byte, s *vt.Screen, origin bool) []byte {
	cur := s.Cursor()
	if !cur.Pen.IsZero() {
		b = append(b, cur.Pen.String()...)
	}
	y := cur.Y
	if origin {
		b = append(b, ansi.SetMode(ansi.ModeOrigin)...)
		y -= s.ScrollRegion().Min.Y
	}
	if cur.Hidden {
		b = append(b, ansi.ResetMode(ansi.ModeTextCursorEnable)...)
	}
	return appendCUP(b, y+1, cur.X+1)
}

func appendCUP(b []byte, row, col int) []byte {
	b = append(b, "\x1b["...)
	b = strconv.AppendInt(b, int64(row), 10)
	b = append(b, ';')
	b = strconv.AppendInt(b, int64(col), 10)
	return append(b, 'H')
}

// appendCells appends the cells [0, width) of a line, up to its last
// cell that is not a blank with no style, each with the SGR and hyperlink
// changes it needs.
func appendCells(b []byte, pen *uv.Style, link *uv.Link, width int, cell func(x int) *uv.Cell) []byte {
	end := width
	for end > 0 && blank(cell(end-1)) {
		end--
	}
	for x := 0; x < end; {
		c := cell(x)
		if c == nil {
			c = &uv.EmptyCell
		}
		if c.Style != *pen { // cheap test first: most cells share their neighbour's style
			if d := uv.StyleDiff(pen, &c.Style); d != "" {
				b = append(b, d...)
			}
			*pen = c.Style
		}
		if c.Link != *link {
			// A program chose the link's URI and id: they go through
			// cleanTitle too, so that no control inside them (a C1 CSI
			// in an id, say) can start a sequence in the viewer's
			// terminal.
			b = append(b, ansi.SetHyperlink(cleanTitle(c.Link.URL), cleanTitle(c.Link.Params))...)
			*link = c.Link
		}
		if printable(c.Content) {
			b = append(b, c.Content...)
		} else {
			b = append(b, ' ')
		}
		x += max(c.Width, 1)
	}
	return b
}

// appendNewline ends a line. The pen is reset first: a line feed that
// scrolls fills the new line with the pen's background.
func appendNewline(b []byte, pen *uv.Style, link *uv.Link) []byte {
	return append(appendReset(b, pen, link), '\r', '\n')
}

func appendReset(b []byte, pen *uv.Style, link *uv.Link) []byte {
	if !pen.IsZero() {
		b = append(b, ansi.ResetStyle...)
		*pen = uv.Style{}
	}
	if !link.IsZero() {
		b = append(b, ansi.ResetHyperlink()...)
		*link = uv.Link{}
	}
	return b
}

// blank reports whether c is a blank cell with no style, which a fresh
// terminal has already.
func blank(c *uv.Cell) bool {
	return c == nil || (c.Content == " " || c.Content == "") && c.Style.IsZero() && c.Link.IsZero()
}

// printable reports whether s is a grapheme that writes no control
// character.
func printable(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r >= 0x7f && r < 0xa0 {
			return false
		}
	}
	return true
}

// cleanTitle drops control characters — C0, DEL and C1 (U+0080–U+009F,
// which a terminal that decodes UTF-8, xterm.js among them, takes for
// 8-bit controls) — from a title or a hyperlink's URI or parameters, so
// that it cannot end the OSC it is sent in and start another sequence.
func cleanTitle(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return -1
		}
		return r
	}, s)
}
