package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host"
	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/ptyclient"
	"github.com/tether-agent/tether/testing/wsclient"
)

// fakeTransportEnv makes the test binary serve a fake transport plugin
// instead of running tests (TestMain checks it).
const fakeTransportEnv = "TETHER_E2E_FAKE_TRANSPORT"

// serveFakeTransport serves the fake transport named kind: "crash" starts
// fine and exits with status 3 as soon as the host links it — a transport
// that crashes in a loop.
func serveFakeTransport(kind string) {
	switch kind {
	case "crash":
		contract.ServeTransport(crashTransport{})
	case "flood":
		// The plugin's own stderr, as real plugins keep it: once serving,
		// go-plugin replaces os.Stderr with a stream the host ignores.
		contract.ServeTransport(floodTransport{stderr: os.Stderr})
	default:
		fmt.Fprintf(os.Stderr, "unknown fake transport %q\n", kind)
		os.Exit(2)
	}
}

// crashTransport is a transport that dies when linked.
type crashTransport struct{}

func (crashTransport) Start(context.Context, contract.StartRequest) (contract.StartResponse, error) {
	return contract.StartResponse{Addr: "crash:nowhere", Version: "crash-1"}, nil
}

func (crashTransport) Link(context.Context, contract.EventSink) error {
	os.Exit(3)
	return nil
}

func (crashTransport) Exec(context.Context, []contract.Command) error { return nil }

func (crashTransport) Stop(context.Context, contract.StopRequest) error { return nil }

// floodTransport writes floodLines lines to its stderr when started,
// then serves nothing until the host lets go of it.
type floodTransport struct {
	crashTransport
	stderr *os.File
}

// floodLines is how many stderr lines the flood transport writes.
const floodLines = 20000

func (f floodTransport) Start(context.Context, contract.StartRequest) (contract.StartResponse, error) {
	w := bufio.NewWriterSize(f.stderr, 1<<16)
	for i := range floodLines {
		fmt.Fprintf(w, "{\"level\":\"info\",\"message\":\"flood line %d\"}\n", i)
	}
	w.Flush()
	return contract.StartResponse{Addr: "flood:nowhere", Version: "flood-1"}, nil
}

func (floodTransport) Link(ctx context.Context, _ contract.EventSink) error {
	<-ctx.Done()
	return ctx.Err()
}

// fakeTransportScript writes a plugin script that runs this test binary
// as the fake transport kind.
func fakeTransportScript(t *testing.T, kind string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), kind+".sh")
	body := fmt.Sprintf("#!/bin/sh\n%s=%s exec %s \"$@\"\n", fakeTransportEnv, kind, self)
	if err := os.WriteFile(p, []byte(body), 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

// pluginsJSON runs `tether plugins list --json` on dir.
func pluginsJSON(t *testing.T, dir string) map[string]host.PluginStatus {
	t.Helper()
	out, errOut, code := e2e.Tether(t, "plugins", "list", "--json", "--state-dir", dir)
	if code != 0 {
		t.Fatalf("tether plugins list --json: exit %d\n%s", code, errOut)
	}
	var ps []host.PluginStatus
	if err := json.Unmarshal([]byte(out), &ps); err != nil {
		t.Fatalf("tether plugins list --json printed %q: %v", out, err)
	}
	m := map[string]host.PluginStatus{}
	for _, p := range ps {
		m[p.Name] = p
	}
	return m
}

// TestLifecycleTransportCrashLoop: an added transport that crashes every
// time it is linked is restarted with backoff and, after
// --plugin-restart-limit failures in a row, marked failed and left alone;
// `tether plugins` shows it failed with its restarts and why, while ws
// keeps serving sessions untouched. A reload gives it a fresh start (and
// it fails again the same way).
func TestLifecycleTransportCrashLoop(t *testing.T) {
	checkNoLeaks(t)
	crash := fakeTransportScript(t, "crash")
	s := e2e.Start(t, e2e.Config{Args: []string{
		"--plugin-restart-limit", "3",
		"--plugin", "transport:crashy=" + crash,
		"--transport-listen", "crashy=127.0.0.1:0",
	}})
	c := s.Dial(t)
	ctx := context.Background()
	var snap struct {
		SessionID string `json:"session_id"`
	}
	if err := c.Call(ctx, "session.create", map[string]any{"title": "beside a crashing transport"}, &snap); err != nil {
		t.Fatal(err)
	}

	waitLogLine(t, s, "transport plugin keeps failing; marked failed, not restarted (tether plugins reload to try again)", map[string]any{"plugin": "crashy"})
	ps := pluginsJSON(t, s.StateDir)
	cr, ws := ps["crashy"], ps["ws"]
	if cr.State != "failed" || cr.Restarts != 3 || cr.Pid != 0 || !strings.Contains(cr.LastError, "3 times in a row") {
		t.Errorf("crashy: %+v, want state failed, 3 restarts, no pid, and a last error saying 3 times in a row", cr)
	}
	if ws.State != "running" || ws.Restarts != 0 || ws.Connections != 1 {
		t.Errorf("ws: %+v, want running, 0 restarts, 1 connection", ws)
	}
	if line := pluginsList(t, s.StateDir)["crashy"]; line.State != "failed" || line.Restarts != "3" {
		t.Errorf("tether plugins list: crashy line %+v, want state failed and 3 restarts", line)
	}

	// The ws client never noticed; new clients are served.
	var out struct {
		Events []json.RawMessage `json:"events"`
	}
	if err := c.Call(ctx, "session.events.since", map[string]any{"session_id": snap.SessionID, "last_seen": 0}, &out); err != nil {
		t.Fatalf("the ws client's session after the crash loop: %v", err)
	}
	if status, _ := s.Get(t, "/healthz"); status != 200 {
		t.Errorf("/healthz: %d, want 200", status)
	}
	c2 := s.Dial(t)
	if err := c2.Call(ctx, "session.activate", map[string]any{"session_id": snap.SessionID}, nil); err != nil {
		t.Errorf("a new ws client: %v", err)
	}

	// A reload starts it afresh: three more failures, failed again.
	if _, errOut, code := e2e.Tether(t, "plugins", "reload", "crashy", "--state-dir", s.StateDir); code != 0 {
		t.Fatalf("plugins reload crashy: exit %d\n%s", code, errOut)
	}
	waitFor(t, func() bool {
		p := pluginsJSON(t, s.StateDir)["crashy"]
		return p.State == "failed" && p.Restarts == 6
	}, "crashy failed again after 6 restarts in all")
}

// waitFor polls cond (the state of another process) until it holds.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(50 * time.Millisecond) // polling the host's plugin list
	}
}

// TestLifecycleTransportLoadRefused: `tether plugins load` and `unload`
// refuse what they cannot do with a clear error, and the host keeps
// serving: a transport that does not answer the handshake within
// --plugin-start-timeout (killed, not added), a checksum mismatch, a
// name that is taken or malformed, another kind, unloading the primary,
// the PTY backend or an unknown name.
func TestLifecycleTransportLoadRefused(t *testing.T) {
	checkNoLeaks(t)
	bin := e2e.Build(t)
	dir := t.TempDir()
	silent := filepath.Join(dir, "silent.sh")
	if err := os.WriteFile(silent, []byte("#!/bin/sh\nexec sleep 60\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "ws.sh")
	if err := os.WriteFile(good, []byte(fmt.Sprintf("#!/bin/sh\nexec %s plugin ws \"$@\"\n", bin)), 0o700); err != nil {
		t.Fatal(err)
	}
	s := e2e.Start(t, e2e.Config{Args: []string{"--plugin-start-timeout", "500ms"}})
	c := s.Dial(t)

	tests := []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"handshake timeout", []string{"load", "transport:silent=" + silent}, 1, []string{"handshake timed out", "500ms", silent}},
		{"checksum", []string{"load", "transport:other=" + good + "#" + strings.Repeat("ab", 32), "--listen", "127.0.0.1:0"}, 1, []string{"checksum"}},
		{"primary name", []string{"load", "transport:ws=" + good}, 2, []string{"primary transport"}},
		{"bad name", []string{"load", "transport:Bad/Name=" + good}, 2, []string{"bad transport name"}},
		{"backend kind", []string{"load", "backend:x=" + good}, 2, []string{"only transports"}},
		{"no name", []string{"load", "transport=" + good}, 2, []string{"transport:NAME=PATH"}},
		{"unload primary", []string{"unload", "ws"}, 1, []string{"cannot be unloaded", "reload"}},
		{"unload pty", []string{"unload", "pty"}, 1, []string{"PTY backend"}},
		{"unload unknown", []string{"unload", "nope"}, 1, []string{"no transport of that name"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"plugins"}, tt.args...)
			_, errOut, code := e2e.Tether(t, append(args, "--state-dir", s.StateDir)...)
			if code != tt.code {
				t.Errorf("tether %s: exit %d, want %d\n%s", strings.Join(tt.args, " "), code, tt.code, errOut)
			}
			for _, w := range tt.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("tether %s: the error does not say %q:\n%s", strings.Join(tt.args, " "), w, errOut)
				}
			}
		})
	}

	// A second transport of the same name is refused while the first
	// serves; nothing refused was added.
	if _, errOut, code := e2e.Tether(t, "plugins", "load", "transport:web2="+good, "--listen", "127.0.0.1:0", "--state-dir", s.StateDir); code != 0 {
		t.Fatalf("load web2: exit %d\n%s", code, errOut)
	}
	_, errOut, code := e2e.Tether(t, "plugins", "load", "transport:web2="+good, "--listen", "127.0.0.1:0", "--state-dir", s.StateDir)
	if code != 1 || !strings.Contains(errOut, "a transport of that name is loaded") {
		t.Errorf("second load of web2: exit %d %q, want 1 and \"a transport of that name is loaded\"", code, errOut)
	}
	ps := pluginsJSON(t, s.StateDir)
	if len(ps) != 3 || ps["web2"].State != "running" || ps["ws"].State != "running" {
		t.Errorf("plugins after the refusals: %+v, want ws, web2 and pty only, running", ps)
	}
	if err := c.Call(context.Background(), "session.create", map[string]any{}, nil); err != nil {
		t.Errorf("the ws client after the refusals: %v", err)
	}
	if _, errOut, code := e2e.Tether(t, "plugins", "unload", "web2", "--state-dir", s.StateDir); code != 0 {
		t.Errorf("unload web2: exit %d\n%s", code, errOut)
	}
}

// TestLifecycleTransportUnloadKeepsPTY: a PTY attached through an added
// transport (a second WebSocket transport, loaded at runtime on its own
// port) is not lost when that transport is unloaded: the socket gets 1012,
// the PTY keeps running, and the client reattaches through ws with its
// offset and sees every byte once. The added transport's port is let go.
func TestLifecycleTransportUnloadKeepsPTY(t *testing.T) {
	checkNoLeaks(t)
	bin := e2e.Build(t)
	script := filepath.Join(t.TempDir(), "ws.sh")
	if err := os.WriteFile(script, []byte(fmt.Sprintf("#!/bin/sh\nexec %s plugin ws \"$@\"\n", bin)), 0o700); err != nil {
		t.Fatal(err)
	}
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", counter}})
	if _, errOut, code := e2e.Tether(t, "plugins", "load", "transport:web2="+script, "--listen", "127.0.0.1:0", "--state-dir", s.StateDir); code != 0 {
		t.Fatalf("load web2: exit %d\n%s", code, errOut)
	}
	addr := pluginsJSON(t, s.StateDir)["web2"].Addr
	if addr == "" || addr == s.Addr {
		t.Fatalf("web2 serves %q, want an address of its own", addr)
	}

	tok := attachToken(t)
	c, err := ptyclient.Dial(ctxT(t, 10*time.Second), "ws://"+addr+"/api/pty?attach="+tok+"&token="+s.Token)
	if err != nil {
		t.Fatalf("dial /api/pty on web2: %v", err)
	}
	t.Cleanup(c.Drop)
	epoch := replayOf(t, c).Epoch
	if err := c.WaitOutput(ctxT(t, 10*time.Second), func(b []byte) bool { return lastNumber(b) >= 10 }); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := e2e.Tether(t, "plugins", "unload", "web2", "--state-dir", s.StateDir); code != 0 {
		t.Fatalf("unload web2: exit %d\n%s", code, errOut)
	}
	if code := closeCode(t, c); code != 1012 {
		t.Errorf("the PTY socket on web2 after the unload: %d, want 1012", code)
	}
	stream := c.Output()

	c2 := ptyDial(t, s, fmt.Sprintf("attach=%s&offset=%d&epoch=%s", tok, len(stream), epoch))
	if r := replayOf(t, c2); r.Reset || r.Reason != "resume" || r.Epoch != epoch {
		t.Fatalf("reattach through ws: %+v, want a resume of epoch %s (the PTY survived)", r, epoch)
	}
	target := lastNumber(stream) + 20
	if err := c2.WaitOutput(ctxT(t, 10*time.Second), func(b []byte) bool {
		return lastNumber(append(stream[:len(stream):len(stream)], b...)) >= target
	}); err != nil {
		t.Fatal(err)
	}
	c2.Drop()
	sequenceOK(t, append(stream, c2.Output()...))

	if _, err := ptyclient.Dial(ctxT(t, 5*time.Second), "ws://"+addr+"/api/pty?attach="+tok+"&token="+s.Token); err == nil {
		t.Errorf("web2's port %s still answers after the unload", addr)
	}
}

// TestLifecycleTransportsFromFlagsAndSIGHUP: transports added with
// --plugin transport:NAME=PATH and --transport-listen start with the host,
// serve sessions beside ws (one session seen from both), and SIGHUP swaps
// every transport for a fresh process: their clients get 1012, and the
// session is resumed on either.
func TestLifecycleTransportsFromFlagsAndSIGHUP(t *testing.T) {
	checkNoLeaks(t)
	bin := e2e.Build(t)
	script := filepath.Join(t.TempDir(), "ws.sh")
	if err := os.WriteFile(script, []byte(fmt.Sprintf("#!/bin/sh\nexec %s plugin ws \"$@\"\n", bin)), 0o700); err != nil {
		t.Fatal(err)
	}
	s := e2e.Start(t, e2e.Config{Args: []string{
		"--plugin", "transport:web2=" + script + "#" + fileSum(t, script),
		"--transport-listen", "web2=127.0.0.1:0",
	}})
	before := pluginsJSON(t, s.StateDir)
	w2 := before["web2"]
	if w2.State != "running" || w2.Addr == "" || w2.Addr == s.Addr {
		t.Fatalf("web2 at start: %+v, want running on an address of its own", w2)
	}
	ctx := context.Background()
	c1 := s.Dial(t)
	c2, err := wsclient.Dial(ctxT(t, 10*time.Second), "ws://"+w2.Addr+"/api/ws", wsclient.Options{Token: s.Token})
	if err != nil {
		t.Fatalf("dial web2: %v", err)
	}
	t.Cleanup(func() { c2.Close() })
	var snap struct {
		SessionID  string `json:"session_id"`
		SessionKey string `json:"session_key"`
	}
	if err := c1.Call(ctx, "session.create", map[string]any{}, &snap); err != nil {
		t.Fatal(err)
	}
	if err := c2.Call(ctx, "session.activate", map[string]any{"session_id": snap.SessionID}, nil); err != nil {
		t.Fatal(err)
	}

	if err := s.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for i, c := range []*wsclient.Client{c1, c2} {
		select {
		case <-c.Closed():
		case <-time.After(10 * time.Second):
			t.Fatalf("client %d still open 10 s after SIGHUP", i)
		}
		if code, _ := c.CloseCode(); code != 1012 {
			t.Errorf("client %d closed with %d at SIGHUP, want 1012", i, code)
		}
	}
	after := pluginsJSON(t, s.StateDir)
	for _, name := range []string{"ws", "web2"} {
		if after[name].Pid == before[name].Pid || after[name].State != "running" {
			t.Errorf("%s after SIGHUP: %+v, want a fresh running process (was pid %d)", name, after[name], before[name].Pid)
		}
	}
	if after["web2"].Addr != w2.Addr {
		t.Errorf("web2 moved from %s to %s across the swap", w2.Addr, after["web2"].Addr)
	}
	c3, err := wsclient.Dial(ctxT(t, 10*time.Second), "ws://"+w2.Addr+"/api/ws", wsclient.Options{Token: s.Token})
	if err != nil {
		t.Fatalf("dial web2 after SIGHUP: %v", err)
	}
	t.Cleanup(func() { c3.Close() })
	var res struct {
		SessionID string `json:"session_id"`
	}
	if err := c3.Call(ctx, "session.resume", map[string]any{"session_id": snap.SessionKey}, &res); err != nil || res.SessionID != snap.SessionID {
		t.Errorf("resume on web2 after SIGHUP: %+v, %v; want the parked session %s", res, err, snap.SessionID)
	}
}
