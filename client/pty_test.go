package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

const tok = "test-attach-token_0123"

// attachPTY attaches to h while h answers with r; the PTY is aborted at
// the end of the test.
func attachPTY(t *testing.T, h *fakeHost, o client.PTYOptions, r wire.Replay) (*client.PTY, *peer) {
	t.Helper()
	ch := background(t, func() (*client.PTY, error) { return client.AttachPTY(ctxT(t), h.URL, tok, o) })
	p := h.next(t)
	p.replay(r)
	c, err := wait(t, ch)
	if err != nil {
		t.Fatalf("AttachPTY: %v", err)
	}
	t.Cleanup(c.Abort)
	return c, p
}

// readN reads n bytes from c and the offset after each Read.
func readN(t *testing.T, c *client.PTY, n int) (string, []int64) {
	t.Helper()
	var out []byte
	var offs []int64
	buf := make([]byte, 64)
	for len(out) < n {
		k, err := c.Read(buf)
		if err != nil {
			t.Fatalf("Read after %q: %v", out, err)
		}
		out = append(out, buf[:k]...)
		offs = append(offs, c.Offset())
	}
	return string(out), offs
}

func TestAttachRequest(t *testing.T) {
	for _, tt := range []struct {
		name  string
		base  string
		o     client.PTYOptions
		query string
	}{
		{"fresh", "", client.PTYOptions{Options: client.Options{Token: "sekrit"}}, "attach=" + tok},
		{"cursor", "/?token=sekrit", client.PTYOptions{HasCursor: true, Offset: 7, Epoch: "e1"}, "attach=" + tok + "&epoch=e1&offset=7"},
		{"view", "", client.PTYOptions{Options: client.Options{Token: "sekrit"}, View: true}, "attach=" + tok + "&view=1"},
		{"size", "", client.PTYOptions{Options: client.Options{Token: "sekrit"}, Cols: 100, Rows: 30}, "attach=" + tok + "&cols=100&rows=30"},
		{"view drops the size", "", client.PTYOptions{Options: client.Options{Token: "sekrit"}, View: true, Cols: 100, Rows: 30}, "attach=" + tok + "&view=1"},
		{"half a size", "", client.PTYOptions{Options: client.Options{Token: "sekrit"}, Cols: 100}, "attach=" + tok},
		{"a size no resize can ask for", "", client.PTYOptions{Options: client.Options{Token: "sekrit"}, Cols: 10001, Rows: 30}, "attach=" + tok},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newFakeHost(t)
			ch := background(t, func() (*client.PTY, error) { return client.AttachPTY(ctxT(t), h.URL+tt.base, tok, tt.o) })
			p := h.next(t)
			p.replay(wire.Replay{Epoch: "e1", StartOffset: 0, ReplayEndOffset: 7, Reset: !tt.o.HasCursor, Reason: map[bool]string{true: "resume", false: "initial"}[tt.o.HasCursor]})
			c, err := wait(t, ch)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Abort()
			if p.path != "/api/pty" || p.query.Encode() != tt.query || p.header.Get("Authorization") != "Bearer sekrit" {
				t.Errorf("request %s (Authorization %q), want /api/pty?%s with the token as a bearer", p.uri, p.header.Get("Authorization"), tt.query)
			}
		})
	}
	t.Run("invalid token", func(t *testing.T) {
		h := newFakeHost(t)
		for _, bad := range []string{"short", "0123456789abcdef!", strings.Repeat("a", 129)} {
			if _, err := client.AttachPTY(ctxT(t), h.URL, bad, client.PTYOptions{}); !errors.Is(err, client.ErrInvalidAttachToken) {
				t.Errorf("AttachPTY(%q): %v", bad, err)
			}
		}
		if n := h.dials.Load(); n != 0 {
			t.Errorf("%d dials for invalid tokens", n)
		}
	})
}

func TestPTYOffsets(t *testing.T) {
	t.Run("reset counts from start_offset", func(t *testing.T) {
		h := newFakeHost(t)
		c, p := attachPTY(t, h, client.PTYOptions{HasCursor: true, Offset: 3, Epoch: "old"},
			wire.Replay{Epoch: "e2", StartOffset: 100, ReplayEndOffset: 105, Reset: true, Reason: wire.ReasonEpochMismatch})
		if c.Offset() != 100 || c.Epoch() != "e2" || c.Replay().Reason != wire.ReasonEpochMismatch {
			t.Fatalf("after the header: offset %d epoch %q replay %+v", c.Offset(), c.Epoch(), c.Replay())
		}
		p.binary("hello")
		p.binary("live")
		if out, offs := readN(t, c, 9); out != "hellolive" || offs[len(offs)-1] != 109 {
			t.Errorf("read %q, offsets %v; want hellolive ending at 109", out, offs)
		}
	})
	t.Run("resume counts from the cursor", func(t *testing.T) {
		h := newFakeHost(t)
		c, p := attachPTY(t, h, client.PTYOptions{HasCursor: true, Offset: 8, Epoch: "e1"},
			wire.Replay{Epoch: "e1", StartOffset: 0, ReplayEndOffset: 10, Reason: wire.ReasonResume})
		if c.Offset() != 8 {
			t.Fatalf("offset %d after a resume from 8", c.Offset())
		}
		p.binary("XY")
		if out, offs := readN(t, c, 2); out != "XY" || offs[len(offs)-1] != 10 {
			t.Errorf("read %q, offsets %v", out, offs)
		}
	})
	t.Run("snapshot bytes do not count", func(t *testing.T) {
		h := newFakeHost(t)
		c, p := attachPTY(t, h, client.PTYOptions{},
			wire.Replay{Epoch: "e1", StartOffset: 500, ReplayEndOffset: 500, Reset: true, Reason: wire.ReasonInitial,
				Snapshot: true, SnapshotBytes: 10, Cols: 80, Rows: 24})
		if c.Offset() != 500 {
			t.Fatalf("offset %d after a snapshot header, want 500", c.Offset())
		}
		// The last frame of the snapshot carries live bytes too.
		p.binary("\x1b[2J")
		p.binary("screenLIVE")
		p.binary("more")
		buf := make([]byte, 64)
		var snap, live []byte
		for len(snap)+len(live) < 18 {
			before := c.Offset()
			n, err := c.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			if c.Offset() == before {
				snap = append(snap, buf[:n]...)
			} else {
				if c.Offset()-before != int64(n) {
					t.Fatalf("a Read of %q moved the offset by %d: snapshot and live bytes mixed", buf[:n], c.Offset()-before)
				}
				live = append(live, buf[:n]...)
			}
		}
		if string(snap) != "\x1b[2Jscreen" || string(live) != "LIVEmore" || c.Offset() != 508 {
			t.Errorf("snapshot %q, live %q, offset %d; want 10 snapshot bytes, then LIVEmore from 500 to 508", snap, live, c.Offset())
		}
	})
	t.Run("resume without a cursor", func(t *testing.T) {
		h := newFakeHost(t)
		ch := background(t, func() (*client.PTY, error) { return client.AttachPTY(ctxT(t), h.URL, tok, client.PTYOptions{}) })
		h.next(t).replay(wire.Replay{Epoch: "e1", ReplayEndOffset: 4, Reason: wire.ReasonResume})
		if _, err := wait(t, ch); !errors.Is(err, client.ErrProtocol) {
			t.Errorf("AttachPTY: %v, want ErrProtocol", err)
		}
	})
	t.Run("cursor outside the window", func(t *testing.T) {
		h := newFakeHost(t)
		ch := background(t, func() (*client.PTY, error) {
			return client.AttachPTY(ctxT(t), h.URL, tok, client.PTYOptions{HasCursor: true, Offset: 2, Epoch: "e"})
		})
		h.next(t).replay(wire.Replay{Epoch: "e", StartOffset: 3, ReplayEndOffset: 4, Reason: wire.ReasonResume})
		if _, err := wait(t, ch); !errors.Is(err, client.ErrProtocol) {
			t.Errorf("AttachPTY: %v, want ErrProtocol", err)
		}
	})
}

func TestAttachRefused(t *testing.T) {
	h := newFakeHost(t)
	for _, tt := range []struct {
		name string
		host func(p *peer)
		want func(error) bool
	}{
		{"4411", func(p *peer) { p.sendClose(wire.CloseNoSuchTerminal, "no such terminal") }, func(err error) bool {
			var ce *client.CloseError
			return errors.As(err, &ce) && ce.Code == wire.CloseNoSuchTerminal && !client.Retryable(err)
		}},
		{"1013 before the header", func(p *peer) { p.sendClose(wire.CloseTryAgainLater, "") }, client.Retryable},
		{"output before the header", func(p *peer) { p.binary("x") }, func(err error) bool { return errors.Is(err, client.ErrProtocol) }},
		{"a bad header", func(p *peer) { p.text(`{"type":"pty.replay","reset":false,"reason":"initial"}`) },
			func(err error) bool { return errors.Is(err, client.ErrProtocol) && errors.Is(err, wire.ErrReplay) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ch := background(t, func() (*client.PTY, error) { return client.AttachPTY(ctxT(t), h.URL, tok, client.PTYOptions{}) })
			tt.host(h.next(t))
			if _, err := wait(t, ch); !tt.want(err) {
				t.Errorf("AttachPTY: %v", err)
			}
		})
	}
}

func TestPTYInput(t *testing.T) {
	h := newFakeHost(t)
	c, p := attachPTY(t, h, client.PTYOptions{}, wire.Replay{Epoch: "e", Reset: true, Reason: wire.ReasonInitial})
	if n, err := c.Write([]byte("ls\r")); n != 3 || err != nil {
		t.Fatalf("Write: %d, %v", n, err)
	}
	if err := c.Resize(120, 40); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteText([]byte("typed")); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		op   ws.OpCode
		data string
	}{{ws.OpBinary, "ls\r"}, {ws.OpText, "\x1b[RESIZE:120;40]"}, {ws.OpText, "typed"}, {ws.OpPing, ""}} {
		f := p.readFrame()
		if f.Header.OpCode != want.op || string(f.Payload) != want.data {
			t.Errorf("got %v %q, want %v %q", f.Header.OpCode, f.Payload, want.op, want.data)
		}
	}
	for _, size := range [][2]int{{0, 24}, {80, 0}, {10001, 24}, {80, -1}} {
		if err := c.Resize(size[0], size[1]); !errors.Is(err, client.ErrInvalidSize) {
			t.Errorf("Resize(%d, %d): %v", size[0], size[1], err)
		}
	}
}

func TestPTYAnswersPingsAndTexts(t *testing.T) {
	h := newFakeHost(t)
	var mu sync.Mutex
	var texts []string
	c, p := attachPTY(t, h, client.PTYOptions{OnText: func(b []byte) {
		mu.Lock()
		texts = append(texts, string(b))
		mu.Unlock()
	}}, wire.Replay{Epoch: "e", Reset: true, Reason: wire.ReasonInitial})
	if err := p.frame(ws.NewPingFrame([]byte("are you there"))); err != nil {
		t.Fatal(err)
	}
	p.text("stray")
	p.binary("x")
	if out, _ := readN(t, c, 1); out != "x" {
		t.Fatalf("read %q", out)
	}
	f := p.readFrame()
	if f.Header.OpCode != ws.OpPong || string(f.Payload) != "are you there" {
		t.Errorf("got %v %q, want the pong", f.Header.OpCode, f.Payload)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(texts) != 1 || texts[0] != "stray" {
		t.Errorf("OnText saw %q", texts)
	}
}

func TestPTYEnd(t *testing.T) {
	h := newFakeHost(t)
	c, p := attachPTY(t, h, client.PTYOptions{}, wire.Replay{Epoch: "e", Reset: true, Reason: wire.ReasonInitial})
	p.binary("last")
	p.sendClose(wire.CloseProcessExited, "exited")
	out, err := io.ReadAll(c)
	var ce *client.CloseError
	if string(out) != "last" || !errors.As(err, &ce) || ce.Code != wire.CloseProcessExited || ce.Reason != "exited" {
		t.Fatalf("read %q, %v; want the last bytes, then 4410", out, err)
	}
	if _, err := c.Read(make([]byte, 1)); !errors.As(err, &ce) {
		t.Errorf("Read after the end: %v, want the same *CloseError", err)
	}
	if code := p.readClose(); code != wire.CloseProcessExited {
		t.Errorf("close answered with %d", code)
	}
}

func TestPTYReadTimeout(t *testing.T) {
	h := newFakeHost(t)
	c, _ := attachPTY(t, h, client.PTYOptions{ReadTimeout: 50 * time.Millisecond}, wire.Replay{Epoch: "e", Reset: true, Reason: wire.ReasonInitial})
	_, err := c.Read(make([]byte, 8))
	var ce *client.CloseError
	if !errors.As(err, &ce) || ce.Code != wire.CloseAbnormal || !strings.Contains(err.Error(), "nothing from the host for 50ms") || !client.Retryable(err) {
		t.Fatalf("Read of a silent host: %v", err)
	}
}

func TestPTYClose(t *testing.T) {
	t.Run("with a reader", func(t *testing.T) {
		h := newFakeHost(t)
		c, p := attachPTY(t, h, client.PTYOptions{Options: client.Options{CloseWait: testWait}}, wire.Replay{Epoch: "e", Reset: true, Reason: wire.ReasonInitial})
		readErr := background(t, func() (int, error) { return c.Read(make([]byte, 8)) })
		closed := background(t, func() (struct{}, error) { return struct{}{}, c.CloseWith(wire.CloseNormal, "detached") })
		if code := p.readClose(); code != wire.CloseNormal {
			t.Errorf("close code %d", code)
		}
		wait(t, closed)
		var ce *client.CloseError
		if _, err := wait(t, readErr); !errors.As(err, &ce) || ce.Code != wire.CloseNormal {
			t.Errorf("the Read took %v, want the host's 1000", err)
		}
	})
	t.Run("without a reader", func(t *testing.T) {
		h := newFakeHost(t)
		c, p := attachPTY(t, h, client.PTYOptions{Options: client.Options{CloseWait: testWait}}, wire.Replay{Epoch: "e", Reset: true, Reason: wire.ReasonInitial})
		p.binary("unread output")
		closed := background(t, func() (struct{}, error) { return struct{}{}, c.Close() })
		if code := p.readClose(); code != wire.CloseNormal {
			t.Errorf("close code %d", code)
		}
		wait(t, closed)
		if _, _, err := p.read(); err == nil || errors.Is(err, errReset) {
			t.Errorf("host read after the close: %v, want EOF (no reset)", err)
		}
		c.Close() // idempotent
	})
}

func TestPTYReattach(t *testing.T) {
	h := newFakeHost(t)
	o := client.PTYOptions{Options: client.Options{Token: "sekrit"}, View: true}
	c, p := attachPTY(t, h, o, wire.Replay{Epoch: "e1", StartOffset: 0, ReplayEndOffset: 5, Reset: true, Reason: wire.ReasonInitial})
	p.binary("hello")
	readN(t, c, 5)
	_ = p.Close() // lost
	if _, err := c.Read(make([]byte, 8)); !client.Retryable(err) {
		t.Fatalf("Read after a drop: %v, want a Retryable error", err)
	}

	h.reject.Store(http.StatusServiceUnavailable)
	var attempts []int
	backoff := func(n int) (time.Duration, bool) {
		attempts = append(attempts, n)
		if n == 1 {
			h.reject.Store(0)
		}
		return time.Millisecond, n < 5
	}
	ch := background(t, func() (*client.PTY, error) { return c.Reattach(ctxT(t), backoff) })
	p = h.next(t)
	if p.query.Get("offset") != "5" || p.query.Get("epoch") != "e1" || p.query.Get("attach") != tok || p.query.Get("view") != "1" || p.query.Has("token") ||
		p.header.Get("Authorization") != "Bearer sekrit" {
		t.Errorf("reattach request %s (%q)", p.uri, p.header.Get("Authorization"))
	}
	p.replay(wire.Replay{Epoch: "e1", StartOffset: 0, ReplayEndOffset: 7, Reason: wire.ReasonResume})
	c2, err := wait(t, ch)
	if err != nil {
		t.Fatalf("Reattach: %v", err)
	}
	defer c2.Abort()
	if len(attempts) != 2 || c2.Offset() != 5 {
		t.Errorf("attempts %v, offset %d; want a refused attempt, then a resume from 5", attempts, c2.Offset())
	}
	p.binary("XY")
	if out, offs := readN(t, c2, 2); out != "XY" || offs[len(offs)-1] != 7 {
		t.Errorf("read %q, offsets %v", out, offs)
	}

	// A refusal that a retry would repeat ends it at once.
	p.sendClose(wire.CloseSuperseded, "opened elsewhere")
	if _, err := c2.Read(make([]byte, 8)); client.Retryable(err) {
		t.Fatalf("4409 is Retryable: %v", err)
	}
	attempts = nil
	ch = background(t, func() (*client.PTY, error) { return c2.Reattach(ctxT(t), backoff) })
	h.next(t).sendClose(wire.CloseUnauthorized, "")
	var ce *client.CloseError
	if _, err := wait(t, ch); !errors.As(err, &ce) || ce.Code != wire.CloseUnauthorized || len(attempts) != 1 {
		t.Errorf("Reattach: %v after %v attempts, want 4401 at once", err, attempts)
	}
	// A backoff that gives up.
	if _, err := c2.Reattach(ctxT(t), func(int) (time.Duration, bool) { return 0, false }); !errors.Is(err, client.ErrGaveUp) {
		t.Errorf("Reattach with no attempt: %v", err)
	}
	// ctx ends during the wait.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c2.Reattach(ctx, func(int) (time.Duration, bool) { return time.Hour, true }); !errors.Is(err, context.Canceled) {
		t.Errorf("Reattach with a cancelled ctx: %v", err)
	}
}

func TestAttachURL(t *testing.T) {
	h := newFakeHost(t)
	ch := background(t, func() (*client.PTY, error) {
		return client.AttachURL(ctxT(t), h.URL+"/api/pty?attach="+tok+"&offset=4&epoch=e&view=1&token=q", client.PTYOptions{})
	})
	p := h.next(t)
	p.replay(wire.Replay{Epoch: "e", StartOffset: 0, ReplayEndOffset: 6, Reason: wire.ReasonResume})
	c, err := wait(t, ch)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Abort()
	if p.uri != "/api/pty?attach="+tok+"&offset=4&epoch=e&view=1&token=q" || c.Offset() != 4 {
		t.Errorf("request %s, offset %d: want the URL as given and its cursor", p.uri, c.Offset())
	}
}

func TestRetryable(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{&client.DialError{Err: errors.New("refused")}, true},
		{&client.DialError{Status: 503, Err: errors.New("x")}, true},
		{&client.DialError{Status: 404, Err: errors.New("x")}, false},
		{&client.CloseError{Code: wire.CloseAbnormal}, true},
		{&client.CloseError{Code: wire.CloseGoingAway}, true},
		{&client.CloseError{Code: wire.CloseServiceRestart}, true},
		{&client.CloseError{Code: wire.CloseTryAgainLater}, true},
		{&client.CloseError{Code: wire.CloseSuperseded}, false},
		{&client.CloseError{Code: wire.CloseProcessExited}, false},
		{&client.CloseError{Code: wire.CloseInternalError}, false},
		{client.ErrProtocol, false},
		{context.Canceled, false},
	} {
		if got := client.Retryable(tt.err); got != tt.want {
			t.Errorf("Retryable(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// TestPTYReattachSize: a reattach asks for the size last sent: the
// attach's own, then the last Resize's.
func TestPTYReattachSize(t *testing.T) {
	h := newFakeHost(t)
	o := client.PTYOptions{Options: client.Options{Token: "sekrit"}, Cols: 100, Rows: 30}
	c, p := attachPTY(t, h, o, wire.Replay{Epoch: "e1", Reset: true, Reason: wire.ReasonInitial, Snapshot: true, Cols: 100, Rows: 30})
	reattach := func(want string) *peer {
		t.Helper()
		_ = p.Close() // lost
		if _, err := c.Read(make([]byte, 8)); !client.Retryable(err) {
			t.Fatalf("Read after a drop: %v, want a Retryable error", err)
		}
		ch := background(t, func() (*client.PTY, error) { return c.Reattach(ctxT(t), nil) })
		np := h.next(t)
		if got := np.query.Get("cols") + "x" + np.query.Get("rows"); got != want {
			t.Errorf("reattach request %s: size %s, want %s", np.uri, got, want)
		}
		np.replay(wire.Replay{Epoch: "e1", Reason: wire.ReasonResume})
		nc, err := wait(t, ch)
		if err != nil {
			t.Fatalf("Reattach: %v", err)
		}
		t.Cleanup(nc.Abort)
		c = nc
		return np
	}
	p = reattach("100x30")
	if err := c.Resize(120, 40); err != nil {
		t.Fatal(err)
	}
	if err := c.Resize(0, 40); !errors.Is(err, client.ErrInvalidSize) {
		t.Fatalf("Resize(0, 40): %v, want ErrInvalidSize", err)
	}
	if op, msg, err := p.read(); err != nil || op != ws.OpText || string(msg) != "\x1b[RESIZE:120;40]" {
		t.Fatalf("got %v %q (%v), want the resize", op, msg, err)
	}
	reattach("120x40")
}

// TestAttachURLSize: AttachURL sends the URL's size, and a Reattach
// after it the same.
func TestAttachURLSize(t *testing.T) {
	h := newFakeHost(t)
	ch := background(t, func() (*client.PTY, error) {
		return client.AttachURL(ctxT(t), h.URL+"/api/pty?attach="+tok+"&cols=90&rows=25", client.PTYOptions{Cols: 1, Rows: 1})
	})
	p := h.next(t)
	p.replay(wire.Replay{Epoch: "e", Reset: true, Reason: wire.ReasonInitial, Snapshot: true, Cols: 90, Rows: 25})
	c, err := wait(t, ch)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Abort()
	_ = p.Close()
	if _, err := c.Read(make([]byte, 8)); !client.Retryable(err) {
		t.Fatalf("Read after a drop: %v, want a Retryable error", err)
	}
	ch = background(t, func() (*client.PTY, error) { return c.Reattach(ctxT(t), nil) })
	p = h.next(t)
	if got := p.query.Get("cols") + "x" + p.query.Get("rows"); got != "90x25" {
		t.Errorf("reattach request %s: size %s, want the URL's 90x25", p.uri, got)
	}
	p.replay(wire.Replay{Epoch: "e", Reason: wire.ReasonResume})
	if c, err = wait(t, ch); err != nil {
		t.Fatal(err)
	}
	c.Abort()
}
