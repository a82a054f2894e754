package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
)

// The queries of the tests: device attributes, cursor position report,
// background colour, bracketed paste mode.
const (
	qDA     = "\x1b[c"
	qCPR    = "\x1b[6n"
	qOSC11  = "\x1b]11;?\x07"
	qDECRQM = "\x1b[?2004$p"
	queries = qDA + qCPR + qOSC11 + qDECRQM
)

// snapshot sends a pty.replay header announcing a snapshot of snap at
// offset (reason as given), then snap in one binary frame.
func (p *fakePTY) snapshot(epoch string, offset int64, reason, snap string) {
	p.t.Helper()
	msg, err := json.Marshal(map[string]any{
		"type": "pty.replay", "epoch": epoch, "start_offset": offset,
		"replay_end_offset": offset, "reset": true, "reason": reason,
		"snapshot": true, "snapshot_bytes": len(snap), "cols": 80, "rows": 24,
	})
	if err != nil {
		p.t.Fatal(err)
	}
	if err := wsutil.WriteServerText(p.conn, msg); err != nil {
		p.t.Fatalf("send pty.replay: %v", err)
	}
	if snap != "" {
		p.output(snap)
	}
}

// merged makes the client write stdout and stderr to one buffer, to see
// status lines in their place in the stream.
func merged(a *attachClient) { a.stderr = a.stdout }

func TestAttachAnnounces(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fresh bool
		view  bool
		hint  string
	}{
		{"token", false, false, "tether: attached; Enter ~. to detach\n"},
		{"new", true, false, "tether: attach token " + testAttachToken + "\ntether: attached; Enter ~. to detach\n"},
		{"view", false, true, "tether: attached read-only (--view): nothing you type is sent; Enter ~. to detach\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := newFakePTYHost(t)
			c := startAttach(t, host, func(a *attachClient) {
				merged(a)
				a.fresh, a.view = tc.fresh, tc.view
			})
			p := host.accept(t, c)
			p.snapshot("e1", 0, "initial", "SNAP")
			p.output("live1")
			c.stdout.waitFor(t, "live1")
			p.drop()

			p = host.accept(t, c)
			p.replay("e1", 0, 7, false, "resume")
			p.output("x")
			p.output("y")
			c.stdout.waitFor(t, "y")
			p.closeWith(4410, "")
			if code := c.wait(t); code != 0 {
				t.Errorf("exit status %d, want 0", code)
			}
			// The hint (and token) once, on the cleared terminal before
			// the snapshot; the reconnected line after the resumed
			// replay, before live output.
			want := tc.hint + "SNAP" + "live1" +
				"tether: connection lost, reconnecting…\n" +
				"xy" + "tether: reconnected\n" +
				"tether: session ended (4410)\n"
			if got := c.stdout.String(); got != want {
				t.Errorf("terminal %q\nwant     %q", got, want)
			}
		})
	}
}

func TestAttachReconnectedSaysHow(t *testing.T) {
	for _, tc := range []struct {
		reason, line string
	}{
		{"epoch_mismatch", "tether: reconnected, to a new terminal: the previous one ended while away\n"},
		{"offset_rolled_out", "tether: reconnected; more was printed while away than the host keeps: the screen is redrawn\n"},
		{"offset_ahead", "tether: reconnected; the screen is redrawn (offset_ahead)\n"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			host := newFakePTYHost(t)
			c := startAttach(t, host, merged)
			p := host.accept(t, c)
			p.snapshot("e1", 0, "initial", "")
			p.output("old")
			c.stdout.waitFor(t, "old")
			p.drop()
			p = host.accept(t, c)
			p.snapshot("e2", 50, tc.reason, "NEW")
			p.output("live")
			c.stdout.waitFor(t, "live")
			p.closeWith(4410, "")
			c.wait(t)
			want := "tether: attached; Enter ~. to detach\n" + "old" +
				"tether: connection lost, reconnecting…\n" +
				tc.line + "NEW" + "live" + "tether: session ended (4410)\n"
			if got := c.stdout.String(); got != want {
				t.Errorf("terminal %q\nwant     %q", got, want)
			}
		})
	}
}

// TestAttachRawStatusLines: in raw mode a status line starts a line of
// its own, unless the screen was just cleared and nothing drawn.
func TestAttachRawStatusLines(t *testing.T) {
	host := newFakePTYHost(t)
	c := startAttach(t, host, func(a *attachClient) {
		merged(a)
		a.raw = true
	})
	p := host.accept(t, c)
	p.snapshot("e1", 0, "initial", "")
	p.output("$ ")
	c.stdout.waitFor(t, "$ ")
	p.drop()
	p = host.accept(t, c)
	p.replay("e1", 0, 2, false, "resume")
	p.closeWith(4410, "")
	c.wait(t)
	want := "tether: attached; Enter ~. to detach\r\n" + "$ " +
		"\r\ntether: connection lost, reconnecting…\r\n" +
		"\r\ntether: reconnected\r\n" +
		"\r\ntether: session ended (4410)\r\n"
	if got := c.stdout.String(); got != want {
		t.Errorf("terminal %q\nwant     %q", got, want)
	}
}

// TestAttachReplayQueriesRemoved: queries in replayed bytes (a raw replay
// split anywhere, a snapshot) never reach the terminal; live output's
// pass, also in the frame where the replay ends.
func TestAttachReplayQueriesRemoved(t *testing.T) {
	host := newFakePTYHost(t)
	c := startAttach(t, host, nil)
	p := host.accept(t, c)
	// A snapshot holds none by contract; one that does loses them too.
	p.snapshot("e1", 0, "initial", "\x1b[1mA"+qDA+"\x1b[m")
	p.output("B" + qCPR) // live: the program asks now
	c.stdout.waitFor(t, "B"+qCPR)
	p.drop()

	// Resumed: [3, 3+len) replays bytes with queries split across
	// frames; the last frame carries the replay's end and live bytes.
	p = host.accept(t, c)
	p.wantQuery(map[string]string{"attach": testAttachToken, "token": "sekrit", "offset": "5", "epoch": "e1"})
	replay := "C" + queries + "D\x1b[" + "6n" + "E"
	live := qDA + "F"
	p.replay("e1", 0, 5+int64(len(replay)), false, "resume")
	p.output(replay[:3])
	p.output(replay[3:9])
	p.output(replay[9 : len(replay)-4])
	p.output(replay[len(replay)-4:] + live)
	c.stdout.waitFor(t, "F")
	p.closeWith(4410, "")
	c.wait(t)
	want := "\x1b[1mA\x1b[m" + "B" + qCPR + "CDE" + qDA + "F"
	if got := c.stdout.String(); got != want {
		t.Errorf("stdout %q\nwant   %q", got, want)
	}
}

// TestAttachQuerySplitByADrop: a query cut by a drop in the middle of a
// replay is still found when the resumed replay brings its end.
func TestAttachQuerySplitByADrop(t *testing.T) {
	host := newFakePTYHost(t)
	c := startAttach(t, host, nil)
	p := host.accept(t, c)
	p.replay("e1", 0, 9, true, "initial") // an old host: raw replay
	p.output("ab\x1b]11;")
	p.drop()
	p = host.accept(t, c)
	p.wantQuery(map[string]string{"attach": testAttachToken, "token": "sekrit", "offset": "7", "epoch": "e1"})
	p.replay("e1", 0, 9, false, "resume")
	p.output("?\x07c")
	c.stdout.waitFor(t, "c")
	p.closeWith(4410, "")
	c.wait(t)
	if got, want := c.stdout.String(), "abc"; got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
}

// TestAttachResetDropsHeldBytes: the unfinished sequence a drop cut
// belongs to a screen a reset redraws: it is not written.
func TestAttachResetDropsHeldBytes(t *testing.T) {
	host := newFakePTYHost(t)
	c := startAttach(t, host, nil)
	p := host.accept(t, c)
	p.replay("e1", 0, 9, true, "initial")
	p.output("ab\x1b]11;")
	p.drop()
	p = host.accept(t, c)
	p.snapshot("e2", 0, "epoch_mismatch", "NEW")
	p.output("live")
	c.stdout.waitFor(t, "live")
	p.closeWith(4410, "")
	c.wait(t)
	if got, want := c.stdout.String(), "ab"+"NEWlive"; got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
}

// TestAttachSnapshotCutShort: a connection lost in the middle of a
// snapshot leaves half a screen: the next attachment asks for a fresh
// one (no cursor) and draws it on a cleared terminal.
func TestAttachSnapshotCutShort(t *testing.T) {
	host := newFakePTYHost(t)
	c := startAttach(t, host, nil)
	p := host.accept(t, c)
	p.snapshot("e1", 40, "initial", "")
	p.drop()
	// The first attachment above got a whole (empty) snapshot; this one
	// gets 4 of 10 bytes.
	p = host.accept(t, c)
	p.wantQuery(map[string]string{"attach": testAttachToken, "token": "sekrit", "offset": "40", "epoch": "e1"})
	if err := wsutil.WriteServerText(p.conn, []byte(`{"type":"pty.replay","epoch":"e1","start_offset":40,"replay_end_offset":40,"reset":true,"reason":"offset_ahead","snapshot":true,"snapshot_bytes":10,"cols":80,"rows":24}`)); err != nil {
		t.Fatal(err)
	}
	p.output("half")
	c.stdout.waitFor(t, "half")
	p.drop()
	p = host.accept(t, c)
	p.wantQuery(map[string]string{"attach": testAttachToken, "token": "sekrit"})
	p.snapshot("e1", 40, "initial", "whole")
	p.closeWith(4410, "")
	c.wait(t)
	if got, want := c.stdout.String(), "half"+"whole"; got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
}

// TestAttachEndOfInput: when stdin ends, what it held is sent and the
// client detaches (1000, status 0) once the output has settled.
func TestAttachEndOfInput(t *testing.T) {
	for _, early := range []bool{false, true} {
		name := "while attached"
		if early {
			name = "before attaching"
		}
		t.Run(name, func(t *testing.T) {
			host := newFakePTYHost(t)
			c := startAttach(t, host, func(a *attachClient) { a.settle = 50 * time.Millisecond })
			if early {
				c.typeIn(t, "echo hi\n~")
				_ = c.stdin.Close()
			}
			p := host.accept(t, c)
			p.snapshot("e1", 0, "initial", "")
			if !early {
				c.typeIn(t, "echo hi\n")
				c.typeIn(t, "~")
				_ = c.stdin.Close()
			}
			var got string
			for got != "echo hi\n~" {
				op, msg := p.read()
				if op != ws.OpBinary {
					t.Fatalf("got %v %q, want input", op, msg)
				}
				got += msg
			}
			p.output("echo hi\r\nhi\r\n")
			if code := p.readClose(); code != ws.StatusNormalClosure {
				t.Errorf("close code %d, want 1000", code)
			}
			if code := c.wait(t); code != 0 {
				t.Errorf("exit status %d, want 0", code)
			}
			if got, want := c.stderr.String(), "tether: attached; Enter ~. to detach\ntether: end of input: detached\n"; got != want {
				t.Errorf("stderr %q, want %q", got, want)
			}
		})
	}
}

// TestAttachEndOfInputEndsItsShell: with --new and stdin not a terminal,
// the end of stdin is sent as the end of input for the PTY's program
// (^D at the start of a line; two after a partial line), so a shell fed
// a script ends with it; a PTY this command did not make (no --new),
// or stdin that is a terminal, gets no ^D.
func TestAttachEndOfInputEndsItsShell(t *testing.T) {
	for _, tc := range []struct {
		name       string
		fresh, eoi bool
		in, want   string
	}{
		{"new, piped", true, true, "echo x\n", "echo x\n\x04"},
		{"new, piped, partial line", true, true, "echo x", "echo x\x04\x04"},
		{"joined, piped", false, true, "echo x\n", "echo x\n"},
		{"new, terminal", true, false, "echo x\n", "echo x\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := newFakePTYHost(t)
			c := startAttach(t, host, func(a *attachClient) {
				a.settle = 50 * time.Millisecond
				a.fresh, a.endOfInput = tc.fresh, tc.eoi
			})
			p := host.accept(t, c)
			p.snapshot("e1", 0, "initial", "")
			c.typeIn(t, tc.in)
			_ = c.stdin.Close()
			var got string
			for len(got) < len(tc.want) {
				op, msg := p.read()
				if op != ws.OpBinary {
					t.Fatalf("got %v %q, want input %q", op, msg, tc.want)
				}
				got += msg
			}
			if got != tc.want {
				t.Fatalf("the PTY got %q, want %q", got, tc.want)
			}
			p.closeWith(4410, "")
			if code := c.wait(t); code != 0 {
				t.Errorf("exit status %d, want 0", code)
			}
		})
	}
}

// TestAttachEndOfInputBounded: output that never settles does not keep
// the client past the bound.
func TestAttachEndOfInputBounded(t *testing.T) {
	host := newFakePTYHost(t)
	c := startAttach(t, host, func(a *attachClient) {
		a.settle = time.Second
		a.settleMax = 200 * time.Millisecond
	})
	p := host.accept(t, c)
	p.snapshot("e1", 0, "initial", "")
	start := time.Now()
	_ = c.stdin.Close()
	stop := make(chan struct{})
	printed := make(chan struct{})
	go func() { // a program that keeps printing, faster than the settle time
		defer close(printed)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if wsutil.WriteServerBinary(p.conn, []byte("tick ")) != nil {
					return
				}
			}
		}
	}()
	code := p.readClose()
	close(stop)
	<-printed
	if code != ws.StatusNormalClosure {
		t.Errorf("close code %d, want 1000", code)
	}
	if exit := c.wait(t); exit != 0 {
		t.Errorf("exit status %d, want 0", exit)
	}
	if d := time.Since(start); d < 1200*time.Millisecond {
		t.Errorf("detached after %v, before settle + bound (1.2s)", d)
	}
	if got := c.stderr.String(); !strings.HasSuffix(got, "tether: end of input: detached; the output had not settled 1.2s after it\n") {
		t.Errorf("stderr %q, want the not-settled line", got)
	}
}

func TestAttachSettleFlag(t *testing.T) {
	var stderr strings.Builder
	a, _ := parseAttach([]string{testAttachToken}, &stderr)
	if a == nil || a.settle != 300*time.Millisecond || a.settleMax != 10*time.Second {
		t.Fatalf("defaults: %+v, stderr %q", a, stderr.String())
	}
	a, _ = parseAttach([]string{"--settle", "2s", testAttachToken}, &stderr)
	if a == nil || a.settle != 2*time.Second {
		t.Fatalf("--settle 2s: %+v, stderr %q", a, stderr.String())
	}
	if a, code := parseAttach([]string{"--settle", "0s", testAttachToken}, &stderr); a != nil || code != 2 || !strings.Contains(stderr.String(), "--settle must be positive") {
		t.Errorf("--settle 0s: client %v, status %d, stderr %q", a != nil, code, stderr.String())
	}
}
