package nodetransport

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
)

// TestHost loads the Node.js plugin into a real `tether serve` twice, as
// added transports (--plugin transport:NAME=PATH): "nodeunix" on its
// default address, unix:<state-dir>/nodeunix.sock, which it binds itself,
// and "nodetcp" on a TCP address, which the host binds and lends it as
// fd:3. A WebSocket client creates a session; a line client on each node
// transport activates it, and a prompt submitted on one is answered on
// all three. The host's access checks apply (a wrong token is 4401),
// `tether plugins` lists both with their version, and unloading one
// closes its client with 1012.
func TestHost(t *testing.T) {
	_, script := nodeScript(t)
	s := e2e.Start(t, e2e.Config{Args: []string{
		"--echo-delay", "10ms", "--pty-command", "",
		"--plugin", "transport:nodeunix=" + script,
		"--plugin", "transport:nodetcp=" + script,
		"--transport-listen", "nodetcp=127.0.0.1:0",
	}})
	unixAddr := "unix:" + filepath.Join(s.StateDir, "nodeunix.sock")
	tcpAddr := loadedAddr(t, s, "nodetcp")
	if strings.HasPrefix(tcpAddr, "unix:") || strings.HasSuffix(tcpAddr, ":0") {
		t.Fatalf("nodetcp serves %q, want the TCP address the host bound", tcpAddr)
	}

	// The plugin's JSON stderr lines come back through the host's log
	// with a plugin field, their level, message and fields.
	if l := waitHostLine(t, s, map[string]string{"plugin": "nodeunix", "message": "node transport listening"}); l["level"] != "info" || l["addr"] != unixAddr {
		t.Errorf("the host's re-emitted line of the plugin's start: %v, want level info and addr %s", l, unixAddr)
	}

	for _, addr := range []string{unixAddr, tcpAddr} {
		bad := dialLines(t, addr)
		bad.writeLine("TETHER token=wrong")
		if m := bad.next(); m["close"] != float64(4401) {
			t.Errorf("%s, wrong token: got %v, want the close line with 4401", addr, m)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := s.Dial(t)
	var snap struct {
		SessionID string `json:"session_id"`
	}
	if err := w.Call(ctx, "session.create", map[string]any{"title": "through node"}, &snap); err != nil {
		t.Fatal(err)
	}
	u := dialReady(t, unixAddr, s.Token)
	c := dialReady(t, tcpAddr, s.Token)
	u.call("session.activate", map[string]any{"session_id": snap.SessionID})
	c.call("session.activate", map[string]any{"session_id": snap.SessionID})

	res := u.call("prompt.submit", map[string]any{"session_id": snap.SessionID, "text": "hello from node"})
	if res["status"] != "streaming" {
		t.Fatalf("prompt.submit over nodeunix: %v, want status streaming", res)
	}
	for name, l := range map[string]*lines{"nodeunix": u, "nodetcp": c} {
		if p := l.untilEvent("message.complete"); p["text"] != "hello from node" || p["status"] != "complete" {
			t.Errorf("%s: message.complete %v, want the echo of the prompt", name, p)
		}
	}
	for {
		e, err := w.NextEvent(ctx)
		if err != nil {
			t.Fatalf("ws client: %v", err)
		}
		if e.Type == "message.complete" {
			break
		}
	}

	out, errOut, code := e2e.Tether(t, "plugins", "list", "--state-dir", s.StateDir)
	if code != 0 || strings.Count(out, "0.1.0-node") != 2 {
		t.Errorf("tether plugins list: exit %d, want both node transports with version 0.1.0-node:\n%s%s", code, out, errOut)
	}
	if out, errOut, code := e2e.Tether(t, "plugins", "unload", "nodetcp", "--state-dir", s.StateDir); code != 0 {
		t.Fatalf("tether plugins unload nodetcp: exit %d\n%s%s", code, out, errOut)
	}
	if got := c.untilClose(); got != 1012 {
		t.Errorf("the nodetcp client after the unload: close %d, want 1012", got)
	}
}

// loadedAddr returns the address transport name serves, from the host's
// "transport loaded" log line.
func loadedAddr(t *testing.T, s *e2e.Server, name string) string {
	t.Helper()
	addr, _ := waitHostLine(t, s, map[string]string{"message": "transport loaded", "plugin": name})["addr"].(string)
	return addr
}

// waitHostLine waits for a JSON line of the host's log with the fields
// want and returns it; it fails the test after 15 s.
func waitHostLine(t *testing.T, s *e2e.Server, want map[string]string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		for _, line := range strings.Split(s.Stderr.String(), "\n") {
			var l map[string]any
			if json.Unmarshal([]byte(line), &l) != nil {
				continue
			}
			ok := true
			for k, v := range want {
				ok = ok && l[k] == v
			}
			if ok {
				return l
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no host log line with %v within 15s:\n%s", want, s.Stderr.Tail(40))
		}
		time.Sleep(50 * time.Millisecond) // polling the child's log: it has no other signal
	}
}

// lines is a client of the line protocol whose reader runs in the
// background.
type lines struct {
	t      *testing.T
	nc     net.Conn
	in     chan map[string]any
	nextID int
}

// dialLines connects to addr ("unix:PATH" or HOST:PORT); the connection
// is closed at the end of the test.
func dialLines(t *testing.T, addr string) *lines {
	t.Helper()
	network, where := "tcp", addr
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, where = "unix", p
	}
	nc, err := net.DialTimeout(network, where, wait)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	_ = nc.SetDeadline(time.Now().Add(time.Minute))
	l := &lines{t: t, nc: nc, in: make(chan map[string]any, 1024)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(l.in)
		r := bufio.NewReader(nc)
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return
			}
			var m map[string]any
			if json.Unmarshal(line, &m) != nil {
				m = map[string]any{"unparsed": string(line)}
			}
			l.in <- m
		}
	}()
	t.Cleanup(func() {
		nc.Close()
		<-done
	})
	return l
}

// dialReady connects, sends the handshake with token and reads
// gateway.ready.
func dialReady(t *testing.T, addr, token string) *lines {
	t.Helper()
	l := dialLines(t, addr)
	l.writeLine("TETHER token=" + token)
	if m := l.next(); param(m, "type") != "gateway.ready" {
		t.Fatalf("%s: first line %v, want gateway.ready", addr, m)
	}
	return l
}

func (l *lines) writeLine(s string) {
	l.t.Helper()
	if _, err := fmt.Fprintf(l.nc, "%s\n", s); err != nil {
		l.t.Fatalf("write: %v", err)
	}
}

func (l *lines) next() map[string]any {
	l.t.Helper()
	m, ok := <-l.in
	if !ok {
		l.t.Fatal("the connection ended")
	}
	return m
}

// call sends a request and returns its result, skipping events.
func (l *lines) call(method string, params any) map[string]any {
	l.t.Helper()
	l.nextID++
	p, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": l.nextID, "method": method, "params": params})
	l.writeLine(string(p))
	for {
		m := l.next()
		if m["id"] != float64(l.nextID) {
			continue
		}
		if m["error"] != nil {
			l.t.Fatalf("%s: error %v", method, m["error"])
		}
		res, _ := m["result"].(map[string]any)
		return res
	}
}

// untilEvent reads up to the next event of type typ and returns its
// payload.
func (l *lines) untilEvent(typ string) map[string]any {
	l.t.Helper()
	for {
		if m := l.next(); m["method"] == "event" && param(m, "type") == typ {
			p, _ := param(m, "payload").(map[string]any)
			return p
		}
	}
}

// untilClose reads up to the close line and returns its code.
func (l *lines) untilClose() int {
	l.t.Helper()
	for {
		if code, ok := l.next()["close"].(float64); ok {
			return int(code)
		}
	}
}

func param(m map[string]any, key string) any {
	p, _ := m["params"].(map[string]any)
	return p[key]
}
