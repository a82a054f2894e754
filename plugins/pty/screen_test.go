package pty

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/charmbracelet/x/ansi"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/wire/vtquery"
)

// noQueries fails t if p holds a terminal query.
func noQueries(t *testing.T, what string, p []byte) {
	t.Helper()
	f := vtquery.New()
	if f.Flush(f.Append(nil, p)); f.Dropped() != 0 {
		t.Errorf("%s %q holds %d terminal queries, want none", what, p, f.Dropped())
	}
}

// TestTermQueries: the emulator takes every query without waiting for
// anyone to read its answer, and a snapshot holds none of them.
func TestTermQueries(t *testing.T) {
	tm := newTerm(80, 24, 100)
	tm.write([]byte("\x1b[c\x1b[>c\x1b[6n\x1b[5n\x1b]10;?\a\x1b]11;?\x1b\\\x1b[?2004$p\x1b[>q\x1bP$qm\x1b\\\x1b[?u\x1b[18t\x1b[?2048hdone"))
	tm.resize(100, 30) // in-band resize reports go nowhere too
	snap := tm.snapshot(nil)
	if !bytes.Contains(snap, []byte("done")) {
		t.Errorf("snapshot %q: want it to show %q", snap, "done")
	}
	noQueries(t, "snapshot", snap)
}

// TestSnapshotHoldsNoQuery: each query of the vtquery table, fed between
// two texts, leaves a snapshot with both texts and no query, on the
// primary screen and on the alternate one.
func TestSnapshotHoldsNoQuery(t *testing.T) {
	for _, q := range vtquery.Examples() {
		for _, alt := range []bool{false, true} {
			name := q.Name
			if alt {
				name += " alternate screen"
			}
			t.Run(name, func(t *testing.T) {
				tm := newTerm(80, 24, 100)
				if alt {
					tm.write([]byte("\x1b[?1049h"))
				}
				tm.write([]byte("before" + q.Seq + "after\r\nnext line"))
				snap := tm.snapshot(nil)
				for _, want := range []string{"before", "after", "next line"} {
					if !bytes.Contains(snap, []byte(want)) {
						t.Errorf("snapshot %q: want it to show %q", snap, want)
					}
				}
				noQueries(t, "snapshot", snap)
			})
		}
	}
}

// TestSnapshotAlternateScreen: the primary screen and its scrollback come
// first, then ?1049h and the alternate screen, then the modes, title,
// cursor.
func TestSnapshotAlternateScreen(t *testing.T) {
	tm := newTerm(40, 5, 100)
	for i := range 8 {
		tm.write([]byte("primary " + strings.Repeat("x", i) + "\r\n"))
	}
	tm.write([]byte("$ vim\x1b[?1049h\x1b[H\x1b[2Jalt text\x1b[?2004h\x1b[?1000h\x1b[?1006h\x1b[?1h\x1b=\x1b]2;vim\a\x1b[?25l\x1b[3;7H"))
	if !tm.emu.IsAltScreen() {
		t.Fatal("the emulator is not on the alternate screen")
	}
	snap := string(tm.snapshot(nil))
	alt := strings.Index(snap, "\x1b[?1049h")
	if alt < 0 || !strings.Contains(snap[:alt], "primary xxxxxxx") || !strings.Contains(snap[:alt], "$ vim") ||
		!strings.Contains(snap[alt:], "alt text") {
		t.Fatalf("snapshot %q: want the primary screen and scrollback, then ?1049h and the alternate screen", snap)
	}
	for _, want := range []string{"\x1b[?2004h", "\x1b[?1000h", "\x1b[?1006h", "\x1b[?1h", "\x1b=", "\x1b]2;vim\a", "\x1b[?25l", "\x1b[3;7H"} {
		if !strings.Contains(snap[alt:], want) {
			t.Errorf("snapshot %q: want %q after the alternate screen", snap, want)
		}
	}
	if !strings.HasSuffix(snap, "\x1b[3;7H") {
		t.Errorf("snapshot %q: want the cursor position last", snap)
	}
	noQueries(t, "snapshot", []byte(snap))
}

func TestCleanTitle(t *testing.T) {
	for in, want := range map[string]string{
		"plain":               "plain",
		"a\x1b[cb":            "a[cb",
		"bell\ahere":          "bellhere",
		"c1 \u009b6n end":     "c1 6n end",
		"日本 ✓":                "日本 ✓",
		"tab\tnew\nline\rret": "tabnewlineret",
	} {
		if got := cleanTitle(in); got != want {
			t.Errorf("cleanTitle(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestScreenRebuilt: a model that fell further behind than the ring
// holds is rebuilt from the ring's tail for the snapshot, which counts in
// PTYInfo.ScreenRebuilds and in the backend's ScreenRebuilds, which keeps
// it after the PTY is gone; fed or not, the snapshot shows the last lines.
func TestScreenRebuilt(t *testing.T) {
	for _, tt := range []struct {
		name   string
		noFeed bool
		want   int64
	}{{"fed", false, -1}, {"left behind", true, 1}} {
		t.Run(tt.name, func(t *testing.T) {
			b, out := newBackendWith(t, contract.BackendConfig{Buffer: 4 << 10, Scrollback: 10}, func(b *Backend) { b.testNoFeed = tt.noFeed })
			r := attach(t, b, contract.AttachRequest{Token: token("behind"), Viewer: viewer(1),
				Argv: sh("i=0; while [ $i -lt 2000 ]; do echo line$i; i=$((i+1)); done; echo LAST; exec sleep 30")})
			out.waitOutput(t, r.Epoch, "LAST\r\n")
			snap := attach(t, b, contract.AttachRequest{Token: token("behind"), Viewer: viewer(2), View: true})
			if !snap.Snapshot || !bytes.Contains(snap.Replay, []byte("line1999\r\nLAST")) {
				t.Errorf("snapshot %q: want it to end with the last lines", snap.Replay)
			}
			info, _ := listed(t, b, token("behind"))
			// A fed model may fall out of so small a ring as well (it
			// takes a fifth of a CPU): only the unfed one's count is known.
			if tt.noFeed && info.ScreenRebuilds != tt.want {
				t.Errorf("ScreenRebuilds: got %d, want %d", info.ScreenRebuilds, tt.want)
			}
			if err := b.Close(context.Background(), token("behind")); err != nil {
				t.Fatal(err)
			}
			out.waitExit(t, r.Epoch)
			// The backend's count keeps the rebuilds of the PTY gone.
			total, err := b.ScreenRebuilds(context.Background())
			if err != nil || total < info.ScreenRebuilds || tt.noFeed && total != tt.want {
				t.Errorf("the backend's ScreenRebuilds after the PTY exited: got %d, %v; want %d", total, err, max(info.ScreenRebuilds, tt.want))
			}
		})
	}
}

// TestNoScrollback: a model with no scrollback (--pty-scrollback 0) sends
// only the screen; NoScrollback is what the backend takes for it.
func TestNoScrollback(t *testing.T) {
	tm := newTerm(40, 5, 0)
	for i := range 20 {
		tm.write([]byte("line " + strings.Repeat("x", i) + "\r\n"))
	}
	snap := string(tm.snapshot(nil))
	if strings.Contains(snap, "line xxxxxxxxxx\r") || !strings.Contains(snap, "line "+strings.Repeat("x", 19)) {
		t.Fatalf("snapshot %q: want only the last screen's lines", snap)
	}
	b, _ := newBackend(t, contract.BackendConfig{Scrollback: contract.NoScrollback})
	if b.cfg.Scrollback != 0 {
		t.Fatalf("backend scrollback with NoScrollback = %d, want 0", b.cfg.Scrollback)
	}
}

// TestScreenModelSwitch: TETHER_PTY_SCREEN_MODEL=off, for benchmarks,
// leaves the screen models unfed; anything else keeps them.
func TestScreenModelSwitch(t *testing.T) {
	for _, tt := range []struct {
		value  string
		noFeed bool
	}{{"off", true}, {"on", false}, {"", false}} {
		t.Run(tt.value, func(t *testing.T) {
			t.Setenv(envScreenModel, tt.value)
			if got := New(zerolog.Nop()).testNoFeed; got != tt.noFeed {
				t.Errorf("%s=%q: unfed %v, want %v", envScreenModel, tt.value, got, tt.noFeed)
			}
		})
	}
}

// TestSnapshotLinkControls: a program's hyperlink whose id and URI hold
// C1 controls (U+009B 6n: a CPR query to a terminal that decodes UTF-8
// first) is re-emitted by the snapshot without them: the snapshot holds
// no query, in its 8-bit forms either, and the link text stays.
func TestSnapshotLinkControls(t *testing.T) {
	tm := newTerm(80, 24, 100)
	tm.write([]byte("\x1b]8;id=x\u009b6n;https://example.com/\u009b6n\x1b\\linked\x1b]8;;\x1b\\ plain"))
	snap := tm.snapshot(nil)
	if bytes.Contains(snap, []byte("\u009b")) || bytes.Contains(snap, []byte{0x9b}) {
		t.Errorf("snapshot %q holds a C1 CSI", snap)
	}
	if !bytes.Contains(snap, []byte("linked")) || !bytes.Contains(snap, []byte("plain")) {
		t.Errorf("snapshot %q lost the text", snap)
	}
	noQueries(t, "snapshot", snap)
}

// TestSnapshotModes: each mode a snapshot restores, moved away from a
// fresh terminal's value (the default-on ones turned off, the others
// on), comes back in the snapshot as the one sequence that sets or
// resets it — never as a query (DECRQM, "$p") — and a fresh terminal fed
// the snapshot ends with the same modes.
func TestSnapshotModes(t *testing.T) {
	modes := append([]ansi.Mode{ansi.ModeTextCursorEnable, ansi.ModeOrigin}, snapshotModes...)
	for _, m := range modes {
		on := !defaultModes[m]
		want := ansi.ResetMode(m)
		if on {
			want = ansi.SetMode(m)
		}
		t.Run(strings.TrimPrefix(want, "\x1b["), func(t *testing.T) {
			tm := newTerm(80, 24, 100)
			tm.write([]byte("text\r\n" + want))
			if tm.modes[m] != on {
				t.Fatalf("after %q the mode is %v, want %v", want, tm.modes[m], on)
			}
			snap := tm.snapshot(nil)
			if !bytes.Contains(snap, []byte(want)) {
				t.Errorf("snapshot %q: want %q", snap, want)
			}
			if bytes.Contains(snap, []byte("$p")) {
				t.Errorf("snapshot %q holds a mode query ($p)", snap)
			}
			noQueries(t, "snapshot", snap)
			fresh := newTerm(80, 24, 100)
			fresh.write(snap)
			for _, n := range modes {
				if fresh.modes[n] != tm.modes[n] {
					t.Errorf("a fresh terminal fed the snapshot has mode %v %v, want %v", n, fresh.modes[n], tm.modes[n])
				}
			}
		})
	}
}

// TestScrollRegionPastBottom: a scroll region whose bottom margin is below
// the screen (a program that set it for a taller terminal) ends at the
// screen's bottom row, as in xterm.js; line feeds in it scroll the region
// instead of panicking the emulator.
func TestScrollRegionPastBottom(t *testing.T) {
	for _, tt := range []struct {
		name string
		alt  bool
		seq  string
	}{
		{"primary", false, "\x1b[2;5r"},
		{"alternate", true, "\x1b[2;5r"},
		{"far below", false, "\x1b[1;999r"},
		{"top below too", false, "\x1b[7;9r"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tm := newTerm(40, 4, 50)
			if tt.alt {
				tm.write([]byte("\x1b[?1049h"))
			}
			tm.write([]byte("row1\r\nrow2\r\nrow3\r\nrow4" + tt.seq))
			tm.write([]byte("\x1b[4;1H\r\n\r\nlast")) // line feeds at the bottom
			if !bytes.Contains(tm.snapshot(nil), []byte("last")) {
				t.Errorf("snapshot %q: want it to show %q", tm.snapshot(nil), "last")
			}
		})
	}
}
