package main

import (
	"testing"
)

// TestAltScreenRegion: the tracker sees a scroll region set (DECSTBM
// with parameters) and reset (without), and origin mode, and forgets
// both at RIS; other sequences ending in r or ?6h are no such thing.
func TestAltScreenRegion(t *testing.T) {
	for _, tc := range []struct {
		name, out      string
		region, origin bool
	}{
		{"none", "hello\x1b[1mworld\x1b[m", false, false},
		{"region", "\x1b[5;20r", true, false},
		{"region reset", "\x1b[5;20r\x1b[r", false, false},
		{"private r is XTRESTORE", "\x1b[?1049r", false, false},
		{"an intermediate", "\x1b[1 r", false, false},
		{"origin", "\x1b[?6h", false, true},
		{"origin among others", "\x1b[?1;6;1000h", false, true},
		{"origin left", "\x1b[?6h\x1b[?6l", false, false},
		{"not private", "\x1b[6h", false, false},
		{"RIS", "\x1b[5;20r\x1b[?6h\x1bc", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s altScreen
			for i := range len(tc.out) {
				s.write([]byte{tc.out[i]})
			}
			if s.region != tc.region || s.origin != tc.origin {
				t.Errorf("region %v origin %v, want %v %v", s.region, s.origin, tc.region, tc.origin)
			}
		})
	}
}

func TestAltScreen(t *testing.T) {
	for _, tc := range []struct {
		name, out string
		want      int
	}{
		{"none", "hello\x1b[1mworld\x1b[m", 0},
		{"1049", "\x1b[?1049h~", 1049},
		{"1047", "\x1b[?1047h", 1047},
		{"47", "\x1b[?47h", 47},
		{"with other modes", "\x1b[?1000;1049;1006h", 1049},
		{"left", "\x1b[?1049hvim\x1b[?1049l$ ", 0},
		{"RIS", "\x1b[?1049h\x1bc", 0},
		{"set again after RIS", clearScreen + "\x1b[?1049h", 1049},
		{"not private", "\x1b[1049h", 0},
		{"DECRQM is no switch", "\x1b[?1049$p", 0},
		{"other prefix", "\x1b[>1049h", 0},
		{"cancelled", "\x1b[?10\x1849h", 0},
		{"C0 inside", "\x1b[?10\r49h", 1049},
		{"a longer number", "\x1b[?11049h", 0},
		{"ESC restarts", "\x1b[?1\x1b[?1049h", 1049},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var whole altScreen
			whole.write([]byte(tc.out))
			if whole.mode != tc.want {
				t.Errorf("in one write: mode %d, want %d", whole.mode, tc.want)
			}
			var bytewise altScreen
			for i := range len(tc.out) {
				bytewise.write([]byte{tc.out[i]})
			}
			if bytewise.mode != tc.want {
				t.Errorf("byte by byte: mode %d, want %d", bytewise.mode, tc.want)
			}
		})
	}
}

// TestAttachLeavesTerminal: on the way out, a terminal left on the
// alternate screen by the PTY's program is taken off it with the mode
// that put it there, and its input modes are reset, before the last
// status line; a terminal on the primary screen gets only the resets
// (a ?1049l there would restore a saved cursor).
func TestAttachLeavesTerminal(t *testing.T) {
	for _, tc := range []struct {
		name, out, want string
	}{
		{"alternate screen", "\x1b[?1049h\x1b[?1000h\x1b[?1006hvim", "\x1b[?1049l" + restoreModes},
		{"primary screen", "\x1b[?1049hvim\x1b[?1049l$ ", restoreModes},
		{"47", "\x1b[?47hless", "\x1b[?47l" + restoreModes},
		{"scroll region", "\x1b[1;20rtop", restoreModes + resetRegion},
		{"scroll region reset", "\x1b[1;20rtop\x1b[r", restoreModes},
		{"origin mode", "\x1b[?1049h\x1b[2;20r\x1b[?6hvim", "\x1b[?1049l" + restoreModes + resetOrigin},
		{"origin mode left", "\x1b[?6h\x1b[?6l$ ", restoreModes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := newFakePTYHost(t)
			c := startAttach(t, host, func(a *attachClient) {
				merged(a)
				a.term = true
			})
			p := host.accept(t, c)
			p.snapshot("e1", 0, "initial", tc.out)
			c.stdout.waitFor(t, tc.out)
			c.typeIn(t, "~.")
			p.readClose()
			if code := c.wait(t); code != 0 {
				t.Errorf("exit status %d, want 0", code)
			}
			want := clearScreen + "tether: attached; Enter ~. to detach\n" + tc.out + tc.want + freshLine + "tether: detached\n"
			if got := c.stdout.String(); got != want {
				t.Errorf("terminal %q\nwant     %q", got, want)
			}
		})
	}
}

// TestAttachLeavesNoTerminalAlone: output that is not a terminal gets
// no mode resets.
func TestAttachLeavesNoTerminalAlone(t *testing.T) {
	host := newFakePTYHost(t)
	c := startAttach(t, host, merged)
	p := host.accept(t, c)
	p.snapshot("e1", 0, "initial", "\x1b[?1049hvim")
	c.stdout.waitFor(t, "vim")
	c.typeIn(t, "~.")
	p.readClose()
	c.wait(t)
	want := "tether: attached; Enter ~. to detach\n" + "\x1b[?1049hvim" + "tether: detached\n"
	if got := c.stdout.String(); got != want {
		t.Errorf("terminal %q\nwant     %q", got, want)
	}
}
