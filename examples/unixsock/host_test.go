package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
)

func TestMain(m *testing.M) { e2e.Main(m) }

// TestHost loads the built plugin into a real `tether serve` with
// --plugin transport=PATH#SHA256 and runs a session over the socket: the
// handshake, gateway.ready, session.create, prompt.submit and the streamed
// answer of the echo agent.
func TestHost(t *testing.T) {
	bin, sum := buildPlugin(t)
	dir, err := os.MkdirTemp("", "us")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "tether.sock")

	s := e2e.Start(t, e2e.Config{Args: []string{
		"--listen", "unix:" + sock,
		"--plugin", "transport=" + bin + "#" + sum,
	}})

	nc, err := net.DialTimeout("unix", sock, 10*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", sock, err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(30 * time.Second))
	c := &lineClient{t: t, nc: nc, r: bufio.NewReader(nc)}
	c.writeLine("TETHER token=" + s.Token)

	ready := c.readMessage()
	if ready["method"] != "event" || param(ready, "type") != "gateway.ready" {
		t.Fatalf("first line: got %v, want the gateway.ready event", ready)
	}
	snap := c.call(1, "session.create", map[string]any{"title": "over a unix socket"})
	sid, _ := snap["session_id"].(string)
	if sid == "" {
		t.Fatalf("session.create: got %v, want a session_id", snap)
	}
	res := c.call(2, "prompt.submit", map[string]any{"session_id": sid, "text": "hello over a socket"})
	if res["status"] != "streaming" {
		t.Fatalf("prompt.submit: got %v, want status streaming", res)
	}
	for {
		m := c.readMessage()
		if param(m, "type") != "message.complete" {
			continue
		}
		payload, _ := m["params"].(map[string]any)["payload"].(map[string]any)
		if payload["text"] != "hello over a socket" || payload["status"] != "complete" {
			t.Errorf("message.complete: got %v, want the echo of the prompt", payload)
		}
		break
	}

	// A wrong token is refused with 4401 in a close line.
	bad, err := net.DialTimeout("unix", sock, 10*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", sock, err)
	}
	defer bad.Close()
	_ = bad.SetDeadline(time.Now().Add(30 * time.Second))
	b := &lineClient{t: t, nc: bad, r: bufio.NewReader(bad)}
	b.writeLine("TETHER token=wrong")
	if m := b.readMessage(); m["close"] != float64(4401) {
		t.Errorf("wrong token: got %v, want the close line with 4401", m)
	}
}

// buildPlugin builds this plugin and returns its path and hex sha256.
func buildPlugin(t *testing.T) (path, sum string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "unixsock")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(data)
	return bin, hex.EncodeToString(h[:])
}

// lineClient speaks the line protocol by hand.
type lineClient struct {
	t  *testing.T
	nc net.Conn
	r  *bufio.Reader
}

func (c *lineClient) writeLine(s string) {
	c.t.Helper()
	if _, err := fmt.Fprintf(c.nc, "%s\n", s); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func (c *lineClient) readMessage() map[string]any {
	c.t.Helper()
	line, err := c.r.ReadBytes('\n')
	if err != nil {
		c.t.Fatalf("read: %v (got %q)", err, line)
	}
	var m map[string]any
	if err := json.Unmarshal(line, &m); err != nil {
		c.t.Fatalf("line %q: %v", line, err)
	}
	return m
}

// call sends a request and returns its result, skipping events.
func (c *lineClient) call(id int, method string, params any) map[string]any {
	c.t.Helper()
	p, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	c.writeLine(string(p))
	for {
		m := c.readMessage()
		if m["id"] != float64(id) {
			continue
		}
		if m["error"] != nil {
			c.t.Fatalf("%s: got error %v", method, m["error"])
		}
		res, _ := m["result"].(map[string]any)
		return res
	}
}

func param(m map[string]any, key string) any {
	p, _ := m["params"].(map[string]any)
	return p[key]
}
