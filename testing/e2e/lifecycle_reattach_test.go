package e2e_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tether-agent/tether/testing/e2e"
)

// TestLifecyclePTYSurvivesHostKill kills the host with SIGKILL while a PTY
// streams a numbered sequence: the PTY plugin lives on (its own session),
// a new host on the same state dir reattaches to it, and a client that
// reattaches with its offset and epoch sees the sequence continue with no
// gap and no repeat.
func TestLifecyclePTYSurvivesHostKill(t *testing.T) {
	checkNoLeaks(t)
	args := []string{"--pty-command", counter}
	s1 := e2e.Start(t, e2e.Config{Args: args})
	tok := attachToken(t)
	c := ptyDial(t, s1, "attach="+tok)
	epoch := replayOf(t, c).Epoch
	if err := c.WaitOutput(ctxT(t, 10*time.Second), func(b []byte) bool { return lastNumber(b) >= 50 }); err != nil {
		t.Fatal(err)
	}
	rec := readPTYRecord(t, s1.StateDir)
	if info, err := os.Stat(recordFile(s1.StateDir)); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("reattach record mode: %v, %v; want 0600", info.Mode(), err)
	}
	if rec.Protocol != "grpc" || rec.Network != "unix" || filepath.Dir(rec.Address) != filepath.Join(s1.StateDir, "plugins") || rec.Started == 0 {
		t.Errorf("reattach record %+v: want grpc over a unix socket in the state dir's plugins/, with a start time", rec)
	}
	if sid, _ := unix.Getsid(rec.PID); sid != rec.PID {
		t.Errorf("PTY plugin %d is in session %d, want a session of its own", rec.PID, sid)
	}

	if err := s1.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	s1.Wait(5 * time.Second) // killed by SIGKILL: an error, as expected
	<-c.Closed()
	stream := c.Output()
	offset := int64(len(stream))
	if !pidAlive(rec.PID) {
		t.Fatalf("the PTY plugin (pid %d) died with its host", rec.PID)
	}
	time.Sleep(300 * time.Millisecond) // the sequence runs on with no host

	s2 := e2e.Start(t, e2e.Config{Args: args, StateDir: s1.StateDir})
	waitLogLine(t, s2, "plugin reattached", map[string]any{"plugin": "pty", "pid": rec.PID})
	if got := readPTYRecord(t, s2.StateDir); got != rec {
		t.Errorf("record after reattach %+v, want it unchanged %+v", got, rec)
	}
	target := lastNumber(stream) + 100
	for attempt := 0; lastNumber(stream) < target; attempt++ {
		if attempt == 5 {
			t.Fatalf("no %d lines after 5 reattaches", target)
		}
		c = ptyDial(t, s2, fmt.Sprintf("attach=%s&offset=%d&epoch=%s", tok, offset, epoch))
		r := replayOf(t, c)
		if r.Reset || r.Reason != "resume" || r.Epoch != epoch {
			t.Fatalf("reattach after the host restart at offset %d: got %+v, want resume of epoch %s without reset", offset, r, epoch)
		}
		err := c.WaitOutput(ctxT(t, 10*time.Second), func(b []byte) bool {
			return lastNumber(append(stream[:len(stream):len(stream)], b...)) >= target
		})
		c.Drop()
		got := c.Output()
		stream = append(stream, got...)
		offset += int64(len(got))
		if err != nil {
			// A socket may be closed (1013) when it attached before the
			// new host's output stream was up; it resumes like any.
			t.Logf("reattached socket ended (%v); reattaching with offset %d", err, offset)
		}
	}
	n := sequenceOK(t, stream)
	t.Logf("%d lines, n1..n%d, across the host's SIGKILL", n, n)
}

// TestLifecycleStaleRecord starts hosts on state dirs whose reattach
// record names no plugin of ours: a pid reused by another program (a
// running sleep, with its own start time, or with the record's start time
// off), and a dead pid. Each record is refused and removed with its socket
// file, the process it names is left alone, and a fresh plugin starts.
func TestLifecycleStaleRecord(t *testing.T) {
	checkNoLeaks(t)
	sleep := exec.Command("sleep", "120")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sleep.Process.Kill()
		sleep.Wait()
	})
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	sleepPID, sleepStart := sleep.Process.Pid, startTicks(t, sleep.Process.Pid)

	tests := []struct {
		name   string
		pid    int
		start  uint64
		reason string
	}{
		{"pid of another program", sleepPID, sleepStart, "not the plugin"},
		{"pid reused since", sleepPID, sleepStart + 1, "was reused"},
		{"dead pid", exited.Process.Pid, 12345, "is gone"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			plugins := filepath.Join(dir, "plugins")
			if err := os.MkdirAll(plugins, 0o700); err != nil {
				t.Fatal(err)
			}
			sock := filepath.Join(plugins, "plugin42")
			if err := os.WriteFile(sock, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			stale := fmt.Sprintf(`{"protocol":"grpc","network":"unix","address":%q,"pid":%d,"started":%d}`, sock, tt.pid, tt.start)
			if err := os.WriteFile(recordFile(dir), []byte(stale), 0o600); err != nil {
				t.Fatal(err)
			}

			s := e2e.Start(t, e2e.Config{StateDir: dir})
			line := waitLogLine(t, s, "stale reattach record removed; starting a fresh plugin", map[string]any{"plugin": "pty", "pid": tt.pid})
			if reason := fmt.Sprint(line["reason"]); !strings.Contains(reason, tt.reason) {
				t.Errorf("stale record reason %q, want it to say %q", reason, tt.reason)
			}
			if len(logLines(s, "plugin reattached")) != 0 {
				t.Errorf("the host reattached to a stale record")
			}
			if _, err := os.Stat(sock); !os.IsNotExist(err) {
				t.Errorf("the stale record's socket file %s: %v, want it removed", sock, err)
			}
			rec := readPTYRecord(t, dir)
			if rec.PID == tt.pid || !pidAlive(rec.PID) {
				t.Errorf("record after start %+v: want a fresh, live plugin", rec)
			}
			if !pidAlive(sleepPID) {
				t.Fatalf("the program behind the stale record (pid %d) was killed", sleepPID)
			}
			if p := pluginsList(t, dir)["pty"]; p.State != "running" || p.PID != fmt.Sprint(rec.PID) || strings.Contains(p.Notes, "reattached") {
				t.Errorf("plugins list pty: %+v, want a fresh running plugin %d", p, rec.PID)
			}
		})
	}
}
