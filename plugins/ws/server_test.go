package ws_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	gobws "github.com/gobwas/ws"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/plugins/ws"
	"github.com/tether-agent/tether/wire"
)

func TestHTTP(t *testing.T) {
	static := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("static " + r.URL.Path))
	})
	tests := []struct {
		name       string
		static     http.Handler
		method     string
		path       string
		wantStatus int
		wantBody   string
	}{
		{
			name:       "healthz",
			method:     http.MethodGet,
			path:       "/healthz",
			wantStatus: http.StatusOK,
			wantBody:   "ok",
		},
		{
			name:       "healthz post",
			method:     http.MethodPost,
			path:       "/healthz",
			wantStatus: http.StatusMethodNotAllowed,
		},
		{
			name:       "root without static",
			method:     http.MethodGet,
			path:       "/",
			wantStatus: http.StatusNotFound,
		},
		{
			name:       "other path",
			method:     http.MethodGet,
			path:       "/api/other",
			wantStatus: http.StatusNotFound,
		},
		{
			name:       "root with static",
			static:     static,
			method:     http.MethodGet,
			path:       "/",
			wantStatus: http.StatusOK,
			wantBody:   "static /",
		},
		{
			name:       "healthz with static",
			static:     static,
			method:     http.MethodGet,
			path:       "/healthz",
			wantStatus: http.StatusOK,
			wantBody:   "ok",
		},
		{
			name:       "websocket endpoint without upgrade",
			method:     http.MethodGet,
			path:       "/api/ws",
			wantStatus: http.StatusBadRequest,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, addr := startServer(t, contract.StartRequest{}, func(s *ws.Server) { s.Static = tt.static })
			status, body := httpDo(t, tt.method, "http://"+addr+tt.path)
			if status != tt.wantStatus {
				t.Errorf("%s %s: got status %d, want %d", tt.method, tt.path, status, tt.wantStatus)
			}
			if tt.wantBody != "" && body != tt.wantBody {
				t.Errorf("%s %s: got body %q, want %q", tt.method, tt.path, body, tt.wantBody)
			}
		})
	}
}

func TestStartErrors(t *testing.T) {
	tests := []struct {
		name string
		req  contract.StartRequest
	}{
		{
			name: "empty listen",
			req:  contract.StartRequest{},
		},
		{
			name: "timeout not above ping",
			req:  contract.StartRequest{Listen: "127.0.0.1:0", PingInterval: time.Second, PeerTimeout: time.Second},
		},
		{
			name: "negative queue",
			req:  contract.StartRequest{Listen: "127.0.0.1:0", SendQueue: -1},
		},
		{
			name: "negative max connections",
			req:  contract.StartRequest{Listen: "127.0.0.1:0", MaxConnections: -1},
		},
		{
			name: "negative header timeout",
			req:  contract.StartRequest{Listen: "127.0.0.1:0", HeaderTimeout: -time.Second},
		},
		{
			name: "certificate without key",
			req:  contract.StartRequest{Listen: "127.0.0.1:0", TLSCertFile: "cert.pem"},
		},
		{
			name: "key without certificate",
			req:  contract.StartRequest{Listen: "127.0.0.1:0", TLSKeyFile: "key.pem"},
		},
		{
			name: "missing certificate files",
			req:  contract.StartRequest{Listen: "127.0.0.1:0", TLSCertFile: "/nonexistent/cert.pem", TLSKeyFile: "/nonexistent/key.pem"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := ws.New(testLogger(t))
			_, err := s.Start(context.Background(), tt.req)
			if !errors.Is(err, contract.ErrInvalidArgument) {
				t.Errorf("Start: got error %v, want ErrInvalidArgument", err)
			}
			if err := s.Stop(context.Background(), contract.StopRequest{}); err != nil {
				t.Errorf("Stop: got %v, want nil", err)
			}
		})
	}

	t.Run("twice", func(t *testing.T) {
		s, _ := startServer(t, contract.StartRequest{})
		if _, err := s.Start(context.Background(), contract.StartRequest{Listen: "127.0.0.1:0"}); err == nil {
			t.Errorf("second Start: got nil error, want one")
		}
	})
	t.Run("after stop", func(t *testing.T) {
		s := ws.New(testLogger(t))
		if err := s.Stop(context.Background(), contract.StopRequest{}); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		_, err := s.Start(context.Background(), contract.StartRequest{Listen: "127.0.0.1:0"})
		if !errors.Is(err, contract.ErrStopped) {
			t.Errorf("Start after Stop: got %v, want ErrStopped", err)
		}
	})
}

func TestLinkTwice(t *testing.T) {
	s, addr := startServer(t, contract.StartRequest{})
	r := link(t, s)
	r.opened(t, dial(t, addr, "/api/ws", nil)) // the first link is running
	err := s.Link(context.Background(), newRecorder().sink)
	if !errors.Is(err, contract.ErrAlreadyLinked) {
		t.Errorf("second Link: got %v, want ErrAlreadyLinked", err)
	}
}

func TestOpened(t *testing.T) {
	s, addr := startServer(t, contract.StartRequest{})
	r := link(t, s)
	hdr := http.Header{"X-Test": {"one", "two"}, "Origin": {"http://" + addr}}
	c := dial(t, addr, "/api/pty?attach=abc_DEF-123456789&offset=3", hdr)
	e := r.opened(t, c)
	if e.Conn == 0 {
		t.Errorf("Opened: got conn 0, want a non-zero id")
	}
	if e.Path != "/api/pty" {
		t.Errorf("Opened: got path %q, want %q", e.Path, "/api/pty")
	}
	if want := "attach=abc_DEF-123456789&offset=3"; e.Query != want {
		t.Errorf("Opened: got query %q, want %q", e.Query, want)
	}
	if got := e.Header["X-Test"]; len(got) != 2 || got[0] != "one" || got[1] != "two" {
		t.Errorf("Opened: got X-Test %q, want [one two]", got)
	}
	if got := http.Header(e.Header).Get("Origin"); got != "http://"+addr {
		t.Errorf("Opened: got Origin %q, want %q", got, "http://"+addr)
	}
	if got := http.Header(e.Header).Get("Upgrade"); !strings.EqualFold(got, "websocket") {
		t.Errorf("Opened: got Upgrade header %q, want websocket", got)
	}
	if e.Host != addr {
		t.Errorf("Opened: got host %q, want %q", e.Host, addr)
	}
	if want := c.nc.LocalAddr().String(); e.Remote != want {
		t.Errorf("Opened: got remote %q, want %q", e.Remote, want)
	}
}

func TestNoFrameBeforeAdmit(t *testing.T) {
	s, addr := startServer(t, contract.StartRequest{})
	r := link(t, s)
	c := dial(t, addr, "/api/ws", nil)
	id := r.opened(t, c).Conn

	c.mustWrite(gobws.OpText, []byte("early"))
	// A round trip through the server after the frame was sent.
	exec(t, s, sendText(id, "hello"))
	if op, p := c.readMessage(); op != gobws.OpText || string(p) != "hello" {
		t.Fatalf("client: got %v %q, want text %q", op, p, "hello")
	}
	if r.has(isFrame(id)) {
		t.Fatalf("got a frame event before admit, want none")
	}
	exec(t, s, admit(id))
	if e := r.wait(t, "frame", isFrame(id)); string(e.Data) != "early" || e.Binary {
		t.Errorf("frame after admit: got binary=%v %q, want text %q", e.Binary, e.Data, "early")
	}
}

func TestRefuseBeforeAdmit(t *testing.T) {
	tests := []struct {
		name       string
		code       int
		reason     string
		clientSays []byte // a frame the client sends before being refused
		wantCode   int
	}{
		{
			name:     "unauthorized",
			code:     wire.CloseUnauthorized,
			reason:   "unauthorized",
			wantCode: wire.CloseUnauthorized,
		},
		{
			name:       "forbidden after a frame",
			code:       wire.CloseForbidden,
			reason:     "bad origin",
			clientSays: []byte(`{"jsonrpc":"2.0"}`),
			wantCode:   wire.CloseForbidden,
		},
		{
			name:     "not loopback",
			code:     wire.CloseNotLoopback,
			wantCode: wire.CloseNotLoopback,
		},
		{
			name:     "endpoint off",
			code:     wire.CloseNotFound,
			reason:   strings.Repeat("é", 100), // cut to fit a control frame
			wantCode: wire.CloseNotFound,
		},
		{
			name:     "zero code",
			code:     0,
			wantCode: wire.CloseNormal,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, addr := startServer(t, contract.StartRequest{})
			r := link(t, s)
			c := dial(t, addr, "/api/ws", nil)
			id := r.opened(t, c).Conn
			if tt.clientSays != nil {
				c.mustWrite(gobws.OpText, tt.clientSays)
			}
			exec(t, s, contract.Command{Kind: contract.CommandClose, Conn: id, Code: tt.code, Reason: tt.reason})
			code, reason := c.mustReadClose()
			if code != tt.wantCode {
				t.Errorf("client: got close code %d, want %d", code, tt.wantCode)
			}
			if !strings.HasPrefix(tt.reason, reason) || len(reason) > 123 {
				t.Errorf("client: got reason %q, want a prefix of %q of at most 123 bytes", reason, tt.reason)
			}
			e := r.closed(t, id)
			if e.Code != tt.wantCode {
				t.Errorf("Closed: got code %d, want %d", e.Code, tt.wantCode)
			}
			if r.has(isFrame(id)) {
				t.Errorf("got a frame event for a refused conn, want none")
			}
		})
	}
}

func TestEcho(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 20000) // 320 KB, beyond one read
	tests := []struct {
		name    string
		binary  bool
		payload []byte
	}{
		{
			name:    "text",
			payload: []byte(`{"jsonrpc":"2.0","method":"x"}`),
		},
		{
			name:    "binary",
			binary:  true,
			payload: []byte{0, 1, 2, 0xff, 0xfe},
		},
		{
			name:    "empty text",
			payload: []byte{},
		},
		{
			name:    "utf-8 text",
			payload: []byte("héllo wörld ✓"),
		},
		{
			name:    "large binary",
			binary:  true,
			payload: big,
		},
	}
	s, addr := startServer(t, contract.StartRequest{})
	r := link(t, s)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := dial(t, addr, "/api/ws", nil)
			id := r.opened(t, c).Conn
			exec(t, s, admit(id))
			op := gobws.OpText
			if tt.binary {
				op = gobws.OpBinary
			}
			c.mustWrite(op, tt.payload)
			e := r.wait(t, "frame", isFrame(id))
			if e.Binary != tt.binary || !bytes.Equal(e.Data, tt.payload) {
				t.Fatalf("frame: got binary=%v %d bytes, want binary=%v %d bytes", e.Binary, len(e.Data), tt.binary, len(tt.payload))
			}
			exec(t, s, contract.Command{Kind: contract.CommandSend, Conn: id, Binary: e.Binary, Data: e.Data})
			gotOp, got := c.readMessage()
			if gotOp != op || !bytes.Equal(got, tt.payload) {
				t.Errorf("echo: got %v %d bytes, want %v %d bytes", gotOp, len(got), op, len(tt.payload))
			}
		})
	}
}

func TestFragmentedWithPing(t *testing.T) {
	s, addr := startServer(t, contract.StartRequest{})
	r := link(t, s)
	c := dial(t, addr, "/api/ws", nil)
	id := r.opened(t, c).Conn
	exec(t, s, admit(id))

	for _, step := range []struct {
		op  gobws.OpCode
		fin bool
		p   string
	}{
		{op: gobws.OpText, p: "hel"},
		{op: gobws.OpPing, fin: true, p: "are you there"},
		{op: gobws.OpContinuation, p: "lo wö"[:5]}, // splits the ö
		{op: gobws.OpContinuation, fin: true, p: "lo wö"[5:] + "rld"},
	} {
		if err := c.write(step.op, step.fin, []byte(step.p)); err != nil {
			t.Fatalf("client write: %v", err)
		}
	}
	f, err := c.readFrame()
	if err != nil {
		t.Fatalf("client read: %v", err)
	}
	if f.Header.OpCode != gobws.OpPong || string(f.Payload) != "are you there" {
		t.Errorf("client: got %v %q, want pong %q", f.Header.OpCode, f.Payload, "are you there")
	}
	if e := r.wait(t, "frame", isFrame(id)); string(e.Data) != "hello wörld" {
		t.Errorf("frame: got %q, want %q", e.Data, "hello wörld")
	}
}

func TestCloseAfterQueued(t *testing.T) {
	s, addr := startServer(t, contract.StartRequest{})
	r := link(t, s)
	c := dial(t, addr, "/api/pty?attach=0123456789abcdef", nil)
	id := r.opened(t, c).Conn
	exec(t, s, admit(id),
		sendText(id, "one"),
		contract.Command{Kind: contract.CommandSend, Conn: id, Binary: true, Data: []byte("two")},
		contract.Command{Kind: contract.CommandClose, Conn: id, Code: wire.CloseProcessExited, Reason: "exited"},
		sendText(id, "after close"), // dropped
	)
	for _, want := range []string{"one", "two"} {
		if _, p := c.readMessage(); string(p) != want {
			t.Fatalf("client: got %q, want %q before the close", p, want)
		}
	}
	if code, reason := c.mustReadClose(); code != wire.CloseProcessExited || reason != "exited" {
		t.Errorf("client: got close %d %q, want 4410 %q", code, reason, "exited")
	}
	if e := r.closed(t, id); e.Code != wire.CloseProcessExited {
		t.Errorf("Closed: got code %d, want 4410", e.Code)
	}
}

func TestClientPing(t *testing.T) {
	s, addr := startServer(t, contract.StartRequest{})
	r := link(t, s)
	c := dial(t, addr, "/api/ws", nil)
	id := r.opened(t, c).Conn
	exec(t, s, admit(id))
	c.mustWrite(gobws.OpPing, []byte("tick"))
	f, err := c.readFrame()
	if err != nil {
		t.Fatalf("client read: %v", err)
	}
	if f.Header.OpCode != gobws.OpPong || string(f.Payload) != "tick" {
		t.Errorf("client: got %v %q, want pong %q", f.Header.OpCode, f.Payload, "tick")
	}
	c.mustWrite(gobws.OpPong, []byte("unsolicited"))
	c.mustWrite(gobws.OpText, []byte("after pong"))
	if e := r.wait(t, "frame", isFrame(id)); string(e.Data) != "after pong" {
		t.Errorf("frame: got %q, want %q", e.Data, "after pong")
	}
}

func TestProtocolLimits(t *testing.T) {
	const limit = 1024
	type frame struct {
		op  gobws.OpCode
		fin bool
		p   []byte
	}
	tests := []struct {
		name     string
		frames   []frame
		raw      []byte // written as is instead of frames
		wantCode int
	}{
		{
			name:     "message too big",
			frames:   []frame{{op: gobws.OpText, fin: true, p: bytes.Repeat([]byte("a"), limit+1)}},
			wantCode: wire.CloseTooBig,
		},
		{
			name: "fragmented message too big",
			frames: []frame{
				{op: gobws.OpBinary, p: make([]byte, 600)},
				{op: gobws.OpContinuation, fin: true, p: make([]byte, 600)},
			},
			wantCode: wire.CloseTooBig,
		},
		{
			name:     "invalid utf-8",
			frames:   []frame{{op: gobws.OpText, fin: true, p: []byte("ok \xff\xfe")}},
			wantCode: wire.CloseInvalidPayload,
		},
		{
			name: "invalid utf-8 across fragments",
			frames: []frame{
				{op: gobws.OpText, p: []byte("ok \xc3")},
				{op: gobws.OpContinuation, fin: true, p: []byte("(")},
			},
			wantCode: wire.CloseInvalidPayload,
		},
		{
			name:     "close reason not utf-8",
			frames:   []frame{{op: gobws.OpClose, fin: true, p: closePayload(1000, "\xff")}},
			wantCode: wire.CloseInvalidPayload,
		},
		{
			name:     "close code not allowed",
			frames:   []frame{{op: gobws.OpClose, fin: true, p: closePayload(1006, "")}},
			wantCode: wire.CloseProtocolError,
		},
		{
			name:     "close payload of one byte",
			frames:   []frame{{op: gobws.OpClose, fin: true, p: []byte{3}}},
			wantCode: wire.CloseProtocolError,
		},
		{
			name:     "unmasked frame",
			raw:      []byte{0x81, 0x02, 'h', 'i'},
			wantCode: wire.CloseProtocolError,
		},
		{
			name:     "reserved opcode",
			frames:   []frame{{op: 0x3, fin: true, p: []byte("x")}},
			wantCode: wire.CloseProtocolError,
		},
		{
			name:     "continuation without start",
			frames:   []frame{{op: gobws.OpContinuation, fin: true, p: []byte("x")}},
			wantCode: wire.CloseProtocolError,
		},
		{
			name:     "fragmented ping",
			frames:   []frame{{op: gobws.OpPing, fin: false, p: []byte("x")}},
			wantCode: wire.CloseProtocolError,
		},
		{
			name:     "rsv bit",
			raw:      []byte{0xc1, 0x80, 0, 0, 0, 0},
			wantCode: wire.CloseProtocolError,
		},
	}
	s, addr := startServer(t, contract.StartRequest{MaxMessage: limit})
	r := link(t, s)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := dial(t, addr, "/api/ws", nil)
			id := r.opened(t, c).Conn
			exec(t, s, admit(id))
			if tt.raw != nil {
				if _, err := c.nc.Write(tt.raw); err != nil {
					t.Fatalf("client write: %v", err)
				}
			}
			for _, f := range tt.frames {
				if err := c.write(f.op, f.fin, f.p); err != nil {
					t.Fatalf("client write: %v", err)
				}
			}
			code, _ := c.mustReadClose()
			if code != tt.wantCode {
				t.Errorf("client: got close code %d, want %d", code, tt.wantCode)
			}
			c.nc.Close()
			if e := r.closed(t, id); e.Code != tt.wantCode {
				t.Errorf("Closed: got code %d, want %d", e.Code, tt.wantCode)
			}
			if r.has(isFrame(id)) {
				t.Errorf("got a frame event, want none")
			}
		})
	}
}

func TestPeerEnds(t *testing.T) {
	tests := []struct {
		name       string
		end        func(c *client) error
		wantCode   int
		wantReason string
		wantEcho   bool
	}{
		{
			name:       "close 1000",
			end:        func(c *client) error { return c.write(gobws.OpClose, true, closePayload(1000, "bye")) },
			wantCode:   1000,
			wantReason: "bye",
			wantEcho:   true,
		},
		{
			name:     "close 4000",
			end:      func(c *client) error { return c.write(gobws.OpClose, true, closePayload(4000, "")) },
			wantCode: 4000,
			wantEcho: true,
		},
		{
			name:     "empty close",
			end:      func(c *client) error { return c.write(gobws.OpClose, true, nil) },
			wantCode: 1005,
			wantEcho: true,
		},
		{
			name:     "tcp drop",
			end:      func(c *client) error { return c.nc.Close() },
			wantCode: wire.CloseAbnormal,
		},
		{
			name: "tcp drop mid-frame",
			end: func(c *client) error {
				if _, err := c.nc.Write([]byte{0x81, 0x85, 1, 2, 3, 4, 'x'}); err != nil {
					return err
				}
				return c.nc.Close()
			},
			wantCode: wire.CloseAbnormal,
		},
	}
	s, addr := startServer(t, contract.StartRequest{})
	r := link(t, s)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := dial(t, addr, "/api/ws", nil)
			id := r.opened(t, c).Conn
			exec(t, s, admit(id))
			if err := tt.end(c); err != nil {
				t.Fatalf("client: %v", err)
			}
			if tt.wantEcho {
				f, err := c.readFrame()
				if err != nil {
					t.Fatalf("client: reading close echo: %v", err)
				}
				if code, _ := closeCode(f.Payload); f.Header.OpCode != gobws.OpClose || code != tt.wantCode {
					t.Errorf("client: got %v code %d, want close %d", f.Header.OpCode, code, tt.wantCode)
				}
				if _, err := c.readFrame(); !isNetClosed(err) {
					t.Errorf("client: after close echo got %v, want the server to close TCP", err)
				}
			}
			e := r.closed(t, id)
			if e.Code != tt.wantCode || e.Reason != tt.wantReason {
				t.Errorf("Closed: got %d %q, want %d %q", e.Code, e.Reason, tt.wantCode, tt.wantReason)
			}
			// Commands for a closed conn are ignored.
			exec(t, s, sendText(id, "late"), admit(id), contract.Command{Kind: contract.CommandClose, Conn: id})
		})
	}
}

func TestLiveness(t *testing.T) {
	const (
		ping    = 100 * time.Millisecond
		timeout = time.Second // wide: -race on a loaded 2-core machine
	)
	s, addr := startServer(t, contract.StartRequest{PingInterval: ping, PeerTimeout: timeout})
	r := link(t, s)

	t.Run("dead peer", func(t *testing.T) {
		c := dial(t, addr, "/api/ws", nil) // never reads, never answers a ping
		id := r.opened(t, c).Conn
		start := time.Now()
		exec(t, s, admit(id))
		e := r.closed(t, id)
		if e.Code != wire.CloseAbnormal || e.Reason != "peer timeout" {
			t.Errorf("Closed: got %d %q, want 1006 %q", e.Code, e.Reason, "peer timeout")
		}
		if d := time.Since(start); d < timeout {
			t.Errorf("closed after %v, want at least the peer timeout %v", d, timeout)
		}
	})

	t.Run("live peer", func(t *testing.T) {
		c := dial(t, addr, "/api/ws", nil)
		id := r.opened(t, c).Conn
		exec(t, s, admit(id))
		// Answer pings until the connection has outlived the peer
		// timeout twice over.
		start := time.Now()
		pings := 0
		for time.Since(start) < 2*timeout || pings < 2 {
			f, err := c.readFrame()
			if err != nil {
				t.Fatalf("client read: %v", err)
			}
			if f.Header.OpCode != gobws.OpPing {
				t.Fatalf("client: got %v, want ping", f.Header.OpCode)
			}
			pings++
			if err := c.write(gobws.OpPong, true, f.Payload); err != nil {
				t.Fatalf("client pong: %v", err)
			}
		}
		if r.has(isClosed(id)) {
			t.Fatalf("a peer answering pings was closed")
		}
		c.mustWrite(gobws.OpText, []byte("still here"))
		if e := r.wait(t, "frame", isFrame(id)); string(e.Data) != "still here" {
			t.Errorf("frame: got %q, want %q", e.Data, "still here")
		}
	})

	t.Run("admit timeout", func(t *testing.T) {
		c := dial(t, addr, "/api/ws", nil)
		id := r.opened(t, c).Conn
		code, reason := c.mustReadClose()
		if code != wire.CloseTryAgainLater || reason != "admit timeout" {
			t.Errorf("client: got close %d %q, want 1013 %q", code, reason, "admit timeout")
		}
		if e := r.closed(t, id); e.Code != wire.CloseTryAgainLater {
			t.Errorf("Closed: got code %d, want 1013", e.Code)
		}
	})
}

// TestQuietPeer checks the hand-over between a connection's reader and
// its idle waiter: a peer that pauses longer than the reader lingers is
// still read, and a silent one is still closed after the peer timeout,
// counted from its last message.
func TestQuietPeer(t *testing.T) {
	const (
		ping    = 300 * time.Millisecond
		timeout = 800 * time.Millisecond // the reader lingers a quarter of it
	)
	s, addr := startServer(t, contract.StartRequest{PingInterval: ping, PeerTimeout: timeout})
	r := link(t, s)
	c := dial(t, addr, "/api/ws", nil)
	id := r.opened(t, c).Conn
	exec(t, s, admit(id))
	from := 0
	for i, msg := range []string{"first", "after a pause", "after another"} {
		if i > 0 {
			time.Sleep(timeout / 2) // not synchronisation: a pause past the reader's linger
		}
		c.mustWrite(gobws.OpText, []byte(msg))
		e, at := r.waitIndex(t, "frame", from, isFrame(id))
		if string(e.Data) != msg {
			t.Fatalf("frame %d: got %q, want %q", i, e.Data, msg)
		}
		from = at + 1
	}
	last := time.Now()
	e := r.closed(t, id)
	if e.Code != wire.CloseAbnormal || e.Reason != "peer timeout" {
		t.Errorf("Closed: got %d %q, want 1006 %q", e.Code, e.Reason, "peer timeout")
	}
	if d := time.Since(last); d < timeout-ping {
		t.Errorf("closed %v after the last message, want about the peer timeout %v", d, timeout)
	}
}

func TestSendQueue(t *testing.T) {
	const (
		queue = 64 << 10
		size  = 1 << 10
	)
	s, addr := startServer(t, contract.StartRequest{SendQueue: queue, PingInterval: 100 * time.Millisecond, PeerTimeout: 500 * time.Millisecond})
	r := link(t, s)
	msg := bytes.Repeat([]byte("x"), size)
	send := contract.Command{Kind: contract.CommandSend, Binary: true, Data: msg}

	t.Run("reading peer", func(t *testing.T) {
		c := dial(t, addr, "/api/ws", nil)
		id := r.opened(t, c).Conn
		exec(t, s, admit(id))
		send.Conn = id
		// Far more than the queue holds, taken as fast as it is sent.
		for range 10 * queue / size {
			exec(t, s, send)
			if op, p := c.readMessage(); op != gobws.OpBinary || len(p) != size {
				t.Fatalf("client: got %v of %d bytes, want binary of %d", op, len(p), size)
			}
		}
		if s.ConnClosing(id) {
			t.Errorf("a peer that keeps up was closed")
		}
	})

	t.Run("peer that never reads", func(t *testing.T) {
		c := dial(t, addr, "/api/ws", nil)
		if tc, ok := c.nc.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(4096)
		}
		id := r.opened(t, c).Conn
		exec(t, s, admit(id))
		send.Conn = id
		var slowest time.Duration
		sent := 0
		for !s.ConnClosing(id) {
			if sent > 100000 {
				t.Fatalf("sent %d messages to a peer that never reads, and the conn is still open", sent)
			}
			start := time.Now()
			exec(t, s, send)
			slowest = max(slowest, time.Since(start))
			sent++
		}
		if slowest > time.Second {
			t.Errorf("slowest Exec took %v, want it never to block", slowest)
		}
		if e := r.closed(t, id); e.Code != wire.CloseTryAgainLater {
			t.Errorf("Closed: got code %d %q, want 1013", e.Code, e.Reason)
		}
		t.Logf("closed after %d messages of %d bytes", sent, size)
	})
}

// TestSendOrderUnderBackpressure sends messages one Exec at a time to a
// peer that reads nothing until all are sent, so that some go out at once
// from Exec, some only in part (the socket full) and the rest through the
// writer goroutine; the peer must then read every one, whole and in order,
// and the close after them.
func TestSendOrderUnderBackpressure(t *testing.T) {
	s, addr := startServer(t, contract.StartRequest{})
	r := link(t, s)
	c := dial(t, addr, "/api/ws", nil)
	if tc, ok := c.nc.(*net.TCPConn); ok {
		// Small enough to fill, not below loopback's MSS: a window
		// under one segment stalls TCP for its persist timer.
		_ = tc.SetReadBuffer(256 << 10)
	}
	id := r.opened(t, c).Conn
	if err := s.SetConnWriteBuffer(id, 8<<10); err != nil {
		t.Fatalf("SetConnWriteBuffer: %v", err)
	}
	exec(t, s, admit(id))
	// First only messages small enough to go out from Exec, until the
	// socket is full (one goes out in part), then also bigger ones.
	small := []int{0, 1, 125, 126, 4000, 16<<10 - 7, 9000, 300}
	sizes := []int{0, 1, 125, 126, 4000, 16 << 10, 16<<10 + 1, 70000, 9000, 300}
	var want [][]byte
	for i := range 400 {
		n := small[i%len(small)]
		if i >= 200 {
			n = sizes[i%len(sizes)]
		}
		msg := []byte(fmt.Sprintf("%06d:", i))
		msg = append(msg, bytes.Repeat([]byte{byte('a' + i%26)}, n)...)
		want = append(want, msg)
		exec(t, s, contract.Command{Kind: contract.CommandSend, Conn: id, Binary: i%2 == 1, Data: msg})
	}
	exec(t, s, contract.Command{Kind: contract.CommandClose, Conn: id, Code: 4321, Reason: "done"})
	_ = s.SetConnWriteBuffer(id, 1<<20) // only to read faster
	for i, w := range want {
		op, got := c.readMessage()
		wantOp := gobws.OpText
		if i%2 == 1 {
			wantOp = gobws.OpBinary
		}
		if op != wantOp || !bytes.Equal(got, w) {
			t.Fatalf("message %d: got %v %.12q (%d bytes), want %v %.12q (%d bytes)", i, op, got, len(got), wantOp, w, len(w))
		}
	}
	if code, reason := c.mustReadClose(); code != 4321 || reason != "done" {
		t.Errorf("close: got %d %q, want 4321 \"done\"", code, reason)
	}
}

func TestStop(t *testing.T) {
	s := ws.New(testLogger(t))
	resp, err := s.Start(context.Background(), contract.StartRequest{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	addr := resp.Addr
	r := newRecorder()
	linkErr := make(chan error, 1)
	go func() { linkErr <- s.Link(context.Background(), r.sink) }()

	var clients []*client
	var ids []uint64
	for i := range 3 {
		c := dial(t, addr, "/api/ws", nil)
		id := r.opened(t, c).Conn
		if i < 2 {
			exec(t, s, admit(id)) // the third stays pending
		}
		clients = append(clients, c)
		ids = append(ids, id)
	}
	exec(t, s, sendText(ids[0], "last words"))

	type result struct {
		code   int
		reason string
		err    error
	}
	results := make([]chan result, len(clients))
	for i, c := range clients {
		results[i] = make(chan result, 1)
		go func() {
			code, reason, err := c.readClose()
			results[i] <- result{code, reason, err}
		}()
	}

	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := s.Stop(ctx, contract.StopRequest{}); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	for i, id := range ids {
		if !r.has(isClosed(id)) {
			t.Errorf("conn %d: no Closed event delivered by the time Stop returned", id)
		}
		if e := r.closed(t, id); e.Code != wire.CloseGoingAway {
			t.Errorf("conn %d: got Closed code %d, want 1001", id, e.Code)
		}
		res := <-results[i]
		if res.err != nil || res.code != wire.CloseGoingAway {
			t.Errorf("client %d: got close %d (err %v), want 1001", i, res.code, res.err)
		}
	}
	if got := r.forConn(ids[0]); len(got) < 2 || got[len(got)-1].Kind != contract.EventClosed {
		t.Errorf("conn %d: got events %v, want Closed last", ids[0], got)
	}
	if err := <-linkErr; err != nil {
		t.Errorf("Link after Stop: got %v, want nil", err)
	}
	if nc, err := net.DialTimeout("tcp", addr, waitTimeout); err == nil {
		nc.Close()
		t.Errorf("dial after Stop: connected, want refused")
	}
	if err := s.Stop(ctx, contract.StopRequest{}); err != nil {
		t.Errorf("second Stop: got %v, want nil", err)
	}
	exec(t, s, sendText(ids[0], "after stop"))
	if err := s.Link(ctx, newRecorder().sink); err != nil {
		t.Errorf("Link after Stop: got %v, want nil", err)
	}
}

func TestStopCode(t *testing.T) {
	s := ws.New(testLogger(t))
	resp, err := s.Start(context.Background(), contract.StartRequest{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	r := link(t, s)
	c := dial(t, resp.Addr, "/api/ws", nil)
	id := r.opened(t, c).Conn
	exec(t, s, admit(id))
	got := make(chan int, 1)
	go func() {
		code, _, _ := c.readClose()
		got <- code
	}()
	if err := s.Stop(context.Background(), contract.StopRequest{Code: wire.CloseServiceRestart, Reason: "reload"}); err != nil {
		t.Fatal(err)
	}
	if code := <-got; code != wire.CloseServiceRestart {
		t.Errorf("client: got close %d, want 1012", code)
	}
	if e := r.closed(t, id); e.Code != wire.CloseServiceRestart || e.Reason != "reload" {
		t.Errorf("Closed: got %d %q, want 1012 %q", e.Code, e.Reason, "reload")
	}
}

func TestConnIDs(t *testing.T) {
	const n = 200
	s, addr := startServer(t, contract.StartRequest{})
	r := link(t, s)
	seen := make(map[uint64]bool)
	var last uint64
	clients := make([]*client, 0, n)
	for range n {
		c := dial(t, addr, "/api/ws", nil)
		id := r.opened(t, c).Conn
		if seen[id] {
			t.Fatalf("conn id %d given twice", id)
		}
		if id <= last {
			t.Fatalf("conn id %d after %d, want increasing", id, last)
		}
		seen[id], last = true, id
		exec(t, s, admit(id))
		clients = append(clients, c)
	}
	for _, c := range clients {
		c.nc.Close()
	}
	for id := range seen {
		r.closed(t, id)
	}
}

func TestEventOrder(t *testing.T) {
	const (
		conns = 20
		msgs  = 10
	)
	s, addr := startServer(t, contract.StartRequest{})
	r := link(t, s)
	clients := make([]*client, conns)
	ids := make([]uint64, conns)
	for i := range clients {
		clients[i] = dial(t, addr, "/api/ws", nil)
		ids[i] = r.opened(t, clients[i]).Conn
		exec(t, s, admit(ids[i]))
	}
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range msgs {
				if err := c.write(gobws.OpText, true, fmt.Appendf(nil, "%d", j)); err != nil {
					errs <- err
					return
				}
			}
			if err := c.write(gobws.OpClose, true, closePayload(1000, "")); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("client write: %v", err)
	}
	for _, id := range ids {
		r.closed(t, id)
		evs := r.forConn(id)
		if len(evs) != msgs+2 {
			t.Fatalf("conn %d: got %d events, want %d", id, len(evs), msgs+2)
		}
		if evs[0].Kind != contract.EventOpened {
			t.Errorf("conn %d: first event %v, want opened", id, evs[0].Kind)
		}
		for j, e := range evs[1 : msgs+1] {
			if e.Kind != contract.EventFrame || string(e.Data) != fmt.Sprint(j) {
				t.Errorf("conn %d: event %d is %v %q, want frame %q", id, j+1, e.Kind, e.Data, fmt.Sprint(j))
			}
		}
		if e := evs[msgs+1]; e.Kind != contract.EventClosed || e.Code != 1000 {
			t.Errorf("conn %d: last event %v code %d, want closed 1000", id, e.Kind, e.Code)
		}
	}
}

func TestEventsWithoutLink(t *testing.T) {
	tests := []struct {
		name        string
		eventBuffer int64
		msgs        int
		size        int
		readEcho    bool // the client waits for the close echo before the link starts
	}{
		{
			name:     "buffered until linked",
			msgs:     3,
			size:     10,
			readEcho: true,
		},
		{
			name:        "reader waits for buffer space",
			eventBuffer: 1024,
			msgs:        20,
			size:        600,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, addr := startServer(t, contract.StartRequest{}, func(s *ws.Server) { s.EventBuffer = tt.eventBuffer })
			c := dial(t, addr, "/api/ws", nil)
			// A first link sees the conn open, then goes away.
			earlier := newRecorder()
			ctx, cancel := context.WithCancel(context.Background())
			linkDone := make(chan error, 1)
			go func() { linkDone <- s.Link(ctx, earlier.sink) }()
			id := earlier.opened(t, c).Conn
			cancel()
			if err := <-linkDone; err != nil {
				t.Fatalf("first Link: %v", err)
			}
			exec(t, s, admit(id))
			for i := range tt.msgs {
				p := bytes.Repeat([]byte{byte('a' + i%26)}, tt.size)
				c.mustWrite(gobws.OpBinary, p)
			}
			c.mustWrite(gobws.OpClose, closePayload(1000, ""))
			wantFirst := 1
			if tt.readEcho {
				// The frames were queued before the echo was written.
				if code, _ := c.mustReadClose(); code != 1000 {
					t.Fatalf("client: got close echo %d, want 1000", code)
				}
				wantFirst = tt.msgs
			}

			r := link(t, s)
			r.closed(t, id)
			evs := r.forConn(id)
			evs = append(earlier.forConn(id), evs...)
			if len(evs) != tt.msgs+2 {
				t.Fatalf("got %d events, want %d", len(evs), tt.msgs+2)
			}
			for i, e := range evs[1 : tt.msgs+1] {
				want := bytes.Repeat([]byte{byte('a' + i%26)}, tt.size)
				if e.Kind != contract.EventFrame || !bytes.Equal(e.Data, want) {
					t.Errorf("event %d: got %v %q, want frame of %q", i+1, e.Kind, e.Data[:min(len(e.Data), 4)], want[:4])
				}
			}
			r.mu.Lock()
			first := r.batches[0]
			r.mu.Unlock()
			if first < wantFirst {
				t.Errorf("first batch: got %d events, want at least %d: the backlog delivered at once", first, wantFirst)
			}
		})
	}
}

func TestSinkErrorKeepsBatch(t *testing.T) {
	s, addr := startServer(t, contract.StartRequest{})
	c := dial(t, addr, "/api/ws", nil)
	failing := errors.New("sink broke")
	var got []contract.Event
	err := s.Link(context.Background(), func(_ context.Context, evs []contract.Event) error {
		got = append(got, evs...)
		return failing
	})
	if !errors.Is(err, failing) {
		t.Fatalf("Link: got %v, want the sink's error", err)
	}
	if len(got) != 1 || got[0].Kind != contract.EventOpened {
		t.Fatalf("failed batch: got %v, want one opened event", got)
	}
	r := link(t, s)
	if e := r.opened(t, c); e.Conn != got[0].Conn {
		t.Errorf("next link: got opened conn %d, want %d again", e.Conn, got[0].Conn)
	}
}
