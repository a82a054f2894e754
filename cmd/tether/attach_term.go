package main

import (
	"strconv"
)

// Sequences written to the local terminal around what the PTY prints.
const (
	// clearScreen resets the local terminal before a snapshot, which
	// redraws a fresh terminal: modes, scroll region, colours, the
	// screen. It leaves the alternate screen first: RIS does not in
	// every terminal (tmux keeps it), and a snapshot drawn there would
	// land on the wrong screen, its own ?1049h doing nothing. A terminal
	// answers nothing to either.
	clearScreen = "\x1b[?1049l\x1bc"
	// clearScrollback erases the local scrollback (ED 3) on a reset
	// within one attachment: what it holds is the PTY's earlier output,
	// which the snapshot brings again. The first snapshot leaves the
	// scrollback alone: it is the user's, from before the attach.
	clearScrollback = "\x1b[3J"
	// restoreModes puts back what a program in the PTY (or a snapshot
	// of it) may have left set in the local terminal: mouse reports (9,
	// 1000, 1002, 1003 and the 1005, 1006, 1015 encodings), focus
	// reports (1004), bracketed paste (2004), application cursor keys
	// (DECCKM) and keypad (DECKPNM), a hidden cursor, the cursor's shape
	// (DECSCUSR 0), the pen, autowrap off (DECAWM), insert mode (IRM),
	// newline mode (LNM) and the line-drawing character set (G0 ASCII,
	// shifted in). None of them moves the cursor or is answered.
	restoreModes = "\x1b[?9l\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1005l\x1b[?1006l\x1b[?1015l" +
		"\x1b[?1004l\x1b[?2004l\x1b[?1l\x1b>\x1b[?25h\x1b[0 q\x1b[m" +
		"\x1b[?7h\x1b[4l\x1b[20l\x1b(B\x0f"
	// resetRegion resets a scroll region (DECSTBM), which homes the
	// cursor, with the cursor saved and restored around it (DECSC,
	// DECRC): a line feed on the last row scrolls the screen again.
	resetRegion = "\x1b7\x1b[r\x1b8"
	// resetOrigin leaves origin mode (DECOM) and resets the scroll
	// region; both home the cursor, and a DECRC would set origin mode
	// again, so the cursor goes to the last row instead.
	resetOrigin = "\x1b[?6l\x1b[r\x1b[999;1H"
	// freshLine ends what the PTY showed: the cursor goes to the start
	// of the next line and everything from there down is erased, so that
	// what follows (the last status line, the shell's prompt) is on lines
	// of its own even where the screen shown does not end at the cursor
	// (a view of a PTY of another size: its snapshot was drawn for a
	// terminal of that size).
	freshLine = "\r\n\x1b[J"
)

// altScreen follows, in the bytes written to the local terminal, which
// alternate screen mode (47, 1047 or 1049) is set, so that leaving the
// terminal is done with the same one, and only when it is set: a
// ?1049l on the primary screen restores a saved cursor (xterm, tmux)
// and would move the cursor away from the shell's prompt. It follows
// the scroll region (DECSTBM) and origin mode (DECOM) too, which leaving
// resets only when set: resetting them moves the cursor.
type altScreen struct {
	mode   int    // the alternate screen mode set; 0 for none
	region bool   // a scroll region may be set
	origin bool   // origin mode is set
	state  int    // altGround, altEsc or altCSI
	params []byte // a CSI's parameters so far
	priv   bool   // the CSI started with '?'
	plain  bool   // the CSI has no prefix and no intermediate byte so far
	first  bool   // nothing of the CSI seen yet after its introducer
}

const (
	altGround = iota
	altEsc
	altCSI
)

// maxAltParams bounds the parameters kept of one CSI; a longer one is
// not an alternate screen switch.
const maxAltParams = 32

// write follows b.
func (s *altScreen) write(b []byte) {
	for _, c := range b {
		switch s.state {
		case altGround:
			if c == 0x1b {
				s.state = altEsc
			}
		case altEsc:
			switch c {
			case '[':
				s.state, s.params, s.priv, s.plain, s.first = altCSI, s.params[:0], false, true, true
			case 'c': // RIS leaves it in most terminals, and resets the rest
				s.mode, s.region, s.origin, s.state = 0, false, false, altGround
			case 0x1b:
			default:
				s.state = altGround
			}
		case altCSI:
			switch {
			case c >= 0x40 && c <= 0x7e: // the final byte
				switch {
				case s.priv && (c == 'h' || c == 'l'):
					s.switched(c == 'h')
				case s.plain && c == 'r': // DECSTBM; with no parameters, the whole screen
					s.region = len(s.params) > 0
				}
				s.state = altGround
			case c == 0x1b:
				s.state = altEsc
			case c == 0x18 || c == 0x1a: // CAN, SUB: the sequence is dropped
				s.state = altGround
			case c < 0x20: // other C0 controls run inside it
			case c == '?' && s.first:
				s.priv, s.plain = true, false
			case c >= '0' && c <= '9' || c == ';':
				if len(s.params) < maxAltParams {
					s.params = append(s.params, c)
				}
			default: // another prefix, an intermediate byte: no mode switch
				s.priv, s.plain = false, false
			}
			if c >= 0x20 {
				s.first = false
			}
		}
	}
}

// switched applies a private mode set (on) or reset to the parameters
// collected.
func (s *altScreen) switched(on bool) {
	for p := range splitParams(s.params) {
		n, err := strconv.Atoi(p)
		switch {
		case err != nil:
		case n == 6:
			s.origin = on
		case n != 47 && n != 1047 && n != 1049:
		case on:
			s.mode = n
		default:
			s.mode = 0
		}
	}
}

// splitParams yields the ';'-separated parameters of p.
func splitParams(p []byte) func(func(string) bool) {
	return func(yield func(string) bool) {
		start := 0
		for i := 0; i <= len(p); i++ {
			if i == len(p) || p[i] == ';' {
				if !yield(string(p[start:i])) {
					return
				}
				start = i + 1
			}
		}
	}
}

// leave returns what puts the local terminal back as a shell expects
// it: off the alternate screen if it is on it, restoreModes, and the
// scroll region and origin mode reset if they were set. The cursor stays
// where it is, unless origin mode was set (see resetOrigin).
func (s *altScreen) leave() string {
	out := restoreModes
	if s.mode != 0 {
		out = "\x1b[?" + strconv.Itoa(s.mode) + "l" + out
	}
	switch {
	case s.origin:
		out += resetOrigin
	case s.region:
		out += resetRegion
	}
	return out
}
