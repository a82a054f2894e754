package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/wsclient"
)

// healthArgs make the host ping its plugins often, so that a hung one is
// found within a second.
var healthArgs = []string{"--plugin-health-interval", "200ms", "--plugin-health-timeout", "300ms", "--admin-listen", "127.0.0.1:0"}

// hungBound is how soon after a SIGSTOP the host must have found the
// plugin unresponsive with healthArgs: a ping goes out within an
// interval and fails after the timeout, so interval + timeout (500 ms);
// twice that plus 2 s allows for a loaded machine and the race detector.
const hungBound = 2*(200*time.Millisecond+300*time.Millisecond) + 2*time.Second

// TestFaultHungTransport stops the WebSocket plugin with SIGSTOP: it is
// alive but answers nothing. The host's health ping finds it within
// interval + timeout, kills it and starts a fresh one; /healthz answers
// again, `tether plugins` and the metrics say why it was restarted, and a
// client resumes its parked session.
func TestFaultHungTransport(t *testing.T) {
	checkNoLeaks(t)
	s := e2e.Start(t, e2e.Config{Args: append([]string{"--orphan-grace", "0"}, healthArgs...)})
	c := s.Dial(t)
	var snap snapshot
	call(t, c, "session.create", map[string]any{"title": "beside a hung plugin"}, &snap)
	pid := pluginPID(t, s, 1)
	stopped := time.Now()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP ws plugin %d: %v", pid, err)
	}
	waitLogLine(t, s, "transport plugin did not answer its health ping in time; killing it to restart it", map[string]any{"plugin": "ws"})
	if took := time.Since(stopped); took > hungBound {
		t.Errorf("the hung ws plugin was found %v after SIGSTOP, want within %v (interval 200ms + timeout 300ms, with slack)", took, hungBound)
	}
	if newPID := pluginPID(t, s, 2); newPID == pid {
		t.Fatalf("ws plugin pid after the restart is still %d", pid)
	}
	if status, _ := s.Get(t, "/healthz"); status != 200 {
		t.Fatalf("/healthz after the restart: %d, want 200", status)
	}
	t.Logf("/healthz answered %v after SIGSTOP (interval 200ms + timeout 300ms)", time.Since(stopped))
	ws := pluginsJSON(t, s.StateDir)["ws"]
	if ws.State != "running" || ws.Restarts != 1 || ws.LastReason != "unresponsive" || !strings.Contains(ws.LastError, "unresponsive") {
		t.Errorf("plugins list ws: %+v, want running, 1 restart, last reason unresponsive", ws)
	}
	if got := s.Metric(t, "tether_plugin_restarts_total", "plugin=ws", "reason=unresponsive"); got != 1 {
		t.Errorf("tether_plugin_restarts_total{plugin=ws,reason=unresponsive} = %v, want 1", got)
	}
	if !s.HasMetric(t, "tether_plugin_restarts_total", "plugin=pty", "reason=crashed") {
		t.Error("tether_plugin_restarts_total{plugin=pty,reason=crashed} is missing; want it present from the start")
	} else if got := s.Metric(t, "tether_plugin_restarts_total", "plugin=pty", "reason=crashed"); got != 0 {
		t.Errorf("tether_plugin_restarts_total{plugin=pty,reason=crashed} = %v, want 0 (and present from the start)", got)
	}
	c2 := s.Dial(t)
	var back snapshot
	call(t, c2, "session.resume", map[string]any{"session_id": snap.SessionKey}, &back)
	if back.SessionID != snap.SessionID {
		t.Errorf("resumed %s, want the parked %s", back.SessionID, snap.SessionID)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		t.Errorf("the stopped plugin %d is still there", pid)
	}
}

// TestFaultHungPTYPlugin stops the PTY plugin with SIGSTOP: the host finds
// it unresponsive, kills it and starts a fresh one, and a terminal can be
// attached again (a fresh PTY: the old ones went with their plugin).
func TestFaultHungPTYPlugin(t *testing.T) {
	checkNoLeaks(t)
	s := e2e.Start(t, e2e.Config{Args: append([]string{"--pty-command", "cat"}, healthArgs...)})
	tok := attachToken(t)
	p := ptyDial(t, s, "attach="+tok)
	replayOf(t, p)
	p.Close()
	pid := ptyPluginPID(t, s.StateDir)
	stopped := time.Now()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP pty plugin %d: %v", pid, err)
	}
	waitLogLine(t, s, "pty backend did not answer its health ping in time; killing it to restart it", map[string]any{"plugin": "pty"})
	if took := time.Since(stopped); took > hungBound {
		t.Errorf("the hung pty plugin was found %v after SIGSTOP, want within %v (interval 200ms + timeout 300ms, with slack)", took, hungBound)
	} else {
		t.Logf("the hung pty plugin was found %v after SIGSTOP", took)
	}
	waitFor(t, func() bool {
		ps := pluginsJSON(t, s.StateDir)["pty"]
		return ps.State == "running" && ps.Pid != pid && ps.Pid != 0
	}, "a fresh pty plugin running")
	pty := pluginsJSON(t, s.StateDir)["pty"]
	if pty.Restarts != 1 || pty.LastReason != "unresponsive" {
		t.Errorf("plugins list pty: %+v, want 1 restart, reason unresponsive", pty)
	}
	if got := s.Metric(t, "tether_plugin_restarts_total", "plugin=pty", "reason=unresponsive"); got != 1 {
		t.Errorf("tether_plugin_restarts_total{plugin=pty,reason=unresponsive} = %v, want 1", got)
	}
	if !s.HasMetric(t, "tether_plugin_restarts_total", "plugin=pty", "reason=crashed") {
		t.Error("tether_plugin_restarts_total{plugin=pty,reason=crashed} is missing; want it present at 0")
	} else if got := s.Metric(t, "tether_plugin_restarts_total", "plugin=pty", "reason=crashed"); got != 0 {
		t.Errorf("tether_plugin_restarts_total{plugin=pty,reason=crashed} = %v, want 0: the restart was for unresponsiveness", got)
	}
	q := ptyDial(t, s, "attach="+tok)
	if r := replayOf(t, q); !r.Reset {
		t.Errorf("attach after the restart: %+v, want a reset replay of a fresh PTY", r)
	}
	if err := q.Write([]byte("after the restart\n")); err != nil {
		t.Fatal(err)
	}
	if err := q.WaitOutput(ctxT(t, 10*time.Second), func(out []byte) bool { return strings.Contains(string(out), "after the restart") }); err != nil {
		t.Fatalf("output of the fresh PTY: %v", err)
	}
}

// ptyPluginPID reads the PTY plugin's pid from its reattach record.
func ptyPluginPID(t *testing.T, dir string) int {
	t.Helper()
	var pid int
	waitFor(t, func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "plugins", "pty.json"))
		if err != nil {
			return false
		}
		_, err = fmt.Sscanf(string(b[strings.Index(string(b), `"pid":`)+6:]), "%d", &pid)
		return err == nil && pid > 0
	}, "the pty plugin's reattach record")
	return pid
}

// TestFaultPrimaryCrashLoopExits: a primary transport that fails its
// restart limit in a row takes the host down with exit status 3 (so a
// service manager restarts it whole) instead of leaving the port bound
// with nothing behind it.
func TestFaultPrimaryCrashLoopExits(t *testing.T) {
	checkNoLeaks(t)
	crash := fakeTransportScript(t, "crash")
	s := e2e.Start(t, e2e.Config{Args: []string{"--plugin-restart-limit", "3", "--plugin", "transport=" + crash}})
	code, err := s.Wait(20 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code != 3 {
		t.Fatalf("tether serve exited %d, want 3; stderr:\n%s", code, s.Stderr.Tail(20))
	}
	if lines := logLines(s, "shutting down: the primary transport keeps failing and nothing serves --listen"); len(lines) != 1 {
		t.Errorf("want one log line saying why the host exits; got %d\n%s", len(lines), s.Stderr.Tail(20))
	}
}

// TestFaultPrimaryWSKilledRepeatedly: the real built-in ws plugin,
// serving, is killed with SIGKILL each time it comes back; with
// --plugin-restart-limit 3 the third crash in a row takes the host down
// with exit status 3 and a log line saying why, and nothing holds the
// port afterwards.
func TestFaultPrimaryWSKilledRepeatedly(t *testing.T) {
	checkNoLeaks(t)
	s := e2e.Start(t, e2e.Config{Args: []string{"--plugin-restart-limit", "3", "--pty-command", ""}})
	var pids []int
	for n := 1; n <= 3; n++ {
		pid := pluginPID(t, s, n)
		if len(pids) > 0 && pid == pids[len(pids)-1] {
			t.Fatalf("kill %d: the ws plugin's pid is still %d", n, pid)
		}
		pids = append(pids, pid)
		if status, _ := s.Get(t, "/healthz"); status != http.StatusOK {
			t.Fatalf("before kill %d: /healthz %d, want 200", n, status)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill %d: SIGKILL ws plugin %d: %v", n, pid, err)
		}
	}
	code, err := s.Wait(20 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code != 3 {
		t.Fatalf("tether serve exited %d, want 3; stderr:\n%s", code, s.Stderr.Tail(20))
	}
	if lines := logLines(s, "shutting down: the primary transport keeps failing and nothing serves --listen"); len(lines) != 1 {
		t.Errorf("want one log line saying why the host exits; got %d\n%s", len(lines), s.Stderr.Tail(20))
	} else if e, _ := lines[0]["error"].(string); !strings.Contains(e, "failed 3 times in a row") {
		t.Errorf("the exit line's error %q does not say the plugin failed 3 times in a row", e)
	}
	if lines := logLines(s, "transport plugin keeps failing; marked failed, not restarted (tether plugins reload to try again)"); len(lines) != 1 || lines[0]["plugin"] != "ws" {
		t.Errorf("want one line saying the ws plugin was marked failed; got %v", lines)
	}
	for _, pid := range pids {
		waitPIDGone(t, pid, 5*time.Second)
	}
	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		t.Fatalf("the port %s is still held after the host exited: %v", s.Addr, err)
	}
	ln.Close()
}

// TestFaultTwoHostsOneStateDir starts two hosts on one state dir at the
// same instant, many times: exactly one serves each time, and the other
// exits 1 at once saying the state dir is in use by the first one's pid.
func TestFaultTwoHostsOneStateDir(t *testing.T) {
	checkNoLeaks(t)
	bin := e2e.Build(t)
	const rounds = 20
	for round := range rounds {
		dir := t.TempDir()
		type host struct {
			cmd         *exec.Cmd
			out, errOut e2e.Buffer
		}
		hosts := [2]*host{{}, {}}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, h := range hosts {
			h.cmd = exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--state-dir", dir, "--log-format", "json", "--pty-command", "")
			// A race-built host and plugin exit at once instead of
			// sleeping 1 s each (races are still reported, on stderr).
			h.cmd.Env = append(os.Environ(), "TETHER_TOKEN=two-hosts-test-token", "GORACE=atexit_sleep_ms=0")
			h.cmd.Stdout, h.cmd.Stderr = &h.out, &h.errOut
			h.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if err := h.cmd.Start(); err != nil {
					t.Errorf("start: %v", err)
				}
			}()
		}
		close(start)
		wg.Wait()
		// The loser exits by itself; then stop the winner.
		exited := make(chan int, 2)
		for i, h := range hosts {
			go func() {
				h.cmd.Wait()
				exited <- i
			}()
		}
		var loser int
		select {
		case loser = <-exited:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: neither host exited: both serve one state dir", round)
		}
		winner := hosts[1-loser]
		// The other one serves.
		waitFor(t, func() bool { return strings.Contains(winner.out.String(), "tether listening on http://") }, "the winner's listening line")
		if code := hosts[loser].cmd.ProcessState.ExitCode(); code != 1 {
			t.Errorf("round %d: the second host exited %d, want 1\n%s", round, code, hosts[loser].errOut.String())
		}
		want := fmt.Sprintf("is in use by pid %d", winner.cmd.Process.Pid)
		if !strings.Contains(hosts[loser].errOut.String(), want) {
			t.Errorf("round %d: the second host said %q, want it to say %q", round, hosts[loser].errOut.String(), want)
		}
		_ = winner.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = winner.cmd.Process.Kill()
			t.Fatalf("round %d: the serving host did not stop on SIGTERM", round)
		}
		if code := winner.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("round %d: the serving host exited %d on SIGTERM, want 0\n%s", round, code, winner.errOut.String())
		}
		for _, h := range hosts {
			if strings.Contains(h.errOut.String(), "WARNING: DATA RACE") {
				t.Errorf("round %d: a host reported a data race:\n%s", round, h.errOut.String())
			}
		}
	}
}

// TestFaultControlWithoutHost: with no host on a state dir, `tether
// plugins` says so (the lock file left by a host that is gone names no
// holder).
func TestFaultControlWithoutHost(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", ""}})
	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := s.Wait(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("host exit %d, %v", code, err)
	}
	_, errOut, code := e2e.Tether(t, "plugins", "list", "--state-dir", s.StateDir)
	if code == 0 || !strings.Contains(errOut, "no tether host is running") {
		t.Errorf("plugins list with no host: exit %d, %q; want an error saying no host runs", code, errOut)
	}
}

// TestFaultDamagedStateDB: a state.db with garbage pages after its header
// makes tether serve refuse to start (exit 1) with an error naming the
// file, instead of serving and failing every call; a 0-byte state.db
// next to an existing token file starts with a warning that history was
// not found.
func TestFaultDamagedStateDB(t *testing.T) {
	// A state dir with some history.
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", ""}})
	c := s.Dial(t)
	for i := range 50 {
		call(t, c, "session.create", map[string]any{"title": fmt.Sprintf("session %d %s", i, strings.Repeat("t", 500))}, nil)
	}
	c.Close()
	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := s.Wait(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("host exit %d, %v", code, err)
	}
	db := filepath.Join(s.StateDir, "state.db")
	b, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 3*4096 {
		t.Fatalf("state.db has %d bytes: too small to damage pages after the header", len(b))
	}
	for off := 4096; off+4096 <= len(b); off += 2 * 4096 {
		for i := range 4096 {
			b[off+i] = byte(i*31 + off/4096)
		}
	}
	if err := os.WriteFile(db, b, 0o600); err != nil {
		t.Fatal(err)
	}
	bin := e2e.Build(t)
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--state-dir", s.StateDir, "--pty-command", "", "--log-format", "json")
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	err = cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != 1 {
		t.Fatalf("tether serve on a damaged state.db: exit %d (%v), want 1\n%s", code, err, errOut.String())
	}
	if !strings.Contains(errOut.String(), db) || !strings.Contains(errOut.String(), "damaged") {
		t.Errorf("the refusal does not name the file and say it is damaged:\n%s", errOut.String())
	}

	// A 0-byte state.db on a state dir used before (it has a token file).
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"state.db-wal", "state.db-shm"} {
		os.Remove(filepath.Join(s.StateDir, f))
	}
	if err := os.WriteFile(filepath.Join(s.StateDir, "token"), []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s2 := e2e.Start(t, e2e.Config{StateDir: s.StateDir, Args: []string{"--pty-command", ""}})
	waitLogLine(t, s2, "state.db is empty on a state dir used before: starting with no history (restore it from a backup to get the sessions back)", map[string]any{"file": db})
}

// TestFaultPluginStderrFlood: a plugin writing 20,000 stderr lines at
// once has at most 1,000 a second re-emitted by the host, and the rest
// counted in a summary line, instead of flooding the host's log.
func TestFaultPluginStderrFlood(t *testing.T) {
	checkNoLeaks(t)
	flood := fakeTransportScript(t, "flood")
	started := time.Now()
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "", "--admin-listen", "127.0.0.1:0",
		"--plugin", "transport:flood=" + flood, "--transport-listen", "flood=127.0.0.1:0"}})
	waitLogLine(t, s, "plugin wrote more stderr lines than the limit; the rest of this second was dropped", map[string]any{"plugin": "flood"})
	// Each second's drops are summarised at its end: wait until every
	// line written is re-emitted or summarised (a loaded machine takes
	// more seconds to read them).
	var reemitted, dropped int
	count := func() {
		reemitted, dropped = 0, 0
		for _, l := range strings.Split(s.Stderr.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) != nil || m["plugin"] != "flood" {
				continue
			}
			if msg, _ := m["message"].(string); strings.HasPrefix(msg, "flood line ") {
				reemitted++
			}
			if n, ok := m["dropped"].(float64); ok {
				dropped += int(n)
			}
		}
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		if count(); reemitted+dropped >= floodLines || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // polling the host's log: no event says a summary is out
	}
	// At most 1,000 lines a second are re-emitted, and every line is
	// accounted for.
	if reemitted+dropped != floodLines {
		t.Errorf("re-emitted %d + dropped %d, want the %d written", reemitted, dropped, floodLines)
	}
	if reemitted < 1000 || reemitted > 1000*(1+int(time.Since(started)/time.Second)) {
		t.Errorf("%d flood lines re-emitted in %v, want 1,000 per second of flood at most", reemitted, time.Since(started))
	}
	if got := s.Metric(t, "tether_plugin_log_lines_dropped_total", "plugin=flood"); int(got) != dropped || dropped == 0 {
		t.Errorf("dropped: summary lines say %d, metric %v; want them equal and above 0", dropped, got)
	}
}

// TestFaultNoSocketsInTmp: go-plugin sockets are made in the state dir,
// not the system temp dir, and the socket of a plugin killed with -9 is
// removed when the host restarts it.
func TestFaultNoSocketsInTmp(t *testing.T) {
	checkNoLeaks(t)
	tmp := t.TempDir()
	s := e2e.Start(t, e2e.Config{Env: []string{"TMPDIR=" + tmp}, Args: []string{"--admin-listen", "127.0.0.1:0"}})
	pid := pluginPID(t, s, 1)
	sockets := func() []string {
		var out []string
		filepath.WalkDir(s.StateDir, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.Type()&os.ModeSocket != 0 && strings.HasPrefix(d.Name(), "plugin") {
				out = append(out, p)
			}
			return nil
		})
		return out
	}
	before := sockets()
	if len(before) != 2 {
		t.Errorf("go-plugin sockets in the state dir: %v, want 2 (ws and pty)", before)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	pluginPID(t, s, 2)
	waitFor(t, func() bool { return len(sockets()) == 2 }, "the killed plugin's socket to be removed (two sockets: the new ws and pty)")
	entries, _ := os.ReadDir(tmp)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "plugin") {
			t.Errorf("%s in the system temp dir: go-plugin sockets must live in the state dir", e.Name())
		}
	}
}

// TestFaultResizeNeverTyped: resize escapes that are malformed or out of
// range are dropped, never written to the shell: the terminal echoes
// every byte it is given, and none of them shows up.
func TestFaultResizeNeverTyped(t *testing.T) {
	checkNoLeaks(t)
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "cat"}})
	p := ptyDial(t, s, "attach="+attachToken(t))
	replayOf(t, p)
	for _, f := range []string{"\x1b[RESIZE:99999;99999]", "\x1b[RESIZE:0;24]", "\x1b[RESIZE:abc]", "\x1b[RESIZE:80;24", "\x1b[RESIZE:120;40]"} {
		if err := p.Write([]byte(f)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Write([]byte("marker\n")); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitOutput(ctxT(t, 10*time.Second), func(out []byte) bool { return strings.Count(string(out), "marker") >= 2 }); err != nil {
		t.Fatalf("the echo of the marker: %v", err)
	}
	if out := string(p.Output()); strings.Contains(out, "RESIZE") || strings.Contains(out, "99999") {
		t.Errorf("a resize escape reached the shell: output %q", out)
	}
}

// TestFaultViewNeverCreates: view=1 with a token that has no live PTY is
// closed with 4411 and starts no process; nor can it evict a detached
// PTY at the cap.
func TestFaultViewNeverCreates(t *testing.T) {
	checkNoLeaks(t)
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "cat", "--pty-max-sessions", "1", "--admin-listen", "127.0.0.1:0"}})
	owner := attachToken(t)
	p := ptyDial(t, s, "attach="+owner)
	replayOf(t, p)
	p.Close() // detached: the one PTY, evictable by a new writer
	v := ptyDial(t, s, "attach="+attachToken(t)+"&view=1")
	if code := closeCode(t, v); code != 4411 {
		t.Fatalf("view=1 of an unknown token: close %d, want 4411", code)
	}
	if n := s.Metric(t, "tether_ptys"); n != 1 {
		t.Errorf("live PTYs after the view attach: %v, want 1 (no new process, nothing evicted)", n)
	}
	back := ptyDial(t, s, "attach="+owner+"&view=1")
	if r := replayOf(t, back); r.Epoch == "" {
		t.Errorf("the detached PTY is gone after a view of another token: %+v", r)
	}
}

// copyFile copies the executable src to dst (mode 0755).
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestFaultRebuiltBinaryReattaches: a host run from binary path A is
// stopped, then a copy of it at path B (a rebuild, an upgrade, two `go
// run`s) starts on the same state dir: it reattaches to the same PTY
// plugin — the record names the plugin by a secret it proves, not by the
// binary's path — so the same PTY, with the same epoch, resumes byte
// exact, and one PTY plugin runs.
func TestFaultRebuiltBinaryReattaches(t *testing.T) {
	checkNoLeaks(t)
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a", "tether"), filepath.Join(dir, "b", "tether")
	for _, p := range []string{a, b} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		copyFile(t, e2e.Build(t), p)
	}
	state := t.TempDir()
	s1 := e2e.Start(t, e2e.Config{Binary: a, StateDir: state, Args: []string{"--pty-command", counter}})
	tok := attachToken(t)
	c := ptyDial(t, s1, "attach="+tok)
	epoch := replayOf(t, c).Epoch
	if err := c.WaitOutput(ctxT(t, 10*time.Second), func(b []byte) bool { return lastNumber(b) >= 20 }); err != nil {
		t.Fatal(err)
	}
	rec := readPTYRecord(t, state)
	if err := s1.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := s1.Wait(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("host A exit %d, %v", code, err)
	}
	<-c.Closed()
	offset := int64(len(c.Output()))

	s2 := e2e.Start(t, e2e.Config{Binary: b, StateDir: state, Args: []string{"--pty-command", counter}})
	waitLogLine(t, s2, "plugin reattached", map[string]any{"plugin": "pty", "pid": float64(rec.PID)})
	c2 := ptyDial(t, s2, fmt.Sprintf("attach=%s&offset=%d&epoch=%s", tok, offset, epoch))
	if r := replayOf(t, c2); r.Reset || r.Epoch != epoch {
		t.Fatalf("reattach through host B: %+v, want a resume of epoch %s", r, epoch)
	}
	if got := readPTYRecord(t, state); got.PID != rec.PID {
		t.Errorf("PTY plugin pid %d after host B started, want the same %d", got.PID, rec.PID)
	}
	if n := strings.Count(strings.Join(pgrepPlugins(t, dir), "\n"), "plugin pty"); n != 1 {
		t.Errorf("%d PTY plugins of this test run, want one: %q", n, pgrepPlugins(t, dir))
	}
}

// TestFaultUnreattachablePluginStopped: a PTY plugin left running with a
// live PTY whose record no longer matches it (here: the record's secret
// is not the one the process was given, as with a plugin of another
// tether version) cannot be reattached; the next host stops it and its
// PTYs instead of leaving them unreachable, and runs exactly one fresh
// PTY plugin.
func TestFaultUnreattachablePluginStopped(t *testing.T) {
	checkNoLeaks(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "tether")
	copyFile(t, e2e.Build(t), bin)
	state := t.TempDir()
	s1 := e2e.Start(t, e2e.Config{Binary: bin, StateDir: state, Args: []string{"--pty-command", "cat"}})
	c := ptyDial(t, s1, "attach="+attachToken(t))
	replayOf(t, c)
	rec := readPTYRecord(t, state)
	shells := childPIDs(t, rec.PID)
	if len(shells) != 1 {
		t.Fatalf("the PTY plugin %d has children %v, want the one PTY's shell", rec.PID, shells)
	}
	if err := s1.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := s1.Wait(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("host A exit %d, %v", code, err)
	}
	<-c.Closed()
	if !pidAlive(rec.PID) || !pidAlive(shells[0]) {
		t.Fatalf("the PTY plugin (%d) or its shell (%d) did not outlive host A", rec.PID, shells[0])
	}
	// The record keeps the real pid, start time and command line; only
	// the secret is wrong.
	b, err := os.ReadFile(recordFile(state))
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	if raw["secret"] == nil || raw["secret"] == "" {
		t.Fatalf("the record %s has no secret to change", b)
	}
	raw["secret"] = "0123456789abcdef0123456789abcdef"
	if b, err = json.Marshal(raw); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(recordFile(state), b, 0o600); err != nil {
		t.Fatal(err)
	}

	s2 := e2e.Start(t, e2e.Config{Binary: bin, StateDir: state, Args: []string{"--pty-command", "cat"}})
	waitLogLine(t, s2, "the recorded plugin is alive but cannot be reattached; stopping it and its PTYs", map[string]any{"plugin": "pty", "pid": float64(rec.PID)})
	waitPIDGone(t, rec.PID, 10*time.Second)
	waitPIDGone(t, shells[0], 10*time.Second)
	if got := readPTYRecord(t, state); got.PID == rec.PID || !pidAlive(got.PID) {
		t.Errorf("PTY plugin after host B started: pid %d (alive %v), want a fresh one, not %d", got.PID, pidAlive(got.PID), rec.PID)
	}
	if n := len(pgrepPlugins(t, dir)); n != 1 {
		t.Errorf("%d PTY plugins of this test run, want one: %q", n, pgrepPlugins(t, dir))
	}
	// The fresh plugin serves.
	q := ptyDial(t, s2, "attach="+attachToken(t))
	if r := replayOf(t, q); !r.Reset {
		t.Errorf("attach through host B: %+v, want a fresh PTY", r)
	}
	if err := q.Write([]byte("fresh\n")); err != nil {
		t.Fatal(err)
	}
	if err := q.WaitOutput(ctxT(t, 10*time.Second), func(out []byte) bool { return strings.Contains(string(out), "fresh") }); err != nil {
		t.Fatalf("output of the fresh PTY: %v", err)
	}
}

// childPIDs lists the processes whose parent is pid.
func childPIDs(tb testing.TB, pid int) []int {
	tb.Helper()
	var out []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		stat, err := os.ReadFile(filepath.Join(d, "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(pid) {
			continue
		}
		if n, err := strconv.Atoi(filepath.Base(d)); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// pgrepPlugins lists the command lines of running `tether plugin pty`
// processes started from binaries under dir (other tests and programs
// on the machine run theirs).
func pgrepPlugins(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cl := strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ")
		if strings.HasSuffix(cl, " plugin pty") && strings.HasPrefix(cl, dir+"/") {
			out = append(out, cl)
		}
	}
	return out
}

// TestFaultHostlessPluginExits: a PTY plugin left behind by its host with
// no PTY exits by itself after --pty-idle-exit, and `tether plugins stop
// pty` with no host stops one that still has PTYs and removes its record.
func TestFaultHostlessPluginExits(t *testing.T) {
	checkNoLeaks(t)
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "cat", "--pty-idle-exit", "1s"}})
	rec := readPTYRecord(t, s.StateDir)
	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := s.Wait(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("host exit %d, %v", code, err)
	}
	waitPIDGone(t, rec.PID, 15*time.Second)
	// It leaves nothing behind: its record and socket are gone, and
	// doctor finds the state dir sound.
	if _, err := os.Stat(recordFile(s.StateDir)); !os.IsNotExist(err) {
		t.Errorf("the record of the plugin that exited when idle is still there: %v", err)
	}
	if rec.Network != "unix" || rec.Address == "" {
		t.Fatalf("the record named %s %q, want a Unix socket", rec.Network, rec.Address)
	}
	if _, err := os.Stat(rec.Address); !os.IsNotExist(err) {
		t.Errorf("the socket of the plugin that exited when idle is still there: %v", err)
	}
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()
	if out, errOut, code := e2e.Tether(t, "doctor", "--state-dir", s.StateDir, "--listen", freeAddr); code != 0 {
		t.Errorf("tether doctor after the idle exit: exit %d, want 0\n%s%s", code, out, errOut)
	}

	// With a PTY it stays; `plugins stop pty` stops it.
	s2 := e2e.Start(t, e2e.Config{StateDir: s.StateDir, Args: []string{"--pty-command", "cat", "--pty-idle-exit", "1s"}})
	p := ptyDial(t, s2, "attach="+attachToken(t))
	replayOf(t, p)
	rec2 := readPTYRecord(t, s.StateDir)
	if err := s2.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := s2.Wait(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("host exit %d, %v", code, err)
	}
	if !pidAlive(rec2.PID) {
		t.Fatalf("the PTY plugin with a live PTY exited with its host")
	}
	out, errOut, code := e2e.Tether(t, "plugins", "stop", "pty", "--state-dir", s.StateDir)
	if code != 0 {
		t.Fatalf("plugins stop pty with no host: exit %d\n%s%s", code, out, errOut)
	}
	waitPIDGone(t, rec2.PID, 10*time.Second)
	if _, err := os.Stat(recordFile(s.StateDir)); !os.IsNotExist(err) {
		t.Errorf("the record of the stopped plugin is still there: %v", err)
	}
}

// TestFaultConnectionCap: past --max-connections open connections a new
// one gets HTTP 503 (counted), instead of hanging in the backlog; idle
// connections that never send their headers are closed after 10 s, which
// frees their places.
func TestFaultConnectionCap(t *testing.T) {
	checkNoLeaks(t)
	const limit = 10
	s := e2e.Start(t, e2e.Config{Args: []string{"--max-connections", fmt.Sprint(limit), "--pty-command", "",
		"--plugin-health-interval", "200ms", "--admin-listen", "127.0.0.1:0"}})
	var idle []net.Conn
	for range limit {
		c, err := net.Dial("tcp", s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
		defer c.Close()
	}
	get := func() (int, error) {
		c, err := net.DialTimeout("tcp", s.Addr, 5*time.Second)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", s.Addr)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	// The cap counts the idle ones once the plugin has accepted them.
	waitFor(t, func() bool { code, err := get(); return err == nil && code == 503 }, "HTTP 503 past the cap")
	waitFor(t, func() bool { return s.Metric(t, "tether_transport_refused_total", "plugin=ws") >= 1 }, "the refusal to be counted")
	// The idle connections sent no headers: closed after the header
	// timeout.
	started := time.Now()
	for _, c := range idle {
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Errorf("an idle connection got data instead of being closed")
		}
	}
	if d := time.Since(started); d > 15*time.Second {
		t.Errorf("idle connections closed after %v, want about 10 s", d)
	}
	if code, err := get(); err != nil || code != 200 {
		t.Errorf("after the idle connections were closed: %d, %v; want 200", code, err)
	}
}

// TestFaultHugeFrameClosesOnlyItsConnection: an answer larger than the
// plugin link can carry (70 MB, past the 64 MiB gRPC limit) closes its
// viewer with 1013 and nothing else: the transport plugin is not
// restarted, another client on it stays connected, the answer is stored,
// and a resume whose snapshot is as large is refused the same way while
// the host keeps serving.
func TestFaultHugeFrameClosesOnlyItsConnection(t *testing.T) {
	checkNoLeaks(t)
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", "", "--admin-listen", "127.0.0.1:0",
		"--agent", "exec", "--agent-command", `sh -c "head -c 70000000 /dev/zero | tr '\\0' a"`}})
	bystander := s.Dial(t)
	var other snapshot
	call(t, bystander, "session.create", map[string]any{"title": "bystander"}, &other)
	c := s.Dial(t)
	var snap snapshot
	call(t, c, "session.create", map[string]any{"title": "huge"}, &snap)
	call(t, c, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": "go"}, nil)
	select {
	case <-c.Closed():
	case <-time.After(2 * time.Minute):
		t.Fatal("the viewer of a 70 MB answer was not closed")
	}
	if code, reason := c.CloseCode(); code != 1013 {
		t.Fatalf("viewer closed with %d %q, want 1013", code, reason)
	}
	// The bystander's socket is the same plugin's: still there.
	var list json.RawMessage
	call(t, bystander, "session.list", map[string]any{}, &list)
	if got := s.Metric(t, "tether_plugin_restarts_total", "plugin=ws"); got != 0 {
		t.Fatalf("tether_plugin_restarts_total{plugin=ws} = %v, want 0", got)
	}
	// The run goes on without its viewer and its answer is stored.
	deadline := time.Now().Add(2 * time.Minute)
	for storedCount(t, bystander, snap.SessionKey) != 2 {
		if time.Now().After(deadline) {
			t.Fatal("the 70 MB answer was not stored in 2 minutes")
		}
		time.Sleep(50 * time.Millisecond) // polling the store: no event tells a bystander
	}
	// A resume of it (a 70 MB snapshot) is refused with 1013 too.
	again := s.Dial(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = again.Call(ctx, "session.resume", map[string]any{"session_id": snap.SessionKey}, nil)
	<-again.Closed()
	if code, _ := again.CloseCode(); code != 1013 {
		t.Fatalf("a resume with a 70 MB snapshot closed with %d, want 1013", code)
	}
	call(t, bystander, "session.list", map[string]any{}, &list)
	if got := s.Metric(t, "tether_plugin_restarts_total", "plugin=ws"); got != 0 {
		t.Fatalf("after the resume: tether_plugin_restarts_total{plugin=ws} = %v, want 0", got)
	}
}

// storedCount is the stored message count of key, from session.list.
func storedCount(t *testing.T, c *wsclient.Client, key string) int {
	t.Helper()
	var res struct {
		Sessions []struct {
			ID           string `json:"id"`
			MessageCount int    `json:"message_count"`
		} `json:"sessions"`
	}
	// A list may wait behind the store's write of a huge answer (tens of
	// MB into SQLite, seconds under -race): a generous bound per call.
	if err := c.Call(ctxT(t, time.Minute), "session.list", map[string]any{}, &res); err != nil {
		t.Fatalf("session.list: %v", err)
	}
	for _, s := range res.Sessions {
		if s.ID == key {
			return s.MessageCount
		}
	}
	return -1
}
