package e2e_test

import (
	"bufio"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/wsclient"
)

// TestShutdownInterruptsAndPersists: SIGTERM mid-run closes clients with
// 1001, exits 0 within 5 s, records the run as interrupted with exactly
// the text streamed, and a new host on the same state dir resumes it.
func TestShutdownInterruptsAndPersists(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--echo-delay", "100ms"}})
	c := s.Dial(t)
	var snap snapshot
	call(t, c, "session.create", map[string]any{"title": "shutdown"}, &snap)
	text := strings.Repeat("tick ", 100)
	call(t, c, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": text}, nil)
	streamed := ""
	for range 3 {
		ev, err := c.WaitEvent(ctxT(t, 5*time.Second), func(e wsclient.Event) bool { return e.Type == "message.delta" })
		if err != nil {
			t.Fatal(err)
		}
		var p struct{ Text string }
		_ = ev.Decode(&p)
		streamed += p.Text
	}
	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The run is interrupted while the client is still connected: it gets
	// message.complete "interrupted" with exactly the streamed text, then
	// the close.
	var final struct{ Text, Status string }
	for {
		ev, err := c.NextEvent(ctxT(t, 5*time.Second))
		if err != nil {
			break
		}
		var p struct{ Text, Status string }
		_ = ev.Decode(&p)
		switch ev.Type {
		case "message.delta":
			streamed += p.Text
		case "message.complete":
			final = p
		}
	}
	<-c.Closed()
	if code, _ := c.CloseCode(); code != 1001 {
		t.Errorf("close code on shutdown: got %d, want 1001", code)
	}
	code, err := s.Wait(5 * time.Second)
	if err != nil || code != 0 {
		t.Fatalf("exit: %d, %v; want 0 within 5s", code, err)
	}
	if final.Status != "interrupted" || final.Text != streamed {
		t.Errorf("message.complete %+v, want interrupted with the streamed %q", final, streamed)
	}

	s2 := e2e.Start(t, e2e.Config{StateDir: s.StateDir})
	c2 := s2.Dial(t)
	var list struct {
		Sessions []struct {
			ID        string `json:"id"`
			EndReason string `json:"end_reason"`
		} `json:"sessions"`
	}
	call(t, c2, "session.list", nil, &list)
	if len(list.Sessions) != 1 || list.Sessions[0].ID != snap.SessionKey || list.Sessions[0].EndReason != "shutdown" {
		t.Fatalf("stored after restart: %+v, want %s ended by shutdown", list.Sessions, snap.SessionKey)
	}
	var resumed snapshot
	call(t, c2, "session.resume", map[string]any{"session_id": snap.SessionKey}, &resumed)
	if len(resumed.Messages) != 2 || resumed.Messages[0].Text != text || resumed.Messages[1].Text != streamed {
		t.Fatalf("resumed messages %+v, want the prompt and the interrupted partial %q", resumed.Messages, streamed)
	}
	if resumed.LatestSeq < 5 {
		t.Errorf("resumed latest_seq %d, want seq to continue from the first host's", resumed.LatestSeq)
	}
}

// TestTransportPluginCrashParksSessions kills the WebSocket plugin
// process: its sockets drop, their sessions are parked (not closed), the
// supervisor restarts the plugin on the same address, and clients resume
// the same live session.
func TestTransportPluginCrashParksSessions(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--orphan-grace", "0", "--admin-listen", "127.0.0.1:0"}})
	c := s.Dial(t)
	var snap snapshot
	call(t, c, "session.create", map[string]any{"title": "survivor"}, &snap)

	pid := pluginPID(t, s, 1)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill plugin %d: %v", pid, err)
	}
	<-c.Closed()
	// A new plugin process serves the same address.
	newPID := pluginPID(t, s, 2)
	if newPID == pid {
		t.Fatalf("plugin pid after restart is still %d", pid)
	}
	c2 := s.Dial(t)
	var resumed snapshot
	call(t, c2, "session.resume", map[string]any{"session_id": snap.SessionKey}, &resumed)
	if resumed.SessionID != snap.SessionID {
		t.Fatalf("after a plugin crash resume got %s, want the parked %s", resumed.SessionID, snap.SessionID)
	}
	if got := s.Metric(t, "tether_plugin_restarts_total", "plugin=ws"); got != 1 {
		t.Errorf("tether_plugin_restarts_total{plugin=ws}: got %v, want 1", got)
	}
}

// pluginPID waits for the nth "plugin started" log line of the ws plugin
// and returns its pid.
func pluginPID(t *testing.T, s *e2e.Server, nth int) int {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		seen := 0
		sc := bufio.NewScanner(strings.NewReader(s.Stderr.String()))
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			var line struct {
				Message string `json:"message"`
				Plugin  string `json:"plugin"`
				PID     int    `json:"pid"`
			}
			if json.Unmarshal(sc.Bytes(), &line) != nil || line.Message != "plugin started" || line.Plugin != "ws" {
				continue
			}
			seen++
			if seen == nth {
				return line.PID
			}
		}
		time.Sleep(50 * time.Millisecond) // polling the child's log
	}
	t.Fatalf("no plugin started line #%d in stderr", nth)
	return 0
}

// TestSIGINTShutsDownCleanly: SIGINT is handled like SIGTERM (docs/PROTOCOL.md, section 8):
// clients get 1001 and the host exits 0 within 5 s.
func TestSIGINTShutsDownCleanly(t *testing.T) {
	s := e2e.Start(t, e2e.Config{})
	c := s.Dial(t)
	if err := s.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	<-c.Closed()
	if code, _ := c.CloseCode(); code != 1001 {
		t.Errorf("close code on SIGINT: got %d, want 1001", code)
	}
	if code, err := s.Wait(5 * time.Second); err != nil || code != 0 {
		t.Fatalf("exit after SIGINT: %d, %v; want 0 within 5s", code, err)
	}
}
