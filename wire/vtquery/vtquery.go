// Package vtquery removes terminal queries from a byte stream: the
// sequences a terminal answers by sending bytes back as if typed (device
// attributes, status and cursor position reports, colour and mode
// queries, version, settings and capability requests, window reports,
// the kitty keyboard query). A client that writes replayed PTY output to a
// terminal passes it through a Filter first, so that the terminal does
// not answer a question a program asked long ago and type the answer into
// the PTY.
//
// Everything that is not a query passes through byte for byte, in order:
// text, controls, other escape sequences, also malformed ones. Only an
// unfinished sequence that a query interrupts goes with the query (a
// terminal ignores it, or it would run on into the bytes after the query);
// a control executed inside a query stays.
// The escape sequences are recognised by the parser of
// github.com/charmbracelet/x/ansi, which follows the DEC state machine
// (vt100.net/emu/dec_ansi_parser) as xterm and xterm.js do. Their 8-bit
// forms count too: a C1 control as a raw byte (0x9B for CSI, 0x9D for
// OSC, 0x90 for DCS, 0x9C for ST), and as a UTF-8-encoded code point
// (U+009B is C2 9B), which a terminal that decodes UTF-8 before it parses
// — xterm.js — takes for the same control.
package vtquery

import (
	"bytes"

	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/ansi/parser"
)

// maxHold bounds the bytes of one sequence a Filter holds back while it
// cannot tell yet whether it is a query. A longer sequence (a clipboard
// or an image, say) is no query: it is passed on as it comes.
const maxHold = 64 << 10

// kind is what the parser made of the byte just fed.
type kind uint8

const (
	none     kind = iota // still inside a sequence, or nothing dispatched
	other                // a sequence or control that is not a query
	query                // a query
	executed             // a control executed inside an unfinished sequence
	enq                  // ENQ, which asks for the answerback message
)

// Filter removes queries from a stream written to it in pieces; a query
// split across pieces is removed as well. The zero value is not usable;
// call New. A Filter is not safe for concurrent use.
type Filter struct {
	p       *ansi.Parser
	ev      kind
	pend    []byte // the bytes of the unfinished sequence, with any it aborted before it
	keep    []int  // indexes in pend of controls executed inside it
	passing bool   // the unfinished sequence is too long to hold: passed on as it comes
	stEsc   bool   // pend ends with the ESC that ended a string sequence (ST's first byte)
	stQuery bool   // and that string sequence is a query
	dropped int

	mangled   bool         // a control was executed inside the unfinished sequence
	scratch   *ansi.Parser // parses a mangled sequence again
	scratchEv kind
	c2        bool // a 0xC2 is held back: with 0x80–0x9F after it, it is a C1 control
}

// New returns a Filter at the start of a stream.
func New() *Filter {
	f := &Filter{}
	f.p = newParser(&f.ev)
	f.scratch = newParser(&f.scratchEv)
	return f
}

// newParser returns a parser that records in *ev what each byte it is fed
// makes of it.
func newParser(ev *kind) *ansi.Parser {
	p := ansi.NewParser()
	p.SetDataSize(1024) // enough to classify; longer payloads are cut in the parser only
	p.SetHandler(ansi.Handler{
		Print: func(rune) { *ev = other },
		Execute: func(b byte) {
			switch {
			case b == ansi.ENQ:
				*ev = enq
			case b == ansi.ESC:
				// A second ESC aborts the first and begins a sequence:
				// nothing is executed.
			case p.State() != parser.GroundState && p.State() != parser.Utf8State:
				*ev = executed
			default:
				*ev = other
			}
		},
		HandleCsi: func(cmd ansi.Cmd, params ansi.Params) { *ev = classify(csiQuery(cmd, params)) },
		HandleEsc: func(cmd ansi.Cmd) { *ev = classify(cmd.Final() == 'Z' && cmd.Intermediate() == 0) }, // DECID
		HandleDcs: func(cmd ansi.Cmd, _ ansi.Params, _ []byte) { *ev = classify(dcsQuery(cmd)) },
		HandleOsc: func(cmd int, data []byte) { *ev = classify(oscQuery(cmd, data)) },
		HandleApc: func(data []byte) { *ev = classify(apcQuery(data)) },
		HandlePm:  func([]byte) { *ev = other },
		HandleSos: func([]byte) { *ev = other },
	})
	return p
}

// reclassify tells what the sequence just dispatched is when controls
// were executed inside it: the parser then loses its prefix and final
// byte (it keeps the control's byte as the command), so the sequence is
// parsed again without them.
func (f *Filter) reclassify() kind {
	f.scratch.Reset()
	f.scratchEv = none
	ctl := f.keep
	for i, b := range f.pend {
		if len(ctl) > 0 && ctl[0] == i {
			ctl = ctl[1:]
			continue
		}
		if b == 0xc2 && i+1 < len(f.pend) && isC1(f.pend[i+1]) {
			continue // the C1 control's byte comes next
		}
		f.scratchEv = none
		f.scratch.Advance(b)
	}
	return f.scratchEv
}

func classify(isQuery bool) kind {
	if isQuery {
		return query
	}
	return other
}

// Dropped is how many queries the Filter has removed so far.
func (f *Filter) Dropped() int { return f.dropped }

// Append appends to dst the bytes of src that are not part of a query and
// returns the extended slice. The bytes of a sequence that src leaves
// unfinished are held back until a later Append finishes it (or Flush).
func (f *Filter) Append(dst, src []byte) []byte {
	for _, b := range src {
		if f.c2 {
			f.c2 = false
			if isC1(b) {
				// U+0080–U+009F: the parser is given the control's 8-bit
				// byte, the output keeps both.
				dst = f.advance(dst, b, []byte{0xc2, b})
				continue
			}
			dst = f.advance(dst, 0xc2, nil)
		}
		if b == 0xc2 {
			f.c2 = true
			continue
		}
		dst = f.advance(dst, b, nil)
	}
	return dst
}

// isC1 reports whether b, after a 0xC2, makes the UTF-8 encoding of a C1
// control (U+0080–U+009F).
func isC1(b byte) bool { return b >= 0x80 && b <= 0x9f }

// Flush appends the bytes held back of an unfinished sequence — the end of
// the stream came first, so it is not a query — and resets the Filter to
// the start of a stream.
func (f *Filter) Flush(dst []byte) []byte {
	dst = append(dst, f.pend...)
	if f.c2 {
		dst = append(dst, 0xc2)
		f.c2 = false
	}
	f.reset()
	f.p.Reset()
	return dst
}

func (f *Filter) reset() {
	f.pend, f.keep = f.pend[:0], f.keep[:0]
	f.passing, f.stEsc, f.stQuery, f.mangled = false, false, false, false
}

// drop discards the held sequence, a query, but for the controls a
// terminal would have executed inside it.
func (f *Filter) drop(dst []byte) []byte {
	for _, i := range f.keep {
		dst = append(dst, f.pend[i])
	}
	f.dropped++
	f.reset()
	return dst
}

func (f *Filter) emit(dst []byte) []byte {
	dst = append(dst, f.pend...)
	f.reset()
	return dst
}

// advance feeds the parser b, which stands for the bytes orig of the
// stream (b itself when orig is nil; a C1 control's UTF-8 encoding).
func (f *Filter) advance(dst []byte, b byte, orig []byte) []byte {
	if orig == nil {
		orig = []byte{b}
	}
	if f.stEsc {
		// The byte after the ESC that ended a string sequence: a '\'
		// completes ST; anything else begins a new sequence with that
		// ESC.
		f.stEsc = false
		if b == '\\' {
			f.ev = none
			f.p.Advance(b)
			f.pend = append(f.pend, orig...)
			if f.stQuery {
				return f.drop(dst)
			}
			return f.emit(dst)
		}
		if f.stQuery {
			esc := f.pend[len(f.pend)-1]
			f.pend = f.pend[:len(f.pend)-1]
			dst = f.drop(dst)
			f.pend = append(f.pend, esc)
		}
		// Else the string stays held with the sequence its ESC begins,
		// like a CSI that an ESC aborts: were that one a query and the
		// string passed on, the string would run on into what follows.
	}

	state := f.p.State()
	inString := state == parser.OscStringState || state == parser.DcsStringState ||
		state == parser.SosStringState || state == parser.PmStringState || state == parser.ApcStringState
	f.ev = none
	f.p.Advance(b)
	if f.passing {
		dst = append(dst, orig...)
		if f.p.State() == parser.GroundState || f.ev == other || f.ev == query {
			f.reset()
		}
		return dst
	}
	f.pend = append(f.pend, orig...)
	if f.mangled && (f.ev == query || f.ev == other) {
		f.ev = f.reclassify()
	}
	switch f.ev {
	case query, other:
		if b == ansi.ESC && inString {
			f.stEsc, f.stQuery = true, f.ev == query
			return dst
		}
		if f.ev == query {
			return f.drop(dst)
		}
		return f.emit(dst)
	case executed:
		for i := range orig {
			f.keep = append(f.keep, len(f.pend)-len(orig)+i)
		}
		f.mangled = true
	case enq:
		f.pend = f.pend[:len(f.pend)-1] // executed on its own, inside a sequence or not
		f.dropped++
		f.mangled = f.mangled || f.p.State() != parser.GroundState
	}
	if f.p.State() == parser.GroundState {
		return f.emit(dst) // a sequence that ended without a dispatch (CAN, SUB)
	}
	if len(f.pend) > maxHold && f.p.State() != parser.Utf8State {
		dst = f.emit(dst)
		f.passing = true
	}
	return dst
}

// csiQuery reports whether a CSI sequence asks the terminal for an answer.
func csiQuery(cmd ansi.Cmd, params ansi.Params) bool {
	prefix, inter, final := cmd.Prefix(), cmd.Intermediate(), cmd.Final()
	first, _, _ := params.Param(0, 0)
	switch {
	case final == 'c' && inter == 0: // DA1, DA2 (>), DA3 (=)
		return prefix == 0 || prefix == '>' || prefix == '='
	case final == 'n' && inter == 0: // DSR, CPR; DEC DSR (?)
		return prefix == 0 || prefix == '?'
	case final == 'p' && inter == '$': // DECRQM, ANSI and DEC
		return true
	case final == 'q' && prefix == '>' && inter == 0: // XTVERSION
		return true
	case final == 'u' && prefix == '?' && inter == 0: // kitty keyboard flags
		return true
	case final == 'm' && prefix == '?' && inter == 0: // XTQMODKEYS
		return true
	case final == 'S' && prefix == '?' && inter == 0: // XTSMGRAPHICS
		return true
	case final == 't' && prefix == 0 && inter == 0: // XTWINOPS reports
		switch first {
		case 11, 13, 14, 15, 16, 18, 19, 20, 21:
			return true
		}
	case final == 'x' && prefix == 0 && inter == 0: // DECREQTPARM
		return first <= 1
	case inter == '$' && prefix == 0 && (final == 'w' || final == 'u'): // DECRQPSR, DECRQTSR
		return true
	case inter == '*' && final == 'y': // DECRQCRA
		return true
	case inter == '"' && final == 'v': // DECRQDE
		return true
	case inter == '#' && final == '|': // XTREPORTSGR
		return true
	}
	return false
}

// dcsQuery reports whether a DCS sequence asks for an answer: DECRQSS
// ($ q) and XTGETTCAP (+ q).
func dcsQuery(cmd ansi.Cmd) bool {
	return cmd.Final() == 'q' && (cmd.Intermediate() == '$' || cmd.Intermediate() == '+')
}

// oscQuery reports whether an OSC sequence asks for an answer: a colour
// (4, 5, 10–19) or the clipboard (52) given as "?".
func oscQuery(cmd int, data []byte) bool {
	args := data
	if i := bytes.IndexByte(args, ';'); i >= 0 {
		args = args[i+1:]
	} else {
		return false
	}
	switch {
	case cmd == 4 || cmd == 5: // index;spec pairs
		parts := bytes.Split(args, []byte{';'})
		for i := 1; i < len(parts); i += 2 {
			if bytes.Equal(parts[i], []byte{'?'}) {
				return true
			}
		}
	case cmd >= 10 && cmd <= 19: // one spec per colour, from cmd on
		for _, p := range bytes.Split(args, []byte{';'}) {
			if bytes.Equal(p, []byte{'?'}) {
				return true
			}
		}
	case cmd == 52: // selection;data
		if i := bytes.IndexByte(args, ';'); i >= 0 {
			return bytes.Equal(args[i+1:], []byte{'?'})
		}
	}
	return false
}

// apcQuery reports whether an APC sequence is a kitty graphics query
// (action a=q), which the terminal answers.
func apcQuery(data []byte) bool {
	if len(data) == 0 || data[0] != 'G' {
		return false
	}
	ctrl := data[1:]
	if i := bytes.IndexByte(ctrl, ';'); i >= 0 {
		ctrl = ctrl[:i]
	}
	for _, kv := range bytes.Split(ctrl, []byte{','}) {
		if bytes.Equal(kv, []byte("a=q")) {
			return true
		}
	}
	return false
}
