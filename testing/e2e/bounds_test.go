package e2e_test

// Bounds per client (docs/PROTOCOL.md, "Resize" and "Durability"): a
// resize over --pty-max-size is dropped before it reaches the PTY
// plugin, and no resize a client may ask grows the plugin by more than
// the screen model's budget; a session's journal is bounded in bytes.
// The memory figures are the real plugin process's, built without -race
// (its shadow memory would multiply them).

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/ptyclient"
)

// boundsRSSGrowth is how much a resize may grow the PTY plugin: the
// model's budget is 64 MiB; the rest is the Go heap's slack.
const boundsRSSGrowth = 100 << 20

// procKB reads a "kB" field (VmRSS, VmHWM) of /proc/PID/status, in bytes.
func procKB(tb testing.TB, pid int, field string) int64 {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatalf("status of pid %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				tb.Fatalf("pid %d: %s %q: %v", pid, field, v, err)
			}
			return kb << 10
		}
	}
	tb.Fatalf("pid %d: no %s in /proc status", pid, field)
	return 0
}

// shellSays runs line in c's shell and waits for the output it prints
// after it, which must hold want; marker ends the wait (give it as shell
// arithmetic, $((1+1)), so that the echoed command line never matches).
func shellSays(tb testing.TB, c *ptyclient.Client, line, marker, want string) string {
	tb.Helper()
	from := len(c.Output())
	if err := c.Write([]byte(line + "; echo " + marker + "\r")); err != nil {
		tb.Fatal(err)
	}
	end := shellValue(marker)
	var got string
	err := c.WaitOutput(ctxT(tb, 20*time.Second), func(o []byte) bool {
		got = string(o[from:])
		return strings.Contains(got, end+"\r\n")
	})
	if err != nil {
		tb.Fatalf("%q: no %q after it: %v; got %q", line, end, err, got)
	}
	if !strings.Contains(got, want) {
		tb.Errorf("%q: got %q, want it to hold %q", line, got, want)
	}
	return got
}

// shellValue is what the shell prints for a marker like M$((1+1)).
func shellValue(marker string) string {
	prefix, arith, ok := strings.Cut(marker, "$((")
	if !ok {
		return marker
	}
	a, b, _ := strings.Cut(strings.TrimSuffix(arith, "))"), "+")
	x, _ := strconv.Atoi(a)
	y, _ := strconv.Atoi(b)
	return prefix + strconv.Itoa(x+y)
}

// TestBoundsPTYResize: on a real /api/pty socket, with the default
// largest size a 10000x10000 or a 1001x50 resize is dropped (counted;
// the shell keeps its size) and 300x100 is applied; with
// --pty-max-size 10000x10000 a 10000x10000 resize reaches the shell, and
// the screen model's budget, not a drop, keeps the plugin's growth under
// boundsRSSGrowth while the PTY keeps working and a snapshot has the
// model's size.
func TestBoundsPTYResize(t *testing.T) {
	bin := e2e.BuildPlain(t)
	t.Run("default largest 1000x1000", func(t *testing.T) {
		s := e2e.Start(t, e2e.Config{Binary: bin, Args: []string{"--pty-command", "sh", "--admin-listen", "127.0.0.1:0"}})
		c := ptyDial(t, s, "attach="+attachToken(t))
		replayOf(t, c)
		shellSays(t, c, "stty size", "A$((1+1))", "24 80")
		pid := readPTYRecord(t, s.StateDir).PID
		rss0, hwm0 := procKB(t, pid, "VmRSS"), procKB(t, pid, "VmHWM")
		for _, size := range [][2]int{{10000, 10000}, {1001, 50}, {50, 1001}} {
			if err := c.Resize(size[0], size[1]); err != nil {
				t.Fatal(err)
			}
		}
		shellSays(t, c, "stty size", "B$((1+1))", "24 80")
		if got := s.Metric(t, "tether_pty_bad_resizes_total"); got != 3 {
			t.Errorf("dropped resizes counted: %v, want 3", got)
		}
		if err := c.Resize(300, 100); err != nil {
			t.Fatal(err)
		}
		shellSays(t, c, "stty size", "C$((1+1))", "100 300")
		rss1, hwm1 := procKB(t, pid, "VmRSS"), procKB(t, pid, "VmHWM")
		t.Logf("PTY plugin: VmRSS %.1f -> %.1f MiB, VmHWM %.1f -> %.1f MiB", mib(rss0), mib(rss1), mib(hwm0), mib(hwm1))
		if rss1-rss0 > boundsRSSGrowth || hwm1-hwm0 > boundsRSSGrowth {
			t.Errorf("the PTY plugin grew by %.1f MiB (peak %.1f MiB), want under %d MiB", mib(rss1-rss0), mib(hwm1-hwm0), boundsRSSGrowth>>20)
		}
	})
	t.Run("largest 10000x10000", func(t *testing.T) {
		s := e2e.Start(t, e2e.Config{Binary: bin, Args: []string{"--pty-command", "sh", "--pty-max-size", "10000x10000"}})
		tok := attachToken(t)
		c := ptyDial(t, s, "attach="+tok)
		replayOf(t, c)
		shellSays(t, c, "stty size", "A$((1+1))", "24 80")
		pid := readPTYRecord(t, s.StateDir).PID
		rss0, hwm0 := procKB(t, pid, "VmRSS"), procKB(t, pid, "VmHWM")
		if err := c.Resize(10000, 10000); err != nil {
			t.Fatal(err)
		}
		shellSays(t, c, "stty size", "B$((1+1))", "10000 10000")
		// A snapshot makes the model take the new size now, if its
		// feeder has not yet.
		v := ptyDial(t, s, "attach="+tok+"&view=1")
		r := replayOf(t, v)
		if !r.Snapshot || r.Cols != 10000 || r.Rows != 13 {
			t.Errorf("snapshot of the 10000x10000 PTY: %+v; want one of the model's 10000x13", r)
		}
		snap, err := v.WaitSnapshot(ctxT(t, 20*time.Second))
		if err != nil || !bytes.Contains(snap, []byte("B2")) {
			t.Errorf("snapshot: %v, %d bytes; want it to show the last output (B2)", err, len(snap))
		}
		shellSays(t, c, "echo still here", "C$((1+1))", "still here")
		rss1, hwm1 := procKB(t, pid, "VmRSS"), procKB(t, pid, "VmHWM")
		t.Logf("PTY plugin: VmRSS %.1f -> %.1f MiB, VmHWM %.1f -> %.1f MiB", mib(rss0), mib(rss1), mib(hwm0), mib(hwm1))
		if rss1-rss0 > boundsRSSGrowth || hwm1-hwm0 > boundsRSSGrowth {
			t.Errorf("a 10000x10000 resize grew the PTY plugin by %.1f MiB (peak %.1f MiB), want under %d MiB", mib(rss1-rss0), mib(hwm1-hwm0), boundsRSSGrowth>>20)
		}
	})
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// TestBoundsFlags: a bad --pty-max-size or --journal-bytes-per-session
// (flag or TETHER_ variable) stops tether serve with exit 2 and a line
// saying what it wants (after the flags' usage, for a flag), before
// anything is made in the state dir.
func TestBoundsFlags(t *testing.T) {
	bin := e2e.Build(t)
	for _, tt := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"--pty-max-size", "10001x50"}, "", "want COLSxROWS, each 1-10000"},
		{[]string{"--pty-max-size", "80"}, "", "want COLSxROWS, each 1-10000"},
		{nil, "TETHER_PTY_MAX_SIZE=0x0", "TETHER_PTY_MAX_SIZE"},
		{[]string{"--journal-bytes-per-session", "12"}, "", "at least 1KiB"},
		{[]string{"--journal-bytes-per-session", "2TiB"}, "", "up to 1024GiB"},
		{nil, "TETHER_JOURNAL_BYTES_PER_SESSION=lots", "TETHER_JOURNAL_BYTES_PER_SESSION"},
	} {
		t.Run(strings.Join(append(tt.args, tt.env), " "), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", dir}, tt.args...)...)
			cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0")
			if tt.env != "" {
				cmd.Env = append(cmd.Env, tt.env)
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			if code := cmd.ProcessState.ExitCode(); code != 2 {
				t.Fatalf("exit %d (%v), want 2; stderr %q", code, err, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("stderr %q: want a line holding %q", stderr.String(), tt.want)
			}
			if _, err := os.Stat(dir); err == nil {
				t.Errorf("a refused start made the state dir %s", dir)
			}
		})
	}
}

// TestBoundsJournalBytes: sessions prompted with prompts of about 1 MiB
// (each journals ~2 MiB: the echo agent's one delta, and the answer) keep
// a journal of at most --journal-bytes-per-session in state.db, counted
// exactly, their newest event included; a client behind what is kept is
// told truncated, under the same epoch. (One session takes ten prompts;
// the one resumed takes three, so that its display history, which the
// resume sends whole, fits the 8 MiB send queue.)
func TestBoundsJournalBytes(t *testing.T) {
	const bound = 4 << 20
	s := e2e.Start(t, e2e.Config{Args: []string{"--journal-bytes-per-session", "4MiB"}})
	c := s.Dial(t)
	prompt := func(sid string, n int) {
		for i := range n {
			text := strings.Repeat(string(rune('a'+i)), 1_000_000)
			if err := c.Call(ctxT(t, 30*time.Second), "prompt.submit", map[string]any{"session_id": sid, "text": text}, nil); err != nil {
				t.Fatalf("prompt %d: %v", i, err)
			}
			if got, _ := waitComplete(t, c, sid); len(got) != len(text) {
				t.Fatalf("prompt %d answered %d bytes, want %d", i, len(got), len(text))
			}
		}
	}
	var many, few snapshot
	call(t, c, "session.create", nil, &many)
	prompt(many.SessionID, 10)
	call(t, c, "session.create", nil, &few)
	prompt(few.SessionID, 3)

	call(t, c, "session.close", map[string]any{"session_id": few.SessionID}, nil)
	var resumed snapshot
	call(t, c, "session.resume", map[string]any{"session_id": few.SessionKey}, &resumed)
	var since sinceResult
	if err := c.Call(ctxT(t, 30*time.Second), "session.events.since", map[string]any{"session_id": resumed.SessionID, "last_seen": 0}, &since); err != nil {
		t.Fatal(err)
	}
	evs := decodeEvents(t, since.Events)
	sent := 0
	for _, e := range since.Events {
		sent += len(e)
	}
	// The journal ends with the last answer, then the close's
	// session.closed.
	if !since.Truncated || since.Epoch != few.Epoch || len(evs) < 2 || evs[0].Seq == 1 || evs[len(evs)-1].Seq != since.LatestSeq ||
		evs[len(evs)-1].Type != "session.closed" || evs[len(evs)-2].Type != "message.complete" || len(evs[len(evs)-2].Payload.Text) != 1_000_000 || sent > bound {
		t.Fatalf("events since 0: truncated %v, epoch %s (was %s), %d events (%d bytes), latest %d; want truncated, the same epoch, at most %d bytes ending with the last answer and the close",
			since.Truncated, since.Epoch, few.Epoch, len(evs), sent, since.LatestSeq, bound)
	}
	_ = c.Close()
	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := s.Wait(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("stop: exit %d, %v", code, err)
	}

	ctx := context.Background()
	path := filepath.Join(s.StateDir, "state.db")
	st, err := store.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, sess := range []snapshot{many, few} {
		stored, first, last, err := st.EventsSince(ctx, sess.SessionKey, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		var sum int64
		for _, e := range stored {
			sum += int64(len(e.Params))
		}
		counted, err := st.JournalBytes(ctx, sess.SessionKey)
		if err != nil {
			t.Fatal(err)
		}
		got, err := st.GetSession(ctx, sess.SessionKey)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("session %s: journal events %d..%d, %.2f MiB (counted %.2f MiB)", sess.SessionKey, first, last, mib(sum), mib(counted))
		if sum > bound || counted != sum || last != got.LastSeq || first < 2 {
			t.Errorf("session %s in state.db: journal of %d bytes (counted %d), events %d..%d; want at most %d, counted exactly, up to the last seq %d",
				sess.SessionKey, sum, counted, first, last, bound, got.LastSeq)
		}
	}
	fi, err := os.Stat(path)
	if err == nil {
		t.Logf("state.db: %.1f MiB for 13 prompts of 1 MB (the display rows, 2 MB a prompt, are not the journal's)", mib(fi.Size()))
	}
}
