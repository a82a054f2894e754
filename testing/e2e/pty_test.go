package e2e_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"

	"fmt"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/ptyclient"
	"github.com/tether-agent/tether/wire"
)

func attachToken(tb testing.TB) string {
	tb.Helper()
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// ptyDial connects to /api/pty with query (token added) and registers a
// cleanup that drops the connection.
func ptyDial(tb testing.TB, s *e2e.Server, query string) *ptyclient.Client {
	tb.Helper()
	c, err := ptyclient.Dial(ctxT(tb, 10*time.Second), s.WSURL("/api/pty?"+query))
	if err != nil {
		tb.Fatalf("dial /api/pty?%s: %v", query, err)
	}
	tb.Cleanup(c.Drop)
	return c
}

func replayOf(tb testing.TB, c *ptyclient.Client) wire.Replay {
	tb.Helper()
	r, err := c.Replay(ctxT(tb, 10*time.Second))
	if err != nil {
		tb.Fatalf("pty.replay: %v", err)
	}
	return r
}

func closeCode(tb testing.TB, c *ptyclient.Client) int {
	tb.Helper()
	code, _, err := c.CloseCode(ctxT(tb, 15*time.Second))
	if err != nil {
		tb.Fatalf("waiting for close: %v", err)
	}
	return code
}

// pidAlive reports whether pid exists (and is not a zombie we could see).
func pidAlive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

// waitPIDGone polls until pid no longer exists; it is waiting for the
// kernel to reap a killed process, not for our own code.
func waitPIDGone(tb testing.TB, pid int, within time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if !pidAlive(pid) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	tb.Fatalf("pid %d still alive after %v", pid, within)
}

var pidRe = regexp.MustCompile(`pid=(\d+)`)

func readPID(tb testing.TB, c *ptyclient.Client) int {
	tb.Helper()
	if err := c.WaitOutput(ctxT(tb, 10*time.Second), func(b []byte) bool { return pidRe.Match(b) }); err != nil {
		tb.Fatal(err)
	}
	pid, _ := strconv.Atoi(string(pidRe.FindSubmatch(c.Output())[1]))
	return pid
}

// counter prints a numbered line every 2 ms.
const counter = `sh -c 'i=0; while :; do i=$((i+1)); echo "n$i"; sleep 0.002; done'`

// lastNumber returns the last complete "nK" line number in b.
func lastNumber(b []byte) int {
	lines := bytes.Split(b, []byte("\r\n"))
	for i := len(lines) - 2; i >= 0; i-- {
		if n, err := strconv.Atoi(strings.TrimPrefix(string(lines[i]), "n")); err == nil && bytes.HasPrefix(lines[i], []byte("n")) {
			return n
		}
	}
	return 0
}

// TestPTYResumeExactlyOnce: a client reads a numbered stream, drops its
// TCP connection, reattaches with its offset and epoch, 50 times: the
// numbers continue with no gap and no repeat.
func TestPTYResumeExactlyOnce(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", counter}})
	tok := attachToken(t)
	var stream []byte
	c := ptyDial(t, s, "attach="+tok)
	r := replayOf(t, c)
	if !r.Reset || r.Reason != "initial" || r.StartOffset != 0 {
		t.Fatalf("first attach replay %+v, want reset initial from 0", r)
	}
	epoch := r.Epoch
	var offset int64
	for round := range 50 {
		target := lastNumber(stream) + 5
		if err := c.WaitOutput(ctxT(t, 10*time.Second), func(b []byte) bool { return lastNumber(append(stream[:len(stream):len(stream)], b...)) >= target }); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		c.Drop()
		got := c.Output()
		stream = append(stream, got...)
		offset += int64(len(got))

		c = ptyDial(t, s, fmt.Sprintf("attach=%s&offset=%d&epoch=%s", tok, offset, epoch))
		r = replayOf(t, c)
		if r.Reset || r.Reason != "resume" || r.Epoch != epoch {
			t.Fatalf("round %d: reattach at %d got %+v, want resume without reset", round, offset, r)
		}
	}
	c.Drop()
	stream = append(stream, c.Output()...)
	// Every line is n1, n2, n3, … in order: no gap, no repeat.
	lines := strings.Split(string(stream), "\r\n")
	for i, line := range lines[:len(lines)-1] {
		if want := fmt.Sprintf("n%d", i+1); line != want {
			t.Fatalf("line %d is %q, want %q (stream around it: %q)", i, line, want, lines[max(0, i-3):min(len(lines), i+3)])
		}
	}
	if len(lines) < 250 {
		t.Fatalf("only %d lines over 50 rounds", len(lines))
	}
}

// TestPTYOffsetRolledOut: with a small ring, a client that comes back after
// its offset left the ring gets the whole window with reset.
func TestPTYOffsetRolledOut(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", counter, "--pty-buffer", "1KiB"}})
	tok := attachToken(t)
	c := ptyDial(t, s, "attach="+tok)
	r := replayOf(t, c)
	if err := c.WaitOutput(ctxT(t, 10*time.Second), func(b []byte) bool { return len(b) >= 10 }); err != nil {
		t.Fatal(err)
	}
	c.Drop()
	offset := c.Received()
	// A viewer watches until the PTY has written well past the ring.
	v := ptyDial(t, s, "view=1&attach="+tok)
	vr := replayOf(t, v)
	if err := v.WaitOutput(ctxT(t, 10*time.Second), func(b []byte) bool { return vr.StartOffset+int64(len(b)) > offset+4096 }); err != nil {
		t.Fatal(err)
	}
	c2 := ptyDial(t, s, fmt.Sprintf("attach=%s&offset=%d&epoch=%s", tok, offset, r.Epoch))
	r2 := replayOf(t, c2)
	if !r2.Reset || r2.Reason != "offset_rolled_out" || r2.StartOffset <= offset || r2.ReplayEndOffset-r2.StartOffset > 1024 {
		t.Fatalf("rolled-out reattach got %+v, want reset offset_rolled_out with at most a 1 KiB window past %d", r2, offset)
	}
	for _, tc := range []struct{ query, reason string }{
		{fmt.Sprintf("offset=%d&epoch=other", offset), "epoch_mismatch"},
		{fmt.Sprintf("offset=%d&epoch=%s", 1<<40, r.Epoch), "offset_ahead"},
	} {
		c3 := ptyDial(t, s, "view=1&attach="+tok+"&"+tc.query)
		if r3 := replayOf(t, c3); !r3.Reset || r3.Reason != tc.reason {
			t.Errorf("%s: got %+v, want reset %s", tc.query, r3, tc.reason)
		}
	}
}

// TestPTYSupersede: a second writer closes the first with 4409; the
// first's input never reaches the PTY and its late close does not detach
// the second (a viewer keeps seeing output, the TTL does not reap it).
func TestPTYSupersede(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "sh", "--pty-ttl", "1s"}})
	tok := attachToken(t)
	a := ptyDial(t, s, "attach="+tok)
	replayOf(t, a)
	if err := a.Write([]byte("echo pid=$$\r")); err != nil {
		t.Fatal(err)
	}
	pid := readPID(t, a)
	b := ptyDial(t, s, "attach="+tok)
	replayOf(t, b)
	// A writes after B took over: dropped.
	_ = a.Write([]byte("echo A-MARK\r"))
	if code := closeCode(t, a); code != 4409 {
		t.Fatalf("superseded writer closed with %d, want 4409", code)
	}
	view := ptyDial(t, s, "view=1&attach="+tok)
	replayOf(t, view)
	if err := b.Write([]byte("echo B-MARK\r")); err != nil {
		t.Fatal(err)
	}
	if err := view.WaitOutput(ctxT(t, 10*time.Second), func(o []byte) bool { return bytes.Contains(o, []byte("B-MARK\r\n")) }); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // past the 1s TTL: the attached PTY must not be reaped
	if !pidAlive(pid) {
		t.Fatalf("PTY process %d reaped while the second writer is attached", pid)
	}
	if err := b.Write([]byte("echo C-MARK\r")); err != nil {
		t.Fatal(err)
	}
	if err := view.WaitOutput(ctxT(t, 10*time.Second), func(o []byte) bool { return bytes.Contains(o, []byte("C-MARK\r\n")) }); err != nil {
		t.Fatal(err)
	}
	for _, o := range [][]byte{b.Output(), view.Output()} {
		if bytes.Contains(o, []byte("A-MARK")) {
			t.Fatalf("the superseded writer's input reached the PTY: %q", o)
		}
	}
	// A view socket never writes.
	_ = view.Write([]byte("echo V-MARK\r"))
	_ = b.Write([]byte("echo D-MARK\r"))
	if err := b.WaitOutput(ctxT(t, 10*time.Second), func(o []byte) bool { return bytes.Contains(o, []byte("D-MARK\r\n")) }); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b.Output(), []byte("V-MARK")) {
		t.Fatalf("a view socket's input reached the PTY")
	}
}

// TestPTYExitAndLimits covers 4410 after all output, legacy sockets, TTL
// reaping, the cap (1011), resize and 4400.
func TestPTYExitAndLimits(t *testing.T) {
	t.Run("exit sends every byte then 4410", func(t *testing.T) {
		s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", `sh -c 'read x; seq 1 20000; exit 3'`}})
		c := ptyDial(t, s, "attach="+attachToken(t))
		replayOf(t, c)
		if err := c.Write([]byte("\r")); err != nil {
			t.Fatal(err)
		}
		if code := closeCode(t, c); code != 4410 {
			t.Fatalf("close code %d, want 4410", code)
		}
		var want strings.Builder
		for i := 1; i <= 20000; i++ {
			fmt.Fprintf(&want, "%d\r\n", i)
		}
		if out := string(c.Output()); !strings.HasSuffix(out, want.String()) {
			t.Fatalf("output (%d bytes) does not end with all 20000 lines; tail %q", len(out), out[max(0, len(out)-100):])
		}
	})

	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", `sh -c 'echo pid=$$; exec sleep 1000'`, "--pty-ttl", "1s", "--pty-max-sessions", "2"}})

	t.Run("legacy socket close kills the process group", func(t *testing.T) {
		c := ptyDial(t, s, "")
		r := replayOf(t, c)
		if !r.Reset || r.Reason != "initial" {
			t.Errorf("legacy replay %+v, want reset initial", r)
		}
		pid := readPID(t, c)
		c.Close()
		waitPIDGone(t, pid, 5*time.Second)
	})

	t.Run("ttl reaps a detached pty", func(t *testing.T) {
		c := ptyDial(t, s, "attach="+attachToken(t))
		replayOf(t, c)
		pid := readPID(t, c)
		c.Drop()
		waitPIDGone(t, pid, 10*time.Second)
	})

	t.Run("cap with every pty attached is 1011", func(t *testing.T) {
		a := ptyDial(t, s, "attach="+attachToken(t))
		replayOf(t, a)
		b := ptyDial(t, s, "attach="+attachToken(t))
		replayOf(t, b)
		c := ptyDial(t, s, "attach="+attachToken(t))
		if code := closeCode(t, c); code != 1011 {
			t.Fatalf("third pty with a cap of 2: close %d, want 1011", code)
		}
		// With one detached, a new token evicts it. The detach of a
		// dropped socket is asynchronous: retry while it is in flight.
		b.Drop()
		var d *ptyclient.Client
		deadline := time.Now().Add(5 * time.Second)
		for {
			d = ptyDial(t, s, "attach="+attachToken(t))
			r, err := d.Replay(ctxT(t, 10*time.Second))
			if err == nil && r.Reason == "initial" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("attach after a detach: %+v, %v; want a new pty evicting the detached one", r, err)
			}
			time.Sleep(20 * time.Millisecond) // waiting for the async detach
		}
		a.Close()
		d.Close()
	})

	t.Run("malformed attach is 4400", func(t *testing.T) {
		for _, q := range []string{"attach=short", "attach=" + strings.Repeat("x", 20) + "&offset=-4", "attach=" + strings.Repeat("y", 20) + "&offset=zz"} {
			c := ptyDial(t, s, q)
			if code := closeCode(t, c); code != 4400 {
				t.Errorf("%s: close %d, want 4400", q, code)
			}
		}
	})
}

// TestPTYResize: the resize escape resizes the PTY (stty size reports it)
// and its bytes never reach the child.
func TestPTYResize(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "sh"}})
	c := ptyDial(t, s, "attach="+attachToken(t))
	replayOf(t, c)
	if err := c.Resize(123, 45); err != nil {
		t.Fatal(err)
	}
	if err := c.Write([]byte("stty size\r")); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitOutput(ctxT(t, 10*time.Second), func(o []byte) bool { return bytes.Contains(o, []byte("45 123")) }); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(c.Output(), []byte("RESIZE")) {
		t.Fatalf("the resize escape reached the child: %q", c.Output())
	}
	if texts := c.Texts(); len(texts) != 0 {
		t.Errorf("unexpected text frames after pty.replay: %q", texts)
	}
}

// TestPTYBigReplay: a replay larger than a gRPC message's default limit
// (4 MiB) reaches the client whole, and the transport keeps serving.
func TestPTYBigReplay(t *testing.T) {
	const size = 6_000_000
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-buffer", "8MiB", "--pty-command", `sh -c 'head -c 6000000 /dev/zero | tr "\0" a; exec sleep 1000'`}})
	tok := attachToken(t)
	c := ptyDial(t, s, "attach="+tok)
	replayOf(t, c)
	if err := c.WaitOutput(ctxT(t, 30*time.Second), func(b []byte) bool { return len(b) >= size }); err != nil {
		t.Fatal(err)
	}
	c.Drop()
	// With its cursor at 0 the client gets the raw bytes [0, end).
	c2 := ptyDial(t, s, fmt.Sprintf("attach=%s&offset=0&epoch=%s", tok, replayOf(t, c).Epoch))
	r := replayOf(t, c2)
	if r.Reset || r.ReplayEndOffset-r.StartOffset != size {
		t.Fatalf("replay window %+v, want %d bytes", r, size)
	}
	if err := c2.WaitOutput(ctxT(t, 30*time.Second), func(b []byte) bool { return len(b) >= size }); err != nil {
		t.Fatal(err)
	}
	if got := c2.Output(); len(got) != size || bytes.Count(got, []byte("a")) != size {
		t.Fatalf("replay of %d bytes, want %d of 'a'", len(got), size)
	}
	s.Dial(t) // the transport still serves
	if strings.Contains(s.Stderr.String(), "larger than max") {
		t.Fatal("a gRPC message over the limit was refused")
	}
}
