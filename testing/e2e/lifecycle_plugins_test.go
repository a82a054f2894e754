package e2e_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
)

// TestLifecyclePluginsCommands drives `tether plugins` against a running
// host: list (one line per plugin with pid, uptime, restarts, state,
// version, connections), stop pty (every PTY socket gets 4410, the plugin
// exits, its record goes, /api/pty answers 1011) and reload pty (a fresh
// plugin).
func TestLifecyclePluginsCommands(t *testing.T) {
	checkNoLeaks(t)
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", counter, "--admin-listen", "127.0.0.1:0"}})
	c := ptyDial(t, s, "attach="+attachToken(t))
	replayOf(t, c)
	if err := c.WaitOutput(ctxT(t, 10*time.Second), func(b []byte) bool { return lastNumber(b) >= 3 }); err != nil {
		t.Fatal(err)
	}
	wsPID := pluginPID(t, s, 1)
	rec := readPTYRecord(t, s.StateDir)

	list := pluginsList(t, s.StateDir)
	ws, pty := list["ws"], list["pty"]
	if ws.Kind != "transport" || ws.PID != fmt.Sprint(wsPID) || ws.State != "running" || ws.Restarts != "0" || ws.Version == "-" || ws.Conns != "1" {
		t.Errorf("plugins list ws: %+v, want transport pid %d running, 0 restarts, a version, 1 connection", ws, wsPID)
	}
	if pty.Kind != "backend" || pty.PID != fmt.Sprint(rec.PID) || pty.State != "running" || pty.Restarts != "0" || pty.Conns != "1" || !strings.Contains(pty.Notes, "ptys=1") {
		t.Errorf("plugins list pty: %+v, want backend pid %d running with 1 PTY and 1 connection", pty, rec.PID)
	}
	if _, err := time.ParseDuration(ws.Uptime); err != nil {
		t.Errorf("plugins list ws uptime %q: %v", ws.Uptime, err)
	}
	if got := s.Metric(t, "tether_ptys"); got != 1 {
		t.Errorf("tether_ptys: got %v, want 1", got)
	}
	// The screen rebuilds are a counter (it keeps the rebuilds of PTYs
	// gone); this slow counter program's model never falls behind.
	if _, body := s.AdminGet(t, "/metrics"); !strings.Contains(body, "# TYPE tether_pty_screen_rebuilds counter\n") {
		t.Errorf("/metrics has no counter tether_pty_screen_rebuilds:\n%s", body)
	}
	if got := s.Metric(t, "tether_pty_screen_rebuilds"); got != 0 {
		t.Errorf("tether_pty_screen_rebuilds: got %v, want 0", got)
	}

	// The state dir may come from TETHER_STATE_DIR, and "list" is the
	// default.
	cmd := exec.Command(e2e.Build(t), "plugins")
	cmd.Env = append(os.Environ(), "TETHER_STATE_DIR="+s.StateDir)
	if out, err := cmd.CombinedOutput(); err != nil || !bytes.Contains(out, []byte("ws  ")) || !bytes.Contains(out, []byte(fmt.Sprint(rec.PID))) {
		t.Errorf("TETHER_STATE_DIR=… tether plugins: %v\n%s", err, out)
	}
	if _, errOut, code := e2e.Tether(t, "plugins", "stop", "nope", "--state-dir", s.StateDir); code != 1 || !strings.Contains(errOut, `no plugin named "nope"`) {
		t.Errorf("plugins stop nope: exit %d %q, want 1 and no plugin named", code, errOut)
	}
	// A second host on the same state dir refuses to start, and leaves
	// the running one's plugins alone.
	if _, errOut, code := e2e.Tether(t, "serve", "--listen", "127.0.0.1:0", "--state-dir", s.StateDir); code != 1 || !strings.Contains(errOut, "is in use by pid") {
		t.Errorf("a second serve on the state dir: exit %d %q, want 1 and a message that it is in use by pid N", code, errOut)
	}
	if got := readPTYRecord(t, s.StateDir); got != rec || !pidAlive(rec.PID) {
		t.Errorf("the PTY plugin after a refused second host: %+v, want %+v alive", got, rec)
	}

	if out, errOut, code := e2e.Tether(t, "plugins", "stop", "pty", "--state-dir", s.StateDir); code != 0 {
		t.Fatalf("plugins stop pty: exit %d\n%s%s", code, out, errOut)
	}
	if code := closeCode(t, c); code != 4410 {
		t.Errorf("PTY socket after plugins stop pty: closed with %d, want 4410", code)
	}
	waitPIDGone(t, rec.PID, 5*time.Second)
	if _, err := os.Stat(recordFile(s.StateDir)); !os.IsNotExist(err) {
		t.Errorf("reattach record after plugins stop pty: %v, want it removed", err)
	}
	if p := pluginsList(t, s.StateDir)["pty"]; p.State != "stopped" || p.PID != "-" {
		t.Errorf("plugins list pty after stop: %+v, want stopped with no pid", p)
	}
	c2 := ptyDial(t, s, "attach="+attachToken(t))
	if code := closeCode(t, c2); code != 1011 {
		t.Errorf("/api/pty with the PTY plugin stopped: closed with %d, want 1011", code)
	}

	if out, errOut, code := e2e.Tether(t, "plugins", "reload", "pty", "--state-dir", s.StateDir); code != 0 {
		t.Fatalf("plugins reload pty: exit %d\n%s%s", code, out, errOut)
	}
	fresh := readPTYRecord(t, s.StateDir)
	if fresh.PID == rec.PID || !pidAlive(fresh.PID) {
		t.Fatalf("record after reload pty: %+v, want a fresh live plugin", fresh)
	}
	c3 := ptyDial(t, s, "attach="+attachToken(t))
	if r := replayOf(t, c3); r.Reason != "initial" {
		t.Errorf("attach after reload pty: %+v, want an initial replay", r)
	}
	if _, errOut, code := e2e.Tether(t, "plugins", "reload", "pty", "--state-dir", s.StateDir); code != 1 || !strings.Contains(errOut, "stop it first") {
		t.Errorf("plugins reload pty while it runs: exit %d %q, want 1 and stop it first", code, errOut)
	}
}

// TestLifecyclePTYPluginOutlivesSIGTERM: without --stop-ptys, SIGTERM ends
// the host but not the PTY plugin; the next host reattaches to it and the
// PTY resumes where its client left it. With no host running, `tether
// plugins stop pty` stops the plugin by its record.
func TestLifecyclePTYPluginOutlivesSIGTERM(t *testing.T) {
	checkNoLeaks(t)
	args := []string{"--pty-command", counter}
	s1 := e2e.Start(t, e2e.Config{Args: args})
	tok := attachToken(t)
	c := ptyDial(t, s1, "attach="+tok)
	epoch := replayOf(t, c).Epoch
	if err := c.WaitOutput(ctxT(t, 10*time.Second), func(b []byte) bool { return lastNumber(b) >= 10 }); err != nil {
		t.Fatal(err)
	}
	rec := readPTYRecord(t, s1.StateDir)
	if err := s1.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := s1.Wait(5 * time.Second); err != nil || code != 0 {
		t.Fatalf("host exit: %d, %v; want 0 within 5 s", code, err)
	}
	if code := closeCode(t, c); code != 1001 {
		t.Errorf("PTY socket at shutdown: %d, want 1001", code)
	}
	stream := c.Output()
	if !pidAlive(rec.PID) {
		t.Fatalf("the PTY plugin (pid %d) exited with its host", rec.PID)
	}

	s2 := e2e.Start(t, e2e.Config{Args: args, StateDir: s1.StateDir})
	if p := pluginsList(t, s2.StateDir)["pty"]; p.PID != fmt.Sprint(rec.PID) || !strings.Contains(p.Notes, "reattached") {
		t.Errorf("plugins list pty on the new host: %+v, want pid %d reattached", p, rec.PID)
	}
	c = ptyDial(t, s2, fmt.Sprintf("attach=%s&offset=%d&epoch=%s", tok, len(stream), epoch))
	if r := replayOf(t, c); r.Reset || r.Reason != "resume" || r.Epoch != epoch {
		t.Fatalf("reattach on the new host: %+v, want resume of epoch %s", r, epoch)
	}
	target := lastNumber(stream) + 20
	if err := c.WaitOutput(ctxT(t, 10*time.Second), func(b []byte) bool {
		return lastNumber(append(stream[:len(stream):len(stream)], b...)) >= target
	}); err != nil {
		t.Fatal(err)
	}
	c.Drop()
	sequenceOK(t, append(stream, c.Output()...))

	// No host: `tether plugins stop pty` goes by the record.
	if err := s2.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := s2.Wait(5 * time.Second); err != nil || code != 0 {
		t.Fatalf("second host exit: %d, %v; want 0", code, err)
	}
	out, errOut, code := e2e.Tether(t, "plugins", "stop", "pty", "--state-dir", s2.StateDir)
	if code != 0 || !strings.Contains(out, "no host is running") || !strings.Contains(out, fmt.Sprint(rec.PID)) {
		t.Errorf("plugins stop pty with no host: exit %d\n%s%s", code, out, errOut)
	}
	waitPIDGone(t, rec.PID, 5*time.Second)
	if _, err := os.Stat(recordFile(s2.StateDir)); !os.IsNotExist(err) {
		t.Errorf("reattach record: %v, want it removed", err)
	}
}

// TestLifecycleStopPTYs: with --stop-ptys, SIGTERM stops the PTY plugin
// too, and removes its record.
func TestLifecycleStopPTYs(t *testing.T) {
	checkNoLeaks(t)
	s := e2e.Start(t, e2e.Config{Args: []string{"--stop-ptys", "--pty-command", counter}})
	c := ptyDial(t, s, "attach="+attachToken(t))
	replayOf(t, c)
	rec := readPTYRecord(t, s.StateDir)
	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := s.Wait(5 * time.Second); err != nil || code != 0 {
		t.Fatalf("host exit: %d, %v; want 0 within 5 s", code, err)
	}
	waitPIDGone(t, rec.PID, 5*time.Second)
	if _, err := os.Stat(recordFile(s.StateDir)); !os.IsNotExist(err) {
		t.Errorf("reattach record after --stop-ptys: %v, want it removed", err)
	}
}
