package ws_test

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	gobws "github.com/gobwas/ws"

	"github.com/tether-agent/tether/contract"
)

// upgradeRequest is a WebSocket upgrade of target with the extra header
// lines extra.
func upgradeRequest(target, extra string) string {
	return "GET " + target + " HTTP/1.1\r\nHost: tether.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n" + extra + "\r\n"
}

// rawTCP opens a TCP connection to addr.
func rawTCP(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, waitTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(waitTimeout))
	return nc, bufio.NewReader(nc)
}

// readStatus reads an HTTP response head from br and returns its status
// line and headers (its body, if any, is left unread).
func readStatus(t *testing.T, br *bufio.Reader) (string, http.Header) {
	t.Helper()
	status, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("reading the status line: %v", err)
	}
	h := http.Header{}
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the head: %v", err)
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			return strings.TrimSpace(status), h
		}
		k, v, _ := strings.Cut(line, ":")
		h.Add(k, strings.TrimSpace(v))
	}
}

// maskedText is a client's masked text frame of p.
func maskedText(p string) []byte {
	var b bytes.Buffer
	_ = gobws.WriteFrame(&b, gobws.MaskFrameInPlace(gobws.NewTextFrame([]byte(p))))
	return b.Bytes()
}

// TestRawUpgrade: an upgrade of /api/ws, /api/pty or /acp is made on the
// raw connection (not through net/http), and its Opened event is what
// net/http's gave: the path and query as sent, every header, the host;
// /acp's 101 has an Acp-Connection-Id. A frame sent right behind the
// request, and a head that comes a byte at a time, are read.
func TestRawUpgrade(t *testing.T) {
	s, addr := startServer(t, contract.StartRequest{})
	r := link(t, s)

	t.Run("headers", func(t *testing.T) {
		before := s.RawUpgrades()
		for _, path := range []string{"/api/ws", "/api/pty", "/acp"} {
			nc, br := rawTCP(t, addr)
			if _, err := nc.Write([]byte(upgradeRequest(path+"?token=x&a=b", "Cookie: tether_x=1\r\nX-Twice: 1\r\nX-Twice: 2\r\nauthorization: Bearer t\r\n"))); err != nil {
				t.Fatal(err)
			}
			status, h := readStatus(t, br)
			if !strings.Contains(status, "101") {
				t.Fatalf("%s: status %q, want 101", path, status)
			}
			if got := h.Get("Acp-Connection-Id"); (path == "/acp") != (len(got) >= 32) {
				t.Errorf("%s: Acp-Connection-Id %q, want one (of 128 bits) on /acp only", path, got)
			}
			e := r.wait(t, "Opened of "+path, func(e contract.Event) bool {
				return e.Kind == contract.EventOpened && e.Path == path && e.Remote == nc.LocalAddr().String()
			})
			hh := http.Header(e.Header)
			if e.Query != "token=x&a=b" || e.Host != "tether.test" || hh.Get("Cookie") != "tether_x=1" ||
				strings.Join(hh.Values("X-Twice"), ",") != "1,2" || hh.Get("Authorization") != "Bearer t" ||
				hh.Get("Upgrade") != "websocket" || hh.Get("Sec-Websocket-Version") != "13" || hh.Get("Host") != "" {
				t.Errorf("%s: Opened %+v, want the query, host and every header as sent", path, e)
			}
		}
		if n := s.RawUpgrades() - before; n != 3 {
			t.Errorf("%d raw upgrades, want 3", n)
		}
	})

	t.Run("frame behind the request", func(t *testing.T) {
		nc, br := rawTCP(t, addr)
		if _, err := nc.Write(append([]byte(upgradeRequest("/api/ws", "X-Mark: behind\r\n")), maskedText("early")...)); err != nil {
			t.Fatal(err)
		}
		if status, _ := readStatus(t, br); !strings.Contains(status, "101") {
			t.Fatalf("status %q, want 101", status)
		}
		e := r.wait(t, "Opened", func(e contract.Event) bool {
			return e.Kind == contract.EventOpened && http.Header(e.Header).Get("X-Mark") == "behind"
		})
		exec(t, s, admit(e.Conn))
		if f := r.wait(t, "the early frame", isFrame(e.Conn)); string(f.Data) != "early" {
			t.Errorf("frame %q, want %q", f.Data, "early")
		}
	})

	t.Run("a byte at a time", func(t *testing.T) {
		before := s.RawUpgrades()
		nc, br := rawTCP(t, addr)
		for _, b := range []byte(upgradeRequest("/api/ws", "X-Mark: slow\r\n")) {
			if _, err := nc.Write([]byte{b}); err != nil {
				t.Fatal(err)
			}
		}
		if status, _ := readStatus(t, br); !strings.Contains(status, "101") {
			t.Fatalf("status %q, want 101", status)
		}
		r.wait(t, "Opened", func(e contract.Event) bool {
			return e.Kind == contract.EventOpened && http.Header(e.Header).Get("X-Mark") == "slow"
		})
		if s.RawUpgrades() != before+1 {
			t.Errorf("not upgraded on the raw connection")
		}
	})
}

// TestUpgradeThroughNetHTTP: what is not a plain upgrade of the raw
// paths still works, through net/http: an upgrade after a request on
// the same keep-alive connection, and a head too long to sniff.
func TestUpgradeThroughNetHTTP(t *testing.T) {
	s, addr := startServer(t, contract.StartRequest{})
	r := link(t, s)

	t.Run("after a request on the connection", func(t *testing.T) {
		before := s.RawUpgrades()
		nc, br := rawTCP(t, addr)
		if _, err := nc.Write([]byte("GET /healthz HTTP/1.1\r\nHost: tether.test\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		status, h := readStatus(t, br)
		if !strings.Contains(status, "200") || h.Get("Content-Length") != "2" {
			t.Fatalf("/healthz: %q %v, want 200 with a body of 2", status, h)
		}
		if _, err := br.Discard(2); err != nil {
			t.Fatal(err)
		}
		if _, err := nc.Write(append([]byte(upgradeRequest("/api/ws", "X-Mark: second\r\n")), maskedText("after")...)); err != nil {
			t.Fatal(err)
		}
		if status, _ := readStatus(t, br); !strings.Contains(status, "101") {
			t.Fatalf("status %q, want 101", status)
		}
		e := r.wait(t, "Opened", func(e contract.Event) bool {
			return e.Kind == contract.EventOpened && http.Header(e.Header).Get("X-Mark") == "second"
		})
		exec(t, s, admit(e.Conn), sendText(e.Conn, "to you"))
		if f := r.wait(t, "the frame", isFrame(e.Conn)); string(f.Data) != "after" {
			t.Errorf("frame %q, want %q", f.Data, "after")
		}
		c := &client{t: t, nc: nc, r: br}
		if op, p := c.readMessage(); op != gobws.OpText || string(p) != "to you" {
			t.Errorf("client: %v %q, want the text sent", op, p)
		}
		if s.RawUpgrades() != before {
			t.Errorf("an upgrade after a request was made on the raw connection")
		}
	})

	t.Run("a head over the sniff size", func(t *testing.T) {
		before := s.RawUpgrades()
		cookie := "tether_x=" + strings.Repeat("c", 9000)
		c := dial(t, addr, "/api/ws", http.Header{"Cookie": {cookie}})
		e := r.opened(t, c)
		if http.Header(e.Header).Get("Cookie") != cookie {
			t.Errorf("the long cookie did not reach Opened")
		}
		if s.RawUpgrades() != before {
			t.Errorf("a head over the sniff size was upgraded on the raw connection")
		}
	})
}
