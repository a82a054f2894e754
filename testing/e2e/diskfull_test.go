package e2e_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/wsclient"
)

// mountTmpfs mounts a tmpfs of size on a new directory, or skips the test
// when this process may not mount (it needs root; CI runs as root).
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the disk-full test mounts a small tmpfs and needs root (CI runs it as root); the fault-injecting unit tests in host/internal/session cover the same paths")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v: %s); the fault-injecting unit tests in host/internal/session cover the same paths", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fill writes a file in dir until the file system is full.
func fill(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte("x"), 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling %s: %v", dir, err)
			}
			return path
		}
	}
}

// collector keeps every event a client receives, in order.
type collector struct {
	done chan struct{}
	mu   sync.Mutex
	got  []wsclient.Event
}

func collect(c *wsclient.Client) *collector {
	col := &collector{done: make(chan struct{})}
	go func() {
		defer close(col.done)
		for ev := range c.Events() {
			if ev.Type != "gateway.ready" {
				col.mu.Lock()
				col.got = append(col.got, ev)
				col.mu.Unlock()
			}
		}
	}()
	return col
}

// has reports whether an event matching ok was received.
func (col *collector) has(ok func(wsclient.Event) bool) bool {
	col.mu.Lock()
	defer col.mu.Unlock()
	for _, ev := range col.got {
		if ok(ev) {
			return true
		}
	}
	return false
}

// TestDiskFullForReal puts the state dir on a 4 MiB tmpfs and fills it
// while a session streams: the client is never sent an event that is
// not stored; prompt.submit answers 5003 while the disk is full; when
// room is made the withheld events arrive in seq order; and after a kill
// -9 and a restart the journal holds every event the client was sent,
// under the same epoch.
func TestDiskFullForReal(t *testing.T) {
	dir := mountTmpfs(t, "4m")
	s := e2e.Start(t, e2e.Config{StateDir: dir, Args: []string{"--pty-command", "", "--echo-delay", "2ms", "--orphan-grace", "0", "--admin-listen", "127.0.0.1:0"}})
	c := s.Dial(t)
	col := collect(c)
	var snap snapshot
	call(t, c, "session.create", map[string]any{"title": "on a full disk"}, &snap)
	words := strings.Repeat("word ", 400)
	call(t, c, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": words}, nil)

	filler := fill(t, dir)
	// Keep prompting until the host says the disk is full.
	deadline := time.Now().Add(30 * time.Second)
	refused := false
	for !refused && time.Now().Before(deadline) {
		err := c.Call(ctxT(t, 10*time.Second), "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": words}, nil)
		var re *client.Error
		switch {
		case errors.As(err, &re) && re.Code == 5003:
			refused = true
			if !strings.Contains(re.Message, "storage unavailable") {
				t.Errorf("5003 message %q does not say storage unavailable", re.Message)
			}
		case errors.As(err, &re) && re.Code == 4009:
			time.Sleep(20 * time.Millisecond) // a run is streaming: retry (its end may be withheld, so there is nothing to wait on)
		case err != nil:
			t.Fatalf("prompt.submit on a filling disk: %v", err)
		}
	}
	if !refused {
		t.Fatal("prompt.submit never answered 5003 on a full disk")
	}
	if s.Metric(t, "tether_store_errors_total") < 1 {
		t.Error("tether_store_errors_total did not count the failed writes")
	}
	// Reads keep working.
	var list struct {
		Sessions []json.RawMessage `json:"sessions"`
	}
	call(t, c, "session.list", nil, &list)

	// Room again: what was withheld arrives, in order, and runs finish.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// Writes are accepted again once the host's next commit succeeds.
	waitFor(t, func() bool {
		err := c.Call(ctxT(t, 10*time.Second), "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": "after"}, nil)
		var re *client.Error
		if err != nil && !(errors.As(err, &re) && (re.Code == 5003 || re.Code == 4009)) {
			t.Fatalf("prompt.submit after room was made: %v", err)
		}
		return err == nil
	}, "prompt.submit to be accepted after room was made")
	waitFor(t, func() bool {
		return col.has(func(ev wsclient.Event) bool {
			var p struct{ Text string }
			return ev.Type == "message.complete" && ev.Decode(&p) == nil && p.Text == "after"
		})
	}, "the answer to the prompt after the disk had room again")

	// And the disk fills again mid-run, then the host is killed.
	call(t, c, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": words}, nil)
	before := s.Metric(t, "tether_store_errors_total")
	fill(t, dir)
	waitFor(t, func() bool { return s.Metric(t, "tether_store_errors_total") > before }, "a commit to fail on the full disk")
	if err := s.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s.Wait(10 * time.Second)
	c.Drop()
	<-col.done
	for i, ev := range col.got {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d the client received has seq %d, want %d: in order, none missing", i, ev.Seq, i+1)
		}
	}
	if err := os.Remove(filepath.Join(dir, "filler")); err != nil {
		t.Fatal(err)
	}

	s2 := e2e.Start(t, e2e.Config{StateDir: dir, Args: []string{"--pty-command", ""}})
	c2 := s2.Dial(t)
	var back snapshot
	call(t, c2, "session.resume", map[string]any{"session_id": snap.SessionKey}, &back)
	var since struct {
		Events    []json.RawMessage `json:"events"`
		Epoch     string            `json:"epoch"`
		Truncated bool              `json:"truncated"`
	}
	call(t, c2, "session.events.since", map[string]any{"session_id": back.SessionID, "last_seen": 0}, &since)
	if since.Epoch != back.Epoch {
		t.Errorf("after the restart session.resume says epoch %s, session.events.since %s", back.Epoch, since.Epoch)
	}
	var lastSent uint64
	if n := len(col.got); n > 0 {
		lastSent = col.got[n-1].Seq
	}
	// Whatever the epoch, the session goes on after every seq the client
	// was sent: a seq it holds is never reused for another event.
	if back.LatestSeq < lastSent {
		t.Errorf("after the restart latest_seq is %d, below the %d the client was sent", back.LatestSeq, lastSent)
	}
	col2 := collect(c2)
	call(t, c2, "prompt.submit", map[string]any{"session_id": back.SessionID, "text": "after the restart"}, nil)
	waitFor(t, func() bool {
		return col2.has(func(ev wsclient.Event) bool {
			var p struct{ Text string }
			return ev.Type == "message.complete" && ev.Decode(&p) == nil && p.Text == "after the restart"
		})
	}, "the answer to a prompt after the restart")
	col2.mu.Lock()
	for _, ev := range col2.got {
		if ev.Seq <= lastSent {
			t.Errorf("after the restart %s has seq %d, a seq the client already holds (it was sent up to %d)", ev.Type, ev.Seq, lastSent)
		}
	}
	col2.mu.Unlock()
	// Every event the client was sent had been committed before it was
	// sent, so nothing it saw is lost and the epoch survives the kill.
	if since.Epoch != snap.Epoch {
		t.Fatalf("after kill -9 and restart the epoch changed (%s → %s): the journal lost events the client had been sent", snap.Epoch, since.Epoch)
	}
	if len(since.Events) < len(col.got) {
		t.Fatalf("after the restart the journal has %d events, the client had received %d under the same epoch", len(since.Events), len(col.got))
	}
	for i, ev := range col.got {
		var j struct {
			Type    string          `json:"type"`
			Seq     uint64          `json:"seq"`
			Payload json.RawMessage `json:"payload"`
		}
		if err := json.Unmarshal(since.Events[i], &j); err != nil {
			t.Fatal(err)
		}
		if j.Seq != ev.Seq || j.Type != ev.Type || !bytes.Equal(j.Payload, ev.Payload) {
			t.Errorf("event %d: the journal has %s %d %s, the client received %s %d %s", i, j.Type, j.Seq, j.Payload, ev.Type, ev.Seq, ev.Payload)
		}
	}
	t.Logf("%d events received, all in the journal after kill -9 and restart", len(col.got))
}

// TestDiskFullClose: session.close on a full disk that the host has not
// yet failed to write (the session idle) answers 5003, not
// {"closed": true}: the session is no longer live (a second close says
// so), and its end is stored once the disk has room.
func TestDiskFullClose(t *testing.T) {
	dir := mountTmpfs(t, "4m")
	s := e2e.Start(t, e2e.Config{StateDir: dir, Args: []string{"--pty-command", ""}})
	c := s.Dial(t)
	var snap snapshot
	call(t, c, "session.create", map[string]any{"title": "closed on a full disk"}, &snap)
	filler := fill(t, dir)
	err := c.Call(ctxT(t, 20*time.Second), "session.close", map[string]any{"session_id": snap.SessionID}, nil)
	var re *client.Error
	if !errors.As(err, &re) || re.Code != 5003 || !strings.Contains(re.Message, "storage unavailable") {
		t.Fatalf("session.close on a full disk: %v; want 5003 storage unavailable", err)
	}
	var again struct {
		Closed bool `json:"closed"`
	}
	call(t, c, "session.close", map[string]any{"session_id": snap.SessionID}, &again)
	if again.Closed {
		t.Error("a second close found the session live")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		var list struct {
			Sessions []struct {
				ID        string `json:"id"`
				EndReason string `json:"end_reason"`
			} `json:"sessions"`
		}
		call(t, c, "session.list", nil, &list)
		return len(list.Sessions) == 1 && list.Sessions[0].EndReason == "closed"
	}, "the session's end to be stored once the disk had room")
}
