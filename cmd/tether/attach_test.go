package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
	"golang.org/x/sys/unix"

	"github.com/tether-agent/tether/wire"
)

// testWait bounds every wait in these tests; nothing sleeps a fixed time.
const testWait = 10 * time.Second

const testAttachToken = "test-attach-token_0123"

// fakePTYHost is an in-test GET /api/pty: it upgrades every request and
// hands the connection to the test, which then speaks the host's side of
// the protocol step by step.
type fakePTYHost struct {
	url    string        // http://127.0.0.1:PORT
	conns  chan *fakePTY // upgraded connections, in order
	dials  atomic.Int32  // requests seen
	refuse atomic.Bool   // answer 503 instead of upgrading

	mu  sync.Mutex // guards the field below
	all []net.Conn
}

func newFakePTYHost(t testing.TB) *fakePTYHost {
	t.Helper()
	f := &fakePTYHost{conns: make(chan *fakePTY, 16)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.dials.Add(1)
		if r.URL.Path != "/api/pty" {
			http.NotFound(w, r)
			return
		}
		if f.refuse.Load() {
			http.Error(w, "not now", http.StatusServiceUnavailable)
			return
		}
		conn, rw, _, err := ws.HTTPUpgrader{}.Upgrade(r, w)
		if err != nil {
			return
		}
		f.mu.Lock()
		f.all = append(f.all, conn)
		f.mu.Unlock()
		f.conns <- &fakePTY{t: t, conn: conn, rw: struct {
			io.Reader
			io.Writer
		}{rw.Reader, conn}, query: r.URL.Query(), auth: r.Header.Get("Authorization")}
	}))
	t.Cleanup(func() {
		srv.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range f.all {
			_ = c.Close()
		}
	})
	f.url = srv.URL
	return f
}

// accept returns the client's next connection, failing when the client
// exits first.
func (f *fakePTYHost) accept(t testing.TB, c *testAttach) *fakePTY {
	t.Helper()
	select {
	case p := <-f.conns:
		return p
	case <-c.done:
		t.Fatalf("client exited with %d before connecting; stderr: %q", c.code, c.stderr.String())
	case <-time.After(testWait):
		t.Fatal("no connection from the client")
	}
	return nil
}

// fakePTY is the host's end of one connection.
type fakePTY struct {
	t     testing.TB
	conn  net.Conn
	rw    io.ReadWriter
	query url.Values
	auth  string // the Authorization header
}

func (p *fakePTY) replay(epoch string, start, end int64, reset bool, reason string) {
	p.t.Helper()
	msg, err := json.Marshal(map[string]any{
		"type": "pty.replay", "epoch": epoch, "start_offset": start,
		"replay_end_offset": end, "reset": reset, "reason": reason,
	})
	if err != nil {
		p.t.Fatal(err)
	}
	if err := wsutil.WriteServerText(p.conn, msg); err != nil {
		p.t.Fatalf("send pty.replay: %v", err)
	}
}

func (p *fakePTY) output(s string) {
	p.t.Helper()
	if err := wsutil.WriteServerBinary(p.conn, []byte(s)); err != nil {
		p.t.Fatalf("send output: %v", err)
	}
}

// read returns the client's next data message.
func (p *fakePTY) read() (ws.OpCode, string) {
	p.t.Helper()
	_ = p.conn.SetReadDeadline(time.Now().Add(testWait))
	msg, op, err := wsutil.ReadClientData(p.rw)
	if err != nil {
		p.t.Fatalf("read from client: %v", err)
	}
	return op, string(msg)
}

// readClose expects the client's next frame to be a close frame, and
// returns its code.
func (p *fakePTY) readClose() ws.StatusCode {
	p.t.Helper()
	_ = p.conn.SetReadDeadline(time.Now().Add(testWait))
	msg, op, err := wsutil.ReadClientData(p.rw)
	var ce wsutil.ClosedError
	if !errors.As(err, &ce) {
		p.t.Fatalf("got %v %q %v from the client, want a close frame", op, msg, err)
	}
	return ce.Code
}

// closeWith closes the connection the way the host does: a close frame,
// the client's reply, then the socket.
func (p *fakePTY) closeWith(code ws.StatusCode, reason string) {
	p.t.Helper()
	if err := ws.WriteFrame(p.conn, ws.NewCloseFrame(ws.NewCloseFrameBody(code, reason))); err != nil {
		p.t.Fatalf("send close: %v", err)
	}
	_ = p.conn.SetReadDeadline(time.Now().Add(testWait))
	for {
		if _, _, err := wsutil.ReadClientData(p.rw); err != nil {
			break
		}
	}
	_ = p.conn.Close()
}

// drop cuts the TCP connection without a close frame (1006).
func (p *fakePTY) drop() { _ = p.conn.Close() }

// wantQuery checks the query of the request, and its access token: want
// "token" is the bearer token of the Authorization header (a token never
// travels in the URL).
func (p *fakePTY) wantQuery(want map[string]string) {
	p.t.Helper()
	for _, k := range []string{"attach", "view", "offset", "epoch", "cols", "rows"} {
		if got := p.query.Get(k); got != want[k] {
			p.t.Errorf("query %s=%q, want %q (query %s)", k, got, want[k], p.query.Encode())
		}
	}
	if p.query.Has("token") {
		p.t.Errorf("query %s carries the access token", p.query.Encode())
	}
	wantAuth := ""
	if want["token"] != "" {
		wantAuth = "Bearer " + want["token"]
	}
	if p.auth != wantAuth {
		p.t.Errorf("Authorization %q, want %q", p.auth, wantAuth)
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and many waiters.
type syncBuffer struct {
	mu      sync.Mutex // guards the fields below
	b       bytes.Buffer
	changed chan struct{} // closed and replaced on every write
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor waits until the buffer contains sub.
func (s *syncBuffer) waitFor(t testing.TB, sub string) {
	t.Helper()
	timeout := time.After(testWait)
	for {
		s.mu.Lock()
		if strings.Contains(s.b.String(), sub) {
			s.mu.Unlock()
			return
		}
		if s.changed == nil {
			s.changed = make(chan struct{})
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("waiting for %q, have %q", sub, s.String())
		}
	}
}

// testAttach is an attachClient running against a fakePTYHost, with
// stdin a pipe the test types into.
type testAttach struct {
	a      *attachClient
	stdout syncBuffer
	stderr syncBuffer
	stdin  *io.PipeWriter
	stdinR *io.PipeReader
	cancel context.CancelFunc
	done   chan struct{} // closed when run has returned code
	code   int
	typing sync.WaitGroup
}

func startAttach(t testing.TB, host *fakePTYHost, setup func(*attachClient)) *testAttach {
	t.Helper()
	endpoint, _, err := ptyEndpoint(host.url)
	if err != nil {
		t.Fatal(err)
	}
	c := &testAttach{done: make(chan struct{})}
	c.a = newAttachClient(endpoint, "sekrit", testAttachToken, false)
	pr, pw := io.Pipe()
	c.stdin, c.stdinR = pw, pr
	c.a.stdin, c.a.stdout, c.a.stderr = pr, &c.stdout, &c.stderr
	c.a.backoff = []time.Duration{time.Millisecond}
	c.a.pingEvery = 0
	c.a.closeWait = testWait
	if setup != nil {
		setup(c.a)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() {
		c.code = c.a.run(ctx)
		close(c.done)
	}()
	t.Cleanup(func() {
		cancel()
		_ = pw.Close()
		_ = pr.Close()
		select {
		case <-c.done:
		case <-time.After(testWait):
			t.Error("client did not exit")
		}
		c.typing.Wait()
	})
	return c
}

// typeIn writes s to the client's stdin.
func (c *testAttach) typeIn(t testing.TB, s string) {
	t.Helper()
	written := make(chan error, 1)
	c.typing.Add(1)
	go func() {
		defer c.typing.Done()
		_, err := c.stdin.Write([]byte(s))
		written <- err
	}()
	select {
	case err := <-written:
		if err != nil {
			t.Fatalf("stdin: %v", err)
		}
	case <-c.done:
		// The client may have exited right after reading s (~.): closing
		// the pipe tells that apart from s never being read.
		_ = c.stdinR.Close()
		if err := <-written; err != nil {
			t.Fatalf("client exited with %d before reading %q; stderr: %q", c.code, s, c.stderr.String())
		}
	case <-time.After(testWait):
		t.Fatal("client does not read stdin")
	}
}

// wait returns the client's exit status.
func (c *testAttach) wait(t testing.TB) int {
	t.Helper()
	select {
	case <-c.done:
		return c.code
	case <-time.After(testWait):
		t.Fatalf("client did not exit; stderr: %q", c.stderr.String())
	}
	return 0
}

func TestAttachOutputExactlyOnceAcrossReattach(t *testing.T) {
	for _, tc := range []struct {
		name string
		code ws.StatusCode // how the first connection ends; 0 = TCP drop
	}{
		{"tcp drop", 0},
		{"going away 1001", ws.StatusGoingAway},
		{"restart 1012", 1012},
		{"too slow 1013", 1013},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := newFakePTYHost(t)
			c := startAttach(t, host, nil)

			p := host.accept(t, c)
			p.wantQuery(map[string]string{"attach": testAttachToken, "token": "sekrit"})
			p.replay("e1", 0, 5, true, "initial")
			p.output("hello")
			c.typeIn(t, "abc")
			if op, msg := p.read(); op != ws.OpBinary || msg != "abc" {
				t.Fatalf("got %v %q from the client, want binary %q", op, msg, "abc")
			}
			p.output("abc") // the PTY echoes
			c.stdout.waitFor(t, "helloabc")
			if tc.code == 0 {
				p.drop()
			} else {
				p.closeWith(tc.code, "")
			}

			p = host.accept(t, c)
			p.wantQuery(map[string]string{"attach": testAttachToken, "token": "sekrit", "offset": "8", "epoch": "e1"})
			p.replay("e1", 0, 10, false, "resume")
			p.output("XY") // what the PTY wrote while the client was away
			p.closeWith(4410, "exited")

			if code := c.wait(t); code != 0 {
				t.Errorf("exit status %d, want 0", code)
			}
			if got, want := c.stdout.String(), "helloabcXY"; got != want {
				t.Errorf("stdout %q, want %q", got, want)
			}
			stderr := c.stderr.String()
			if n := strings.Count(stderr, "tether: connection lost, reconnecting…\n"); n != 1 {
				t.Errorf("%d reconnect lines in stderr %q, want 1", n, stderr)
			}
			if !strings.Contains(stderr, "tether: session ended (4410)\n") {
				t.Errorf("stderr %q, want the 4410 line", stderr)
			}
		})
	}
}

// TestAttachReattachReset: a reattach the host could not resume starts
// a new window; on a terminal the screen and its scrollback are cleared
// first, to a file or a pipe nothing of tether's own is written.
func TestAttachReattachReset(t *testing.T) {
	for _, onTerm := range []bool{true, false} {
		t.Run(map[bool]string{true: "terminal", false: "pipe"}[onTerm], func(t *testing.T) {
			host := newFakePTYHost(t)
			c := startAttach(t, host, func(a *attachClient) { a.term = onTerm })

			p := host.accept(t, c)
			p.replay("e1", 0, 5, true, "initial")
			p.output("hello")
			c.stdout.waitFor(t, "hello")
			p.drop()

			p = host.accept(t, c)
			p.wantQuery(map[string]string{"attach": testAttachToken, "token": "sekrit", "offset": "5", "epoch": "e1"})
			p.replay("e2", 100, 103, true, "epoch_mismatch")
			p.output("new")
			c.stdout.waitFor(t, "new")
			p.drop()

			p = host.accept(t, c)
			p.wantQuery(map[string]string{"attach": testAttachToken, "token": "sekrit", "offset": "103", "epoch": "e2"})
			p.replay("e2", 100, 103, false, "resume")
			p.closeWith(4410, "")

			if code := c.wait(t); code != 0 {
				t.Errorf("exit status %d, want 0", code)
			}
			want := "hello" + "new"
			if onTerm {
				want = "hello" + clearScreen + clearScrollback + "new" + c.a.alt.leave() + freshLine
			}
			if got := c.stdout.String(); got != want {
				t.Errorf("stdout %q, want %q", got, want)
			}
		})
	}
}

func TestAttachResize(t *testing.T) {
	host := newFakePTYHost(t)
	var cols, rows atomic.Int32
	cols.Store(100)
	rows.Store(30)
	winch := make(chan os.Signal, 1)
	c := startAttach(t, host, func(a *attachClient) {
		a.size = func() (int, int, bool) { return int(cols.Load()), int(rows.Load()), true }
		a.winch = winch
	})

	p := host.accept(t, c)
	p.wantQuery(map[string]string{"attach": testAttachToken, "token": "sekrit", "cols": "100", "rows": "30"})
	p.replay("e1", 0, 0, true, "initial")
	if op, msg := p.read(); op != ws.OpText || msg != "\x1b[RESIZE:100;30]" {
		t.Fatalf("got %v %q on connect, want text %q", op, msg, "\x1b[RESIZE:100;30]")
	}
	cols.Store(120)
	rows.Store(40)
	winch <- syscall.SIGWINCH
	if op, msg := p.read(); op != ws.OpText || msg != "\x1b[RESIZE:120;40]" {
		t.Fatalf("got %v %q after SIGWINCH, want text %q", op, msg, "\x1b[RESIZE:120;40]")
	}
	p.drop()

	// Resized while away: the reattach asks for the size of now, with
	// its cursor, and sends it again.
	cols.Store(90)
	rows.Store(25)
	p = host.accept(t, c)
	p.wantQuery(map[string]string{"attach": testAttachToken, "token": "sekrit", "offset": "0", "epoch": "e1", "cols": "90", "rows": "25"})
	p.replay("e1", 0, 0, false, "resume")
	if op, msg := p.read(); op != ws.OpText || msg != "\x1b[RESIZE:90;25]" {
		t.Fatalf("got %v %q on reattach, want text %q", op, msg, "\x1b[RESIZE:90;25]")
	}
	p.closeWith(4410, "")
	if code := c.wait(t); code != 0 {
		t.Errorf("exit status %d, want 0", code)
	}
}

func TestAttachViewSendsNothing(t *testing.T) {
	host := newFakePTYHost(t)
	winch := make(chan os.Signal, 1)
	c := startAttach(t, host, func(a *attachClient) {
		a.view = true
		a.size = func() (int, int, bool) { return 80, 24, true }
		a.winch = winch
	})
	p := host.accept(t, c)
	p.wantQuery(map[string]string{"attach": testAttachToken, "token": "sekrit", "view": "1"})
	p.replay("e1", 0, 1, true, "initial")
	p.output("x")
	c.stdout.waitFor(t, "x")
	winch <- syscall.SIGWINCH
	c.typeIn(t, "rm -rf /\r")
	c.typeIn(t, "~.")
	// Frames arrive in order: had the client sent input or a resize, it
	// would come before its close frame.
	if code := p.readClose(); code != ws.StatusNormalClosure {
		t.Errorf("close code %d, want 1000", code)
	}
	if code := c.wait(t); code != 0 {
		t.Errorf("exit status %d, want 0", code)
	}
	if got := c.stderr.String(); !strings.Contains(got, "tether: detached\n") {
		t.Errorf("stderr %q, want %q", got, "tether: detached")
	}
}

func TestAttachEscapeDetaches(t *testing.T) {
	host := newFakePTYHost(t)
	c := startAttach(t, host, nil)
	p := host.accept(t, c)
	p.replay("e1", 0, 0, true, "initial")
	for _, tc := range []struct{ typed, sent string }{
		{"a~.\r", "a~.\r"}, // not at the start of a line
		{"~~x\r", "~x\r"},  // ~~ sends one ~
		{"~x", "~x"},       // ~ and anything else goes out as typed
		{"\r", "\r"},
	} {
		c.typeIn(t, tc.typed)
		if op, msg := p.read(); op != ws.OpBinary || msg != tc.sent {
			t.Fatalf("typed %q: got %v %q, want binary %q", tc.typed, op, msg, tc.sent)
		}
	}
	c.typeIn(t, "~.")
	if code := p.readClose(); code != ws.StatusNormalClosure {
		t.Errorf("close code %d, want 1000", code)
	}
	if code := c.wait(t); code != 0 {
		t.Errorf("exit status %d, want 0", code)
	}
	if got, want := c.stderr.String(), "tether: attached; Enter ~. to detach\ntether: detached\n"; got != want {
		t.Errorf("stderr %q, want %q", got, want)
	}
}

func TestAttachEscapeWhileReconnecting(t *testing.T) {
	host := newFakePTYHost(t)
	c := startAttach(t, host, func(a *attachClient) { a.backoff = []time.Duration{time.Hour} })
	p := host.accept(t, c)
	p.replay("e1", 0, 0, true, "initial")
	p.drop()
	c.stderr.waitFor(t, "reconnecting")
	c.typeIn(t, "~.")
	if code := c.wait(t); code != 0 {
		t.Errorf("exit status %d, want 0", code)
	}
	if got := c.stderr.String(); !strings.HasSuffix(got, "tether: detached\n") {
		t.Errorf("stderr %q, want it to end with %q", got, "tether: detached\n")
	}
}

func TestAttachInputWhileReconnecting(t *testing.T) {
	host := newFakePTYHost(t)
	c := startAttach(t, host, nil)
	p := host.accept(t, c)
	p.replay("e1", 0, 0, true, "initial")
	host.refuse.Store(true)
	p.drop()
	c.stderr.waitFor(t, "reconnecting")
	c.typeIn(t, "ls\r")
	host.refuse.Store(false)
	p = host.accept(t, c)
	p.replay("e1", 0, 0, false, "resume")
	if op, msg := p.read(); op != ws.OpBinary || msg != "ls\r" {
		t.Fatalf("got %v %q, want the held input %q", op, msg, "ls\r")
	}
	p.closeWith(4410, "")
	if code := c.wait(t); code != 0 {
		t.Errorf("exit status %d, want 0", code)
	}
}

func TestEscaper(t *testing.T) {
	for _, tc := range []struct {
		name   string
		chunks []string
		sent   string
		detach bool
	}{
		{"escape first", []string{"~."}, "", true},
		{"after CR", []string{"ls\r~.rest"}, "ls\r", true},
		{"after LF", []string{"ls\n~."}, "ls\n", true},
		{"split", []string{"ls\r~", "."}, "ls\r", true},
		{"mid line", []string{"a~."}, "a~.", false},
		{"double tilde", []string{"~~."}, "~.", false},
		{"tilde other", []string{"~x~."}, "~x~.", false},
		{"tilde newline", []string{"~\r~."}, "~\r", true},
		{"ctrl chars plain", []string{"\x03\x1c\x1a"}, "\x03\x1c\x1a", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := escaper{lineStart: true}
			var sent []byte
			detach := false
			for _, ch := range tc.chunks {
				out, d := e.feed([]byte(ch))
				sent = append(sent, out...)
				if d {
					detach = true
					break
				}
			}
			if string(sent) != tc.sent || detach != tc.detach {
				t.Errorf("got %q detach=%v, want %q detach=%v", sent, detach, tc.sent, tc.detach)
			}
		})
	}
}

func TestAttachCloseCodes(t *testing.T) {
	for _, tc := range []struct {
		code     ws.StatusCode
		reason   string
		attached bool // the host refuses before pty.replay unless set
		exit     int
		line     string
	}{
		{4409, "superseded", true, 1, "tether: detached: the terminal was opened elsewhere (4409)"},
		{4410, "exited", true, 0, "tether: session ended (4410)"},
		{4401, "", false, 1, "tether: the host refused the access token (4401 unauthorized): set TETHER_TOKEN to the host's token, or run this as the host's user on its machine so that its token file (<state-dir>/token) is read"},
		{4403, "", false, 1, "tether: refused: Host or Origin not allowed (4403)"},
		{4408, "", false, 1, "tether: refused: the host accepts loopback clients only (4408)"},
		{4400, "", false, 1, "tether: refused: malformed attach token or offset (4400)"},
		{4404, "", false, 1, "tether: refused: the PTY endpoint is switched off (4404)"},
		{4411, "no such terminal", false, 1, "tether: no such terminal (4411)"},
		{1011, "registry full", false, 1, "tether: host error: registry full (1011)"},
	} {
		t.Run(tc.line, func(t *testing.T) {
			host := newFakePTYHost(t)
			c := startAttach(t, host, nil)
			p := host.accept(t, c)
			if tc.attached {
				p.replay("e1", 0, 2, true, "initial")
				p.output("ok")
				c.stdout.waitFor(t, "ok")
			}
			p.closeWith(tc.code, tc.reason)
			if code := c.wait(t); code != tc.exit {
				t.Errorf("exit status %d, want %d", code, tc.exit)
			}
			want := tc.line + "\n"
			if tc.attached {
				want = "tether: attached; Enter ~. to detach\n" + want
			}
			if got := c.stderr.String(); got != want {
				t.Errorf("stderr %q, want %q", got, want)
			}
			if n := host.dials.Load(); n != 1 {
				t.Errorf("%d connections, want 1 (no reconnect)", n)
			}
		})
	}
}

func TestAttachCancelDetachesPolitely(t *testing.T) {
	host := newFakePTYHost(t)
	c := startAttach(t, host, nil)
	p := host.accept(t, c)
	p.replay("e1", 0, 1, true, "initial")
	p.output("x")
	c.stdout.waitFor(t, "x") // attached
	c.cancel()
	if code := p.readClose(); code != ws.StatusNormalClosure {
		t.Errorf("close code %d, want 1000", code)
	}
	if code := c.wait(t); code != 1 {
		t.Errorf("exit status %d, want 1", code)
	}
}

func TestAttachAnswersPing(t *testing.T) {
	host := newFakePTYHost(t)
	c := startAttach(t, host, nil)
	p := host.accept(t, c)
	p.replay("e1", 0, 0, true, "initial")
	if err := ws.WriteFrame(p.conn, ws.NewPingFrame([]byte("are you there"))); err != nil {
		t.Fatal(err)
	}
	_ = p.conn.SetReadDeadline(time.Now().Add(testWait))
	h, err := ws.ReadHeader(p.rw)
	if err != nil {
		t.Fatal(err)
	}
	if h.Length > 125 {
		t.Fatalf("control frame of %d bytes", h.Length)
	}
	payload := make([]byte, h.Length)
	if _, err := io.ReadFull(p.rw, payload); err != nil {
		t.Fatal(err)
	}
	f := ws.Frame{Header: h, Payload: payload}
	if !f.Header.Masked {
		t.Error("pong not masked")
	}
	f = ws.UnmaskFrameInPlace(f)
	if f.Header.OpCode != ws.OpPong || string(f.Payload) != "are you there" {
		t.Errorf("got %v %q, want pong %q", f.Header.OpCode, f.Payload, "are you there")
	}
	p.closeWith(4410, "")
	if code := c.wait(t); code != 0 {
		t.Errorf("exit status %d, want 0", code)
	}
}

func TestAttachGivesUp(t *testing.T) {
	host := newFakePTYHost(t)
	c := startAttach(t, host, func(a *attachClient) { a.retryFor = 50 * time.Millisecond })
	p := host.accept(t, c)
	p.replay("e1", 0, 0, true, "initial")
	host.refuse.Store(true)
	p.drop()
	if code := c.wait(t); code != 1 {
		t.Errorf("exit status %d, want 1", code)
	}
	if got := c.stderr.String(); !strings.Contains(got, "tether: gave up reconnecting after 50ms") {
		t.Errorf("stderr %q, want the give-up line", got)
	}
	if n := host.dials.Load(); n < 2 {
		t.Errorf("%d dials, want retries", n)
	}
}

func TestAttachNoHost(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := startAttach(t, &fakePTYHost{url: "http://" + addr}, nil)
	if code := c.wait(t); code != 1 {
		t.Errorf("exit status %d, want 1", code)
	}
	if got := c.stderr.String(); !strings.HasPrefix(got, "tether: cannot attach at "+addr+": ") {
		t.Errorf("stderr %q, want the cannot-attach line", got)
	}
}

func TestAttachNew(t *testing.T) {
	seen := map[string]bool{}
	for range 3 {
		var stderr bytes.Buffer
		a, code := parseAttach([]string{"--new"}, &stderr)
		if a == nil {
			t.Fatalf("--new: status %d, stderr %q", code, stderr.String())
		}
		if got := stderr.String(); got != "" || !a.fresh {
			t.Errorf("stderr %q, fresh %v; want the token kept for the attachment (see TestAttachAnnounces)", got, a.fresh)
		}
		if !wire.ValidAttachToken(a.attach) || strings.HasPrefix(a.attach, "-") {
			t.Errorf("token %q is not a valid attach token", a.attach)
		}
		if seen[a.attach] {
			t.Errorf("token %q repeated", a.attach)
		}
		seen[a.attach] = true
	}
}

func TestAttachFlags(t *testing.T) {
	t.Setenv("TETHER_URL", "")
	t.Setenv("TETHER_TOKEN", "")
	t.Setenv("TETHER_VIEW", "")
	t.Setenv("TETHER_NEW", "")
	os.Unsetenv("TETHER_URL")
	os.Unsetenv("TETHER_TOKEN")
	os.Unsetenv("TETHER_VIEW")
	os.Unsetenv("TETHER_NEW")
	for _, tc := range []struct {
		name     string
		env      map[string]string
		args     []string
		status   int    // 0 with a client
		endpoint string // want, with a client
		token    string
		view     bool
		stderr   string // substring, without a client
	}{
		{name: "defaults", args: []string{testAttachToken}, endpoint: "ws://127.0.0.1:7717/api/pty"},
		{name: "flags", args: []string{"--view", "--url", "https://h.example:8443/pre/", "--token", "T", testAttachToken},
			endpoint: "wss://h.example:8443/pre/api/pty", token: "T", view: true},
		{name: "env", env: map[string]string{"TETHER_URL": "http://10.0.0.1:1", "TETHER_TOKEN": "envtok"},
			args: []string{testAttachToken}, endpoint: "ws://10.0.0.1:1/api/pty", token: "envtok"},
		{name: "flag beats env", env: map[string]string{"TETHER_TOKEN": "envtok"},
			args: []string{"--token", "flagtok", testAttachToken}, endpoint: "ws://127.0.0.1:7717/api/pty", token: "flagtok"},
		{name: "token in url", args: []string{"--url", "http://127.0.0.1:9/?token=fromurl", testAttachToken},
			endpoint: "ws://127.0.0.1:9/api/pty", token: "fromurl"},
		{name: "no token", status: 2, stderr: "usage: tether attach"},
		{name: "two tokens", args: []string{testAttachToken, testAttachToken}, status: 2, stderr: "want one attach token"},
		{name: "flag after token", args: []string{testAttachToken, "--view"}, status: 2, stderr: "want one attach token"},
		{name: "new with token", args: []string{"--new", testAttachToken}, status: 2, stderr: "--new takes no attach token"},
		{name: "bad url", args: []string{"--url", "ftp://x", testAttachToken}, status: 2, stderr: "want http(s)://host:port"},
		{name: "short token", args: []string{"short"}, status: 2, stderr: "invalid attach token"},
		{name: "bad char", args: []string{"0123456789abcdef!"}, status: 2, stderr: "invalid attach token"},
		{name: "too long", args: []string{strings.Repeat("a", 129)}, status: 2, stderr: "invalid attach token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stderr bytes.Buffer
			a, status := parseAttach(tc.args, &stderr)
			if tc.endpoint == "" {
				if a != nil || status != tc.status || !strings.Contains(stderr.String(), tc.stderr) {
					t.Errorf("got client %v, status %d, stderr %q; want none, %d, %q", a != nil, status, stderr.String(), tc.status, tc.stderr)
				}
				return
			}
			if a == nil {
				t.Fatalf("status %d, stderr %q", status, stderr.String())
			}
			if a.endpoint.String() != tc.endpoint || a.token != tc.token || a.view != tc.view || a.attach != testAttachToken {
				t.Errorf("got %s token %q view %v attach %q; want %s %q %v %q",
					a.endpoint, a.token, a.view, a.attach, tc.endpoint, tc.token, tc.view, testAttachToken)
			}
		})
	}
}

func TestAttachInvalidTokenNotDialed(t *testing.T) {
	host := newFakePTYHost(t)
	for _, tok := range []string{"short", "0123456789abcdef!", "0123456789 abcdef", strings.Repeat("x", 129), "ééééééééééééééééé"} {
		if status := run([]string{"attach", "--url", host.url, tok}); status != 2 {
			t.Errorf("attach %q: status %d, want 2", tok, status)
		}
	}
	if n := host.dials.Load(); n != 0 {
		t.Errorf("%d connections, want none", n)
	}
}

// TestAttachRawTerminal runs the terminal wrapper on a real PTY: raw
// mode while attached (so "\r~." arrives unbuffered and detaches),
// the size on connect and on SIGWINCH, and the exact terminal state
// back afterwards.
func TestAttachRawTerminal(t *testing.T) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no PTY: %v", err)
	}
	// pty.Open leaves the master in blocking mode; a non-blocking dup
	// lets Close interrupt the reader below.
	mfd, err := unix.Dup(int(ptmx.Fd()))
	ptmx.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.SetNonblock(mfd, true); err != nil {
		t.Fatal(err)
	}
	master := os.NewFile(uintptr(mfd), "ptmx")
	var screen syncBuffer
	drained := make(chan struct{})
	go func() {
		_, _ = io.Copy(&screen, master)
		close(drained)
	}()
	t.Cleanup(func() {
		master.Close() // hangs up the tty: the client's stdin read ends
		<-drained
		tty.Close()
	})

	ttyFd := int(tty.Fd())
	setSize := func(cols, rows uint16) {
		t.Helper()
		if err := unix.IoctlSetWinsize(ttyFd, unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows}); err != nil {
			t.Fatal(err)
		}
	}
	termios := func() unix.Termios {
		t.Helper()
		st, err := unix.IoctlGetTermios(ttyFd, unix.TCGETS)
		if err != nil {
			t.Fatal(err)
		}
		return *st
	}
	setSize(91, 37)
	before := termios()
	if before.Lflag&unix.ICANON == 0 {
		t.Fatal("the new PTY is not in canonical mode")
	}

	host := newFakePTYHost(t)
	endpoint, _, err := ptyEndpoint(host.url)
	if err != nil {
		t.Fatal(err)
	}
	a := newAttachClient(endpoint, "sekrit", testAttachToken, false)
	var stderr syncBuffer
	a.stderr = &stderr
	a.pingEvery = 0
	c := &testAttach{a: a, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		c.code = runTerminal(ctx, a, tty, tty)
		close(c.done)
	}()
	t.Cleanup(func() {
		cancel()
		<-c.done
	})

	p := host.accept(t, c)
	p.replay("e1", 0, 2, true, "initial")
	p.output("hi")
	if op, msg := p.read(); op != ws.OpText || msg != "\x1b[RESIZE:91;37]" {
		t.Fatalf("got %v %q on connect, want text %q", op, msg, "\x1b[RESIZE:91;37]")
	}
	during := termios()
	if during.Lflag&(unix.ICANON|unix.ECHO|unix.ISIG) != 0 || during.Iflag&unix.ICRNL != 0 || during.Oflag&unix.OPOST != 0 {
		t.Errorf("terminal not raw while attached: lflag %#x iflag %#x oflag %#x", during.Lflag, during.Iflag, during.Oflag)
	}
	screen.waitFor(t, "hi")

	setSize(100, 50)
	if err := syscall.Kill(os.Getpid(), syscall.SIGWINCH); err != nil {
		t.Fatal(err)
	}
	if op, msg := p.read(); op != ws.OpText || msg != "\x1b[RESIZE:100;50]" {
		t.Fatalf("got %v %q after SIGWINCH, want text %q", op, msg, "\x1b[RESIZE:100;50]")
	}

	if _, err := master.Write([]byte("\r~.")); err != nil {
		t.Fatal(err)
	}
	if op, msg := p.read(); op != ws.OpBinary || msg != "\r" {
		t.Fatalf("got %v %q, want binary %q", op, msg, "\r")
	}
	if code := p.readClose(); code != ws.StatusNormalClosure {
		t.Errorf("close code %d, want 1000", code)
	}
	select {
	case <-c.done:
	case <-time.After(testWait):
		t.Fatal("client did not exit on ~.")
	}
	if c.code != 0 {
		t.Errorf("exit status %d, want 0", c.code)
	}
	if got, want := stderr.String(), "\r\ntether: attached; Enter ~. to detach\r\ntether: detached\r\n"; got != want {
		t.Errorf("stderr %q, want %q", got, want)
	}
	if after := termios(); after != before {
		t.Errorf("terminal state not restored:\nbefore %+v\nafter  %+v", before, after)
	}
}
