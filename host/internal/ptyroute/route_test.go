package ptyroute

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/link"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/wire"
)

// TestParseResize: a resize is exactly the escape with both numbers from
// 1 to the router's largest size; anything else that starts with the
// escape is malformed, or over the largest (a size the wire allows).
func TestParseResize(t *testing.T) {
	tests := []struct {
		in               string
		maxCols, maxRows int
		cols, rows       int
		err              error
	}{
		{"\x1b[RESIZE:120;40]", 1000, 1000, 120, 40, nil},
		{"\x1b[RESIZE:1;1]", 1000, 1000, 1, 1, nil},
		{"\x1b[RESIZE:1000;1000]", 1000, 1000, 1000, 1000, nil},
		{"\x1b[RESIZE:300;100]", 1000, 1000, 300, 100, nil},
		{"\x1b[RESIZE:1001;50]", 1000, 1000, 1001, 50, ErrResizeTooLarge},
		{"\x1b[RESIZE:50;1001]", 1000, 1000, 50, 1001, ErrResizeTooLarge},
		{"\x1b[RESIZE:10000;10000]", 1000, 1000, 10000, 10000, ErrResizeTooLarge},
		{"\x1b[RESIZE:10000;10000]", 10000, 10000, 10000, 10000, nil},
		{"\x1b[RESIZE:201;40]", 200, 50, 201, 40, ErrResizeTooLarge},
		{"\x1b[RESIZE:200;50]", 200, 50, 200, 50, nil},
		{"\x1b[RESIZE:00200;050]", 200, 50, 200, 50, nil},
		{"\x1b[RESIZE:10001;40]", 10000, 10000, 0, 0, ErrBadResize},
		{"\x1b[RESIZE:0;40]", 1000, 1000, 0, 0, ErrBadResize},
		{"\x1b[RESIZE:-1;40]", 1000, 1000, 0, 0, ErrBadResize},
		{"\x1b[RESIZE:+1;40]", 1000, 1000, 0, 0, ErrBadResize},
		{"\x1b[RESIZE:120;40]x", 1000, 1000, 0, 0, ErrBadResize},
		{"x\x1b[RESIZE:120;40]", 1000, 1000, 0, 0, ErrBadResize},
		{"\x1b[RESIZE:120,40]", 1000, 1000, 0, 0, ErrBadResize},
		{"\x1b[RESIZE:120;]", 1000, 1000, 0, 0, ErrBadResize},
		{"\x1b[RESIZE:;40]", 1000, 1000, 0, 0, ErrBadResize},
		{"\x1b[RESIZE:1 2;40]", 1000, 1000, 0, 0, ErrBadResize},
		{"\x1b[resize:120;40]", 1000, 1000, 0, 0, ErrBadResize},
		{"\x1b[RESIZE:120;40;3]", 1000, 1000, 0, 0, ErrBadResize},
		{"\x1b[RESIZE:99999999999999999999;1]", 10000, 10000, 0, 0, ErrBadResize},
		{"", 1000, 1000, 0, 0, ErrBadResize},
		{"ls\r", 1000, 1000, 0, 0, ErrBadResize},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%q within %dx%d", tt.in, tt.maxCols, tt.maxRows), func(t *testing.T) {
			cols, rows, err := ParseResize([]byte(tt.in), tt.maxCols, tt.maxRows)
			if !errors.Is(err, tt.err) || err == nil != (tt.err == nil) {
				t.Fatalf("ParseResize: got error %v, want %v", err, tt.err)
			}
			if cols != tt.cols || rows != tt.rows {
				t.Errorf("ParseResize = %dx%d, want %dx%d", cols, rows, tt.cols, tt.rows)
			}
		})
	}
}

func FuzzParseResize(f *testing.F) {
	for _, s := range []string{"\x1b[RESIZE:120;40]", "\x1b[RESIZE:0;0]", "\x1b[RESIZE:99999999999999999999;1]", "\x1b[RESIZE:1001;50]", "abc"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, lim := range [][2]int{{DefaultMaxCols, DefaultMaxRows}, {200, 50}, {10000, 10000}} {
			cols, rows, err := ParseResize(b, lim[0], lim[1])
			if err != nil {
				if !errors.Is(err, ErrBadResize) && !errors.Is(err, ErrResizeTooLarge) {
					t.Fatalf("ParseResize(%q): error %v, want ErrBadResize or ErrResizeTooLarge", b, err)
				}
				continue
			}
			if cols < 1 || rows < 1 || cols > lim[0] || rows > lim[1] {
				t.Fatalf("accepted size %d;%d from %q within %dx%d", cols, rows, b, lim[0], lim[1])
			}
			// An accepted frame is exactly the canonical escape.
			if want := fmt.Sprintf("\x1b[RESIZE:%d;%d]", cols, rows); strings.TrimLeft(string(b), "") != want && !leadingZeros(b) {
				t.Fatalf("accepted %q, canonical form %q", b, want)
			}
		}
	})
}

// leadingZeros reports whether the numbers of an accepted escape have
// leading zeros ("007"), the one non-canonical form accepted.
func leadingZeros(b []byte) bool {
	return strings.Contains(string(b), ":0") || strings.Contains(string(b), ";0")
}

func TestParsePTYQuery(t *testing.T) {
	tok := strings.Repeat("a", 16)
	tests := []struct {
		in      string
		want    PTYQuery
		wantErr bool
	}{
		{"", PTYQuery{}, false},
		{"attach=" + tok, PTYQuery{Attach: tok}, false},
		{"attach=" + tok + "&offset=10&epoch=e1&view=1", PTYQuery{Attach: tok, HasOffset: true, Offset: 10, Epoch: "e1", View: true}, false},
		{"attach=" + tok + "&offset=0", PTYQuery{Attach: tok, HasOffset: true}, false},
		{"attach=" + strings.Repeat("A-_9", 32), PTYQuery{Attach: strings.Repeat("A-_9", 32)}, false},
		{"attach=short", PTYQuery{}, true},
		{"attach=" + strings.Repeat("a", 129), PTYQuery{}, true},
		{"attach=" + strings.Repeat("a", 15) + "!", PTYQuery{}, true},
		{"attach=", PTYQuery{}, true},
		{"attach=" + tok + "&attach=" + tok, PTYQuery{}, true},
		{"attach=" + tok + "&offset=-1", PTYQuery{}, true},
		{"attach=" + tok + "&offset=x", PTYQuery{}, true},
		{"attach=" + tok + "&offset=1.5", PTYQuery{}, true},
		{"attach=" + tok + "&offset=99999999999999999999", PTYQuery{}, true},
		{"attach=%zz", PTYQuery{}, true},
		{"token=abc&view=0", PTYQuery{}, false},
		{"attach=" + tok + "&cols=100&rows=30", PTYQuery{Attach: tok, Cols: 100, Rows: 30}, false},
		{"cols=0100&rows=030", PTYQuery{Cols: 100, Rows: 30}, false},
		{"attach=" + tok + "&cols=10000&rows=10000", PTYQuery{Attach: tok, Cols: 10000, Rows: 10000}, false},
		{"attach=" + tok + "&cols=100&rows=30&view=1", PTYQuery{Attach: tok, View: true}, false},
		{"attach=" + tok + "&cols=x&rows=30&view=1", PTYQuery{Attach: tok, View: true}, false},
		{"view=1&cols=100&rows=30", PTYQuery{View: true, Cols: 100, Rows: 30}, false},
		{"attach=" + tok + "&cols=100", PTYQuery{Attach: tok, BadSize: true}, false},
		{"attach=" + tok + "&rows=30", PTYQuery{Attach: tok, BadSize: true}, false},
		{"attach=" + tok + "&cols=0&rows=30", PTYQuery{Attach: tok, BadSize: true}, false},
		{"attach=" + tok + "&cols=10001&rows=30", PTYQuery{Attach: tok, BadSize: true}, false},
		{"attach=" + tok + "&cols=-100&rows=30", PTYQuery{Attach: tok, BadSize: true}, false},
		{"attach=" + tok + "&cols=%2B100&rows=30", PTYQuery{Attach: tok, BadSize: true}, false},
		{"attach=" + tok + "&cols=100&rows=3.5", PTYQuery{Attach: tok, BadSize: true}, false},
		{"attach=" + tok + "&cols=100&cols=100&rows=30", PTYQuery{Attach: tok, BadSize: true}, false},
		{"attach=" + tok + "&cols=&rows=", PTYQuery{Attach: tok, BadSize: true}, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParsePTYQuery(tt.in)
			if tt.wantErr {
				if !errors.Is(err, contract.ErrInvalidArgument) {
					t.Fatalf("ParsePTYQuery(%q) error %v, want ErrInvalidArgument", tt.in, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParsePTYQuery(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			}
		})
	}
}

func FuzzParsePTYQuery(f *testing.F) {
	for _, s := range []string{"attach=aaaaaaaaaaaaaaaa&offset=3&epoch=x", "offset=-1", "attach=%", "view=1&attach=0123456789abcdef0", "cols=80&rows=24", "cols=1&rows=x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q, err := ParsePTYQuery(s)
		if err != nil {
			if !errors.Is(err, contract.ErrInvalidArgument) {
				t.Fatalf("error %v is not ErrInvalidArgument", err)
			}
			return
		}
		if q.Attach != "" && !wire.ValidAttachToken(q.Attach) {
			t.Fatalf("accepted invalid attach %q", q.Attach)
		}
		if q.Offset < 0 || (!q.HasOffset && q.Offset != 0) {
			t.Fatalf("bad offset %+v", q)
		}
		if (q.Cols == 0) != (q.Rows == 0) || q.Cols < 0 || q.Rows < 0 || q.Cols > 10000 || q.Rows > 10000 || q.BadSize && q.Cols != 0 {
			t.Fatalf("bad size %+v", q)
		}
	})
}

// stuckSender is a link.FlowSender whose queue never drains: it records
// commands and its waitRoom always times out.
type stuckSender struct {
	mu    sync.Mutex
	cmds  []contract.Command
	waits int
}

func (s *stuckSender) Send(cmd contract.Command) {
	s.mu.Lock()
	s.cmds = append(s.cmds, cmd)
	s.mu.Unlock()
}

func (s *stuckSender) WaitRoom(context.Context, time.Duration) bool {
	s.mu.Lock()
	s.waits++
	s.mu.Unlock()
	return false
}

// TestPTYOutputStalledLink: when a link's queue does not drain within
// the bound, its PTY sockets are closed with 1013 and get no more output,
// so the stream goes on for everyone else.
func TestPTYOutputStalledLink(t *testing.T) {
	r := New(zerolog.Nop(), metrics.New(), 0, 0)
	stuck, fine := &stuckSender{}, &stuckSender{}
	tok := strings.Repeat("t", 16)
	mk := func(conn uint64, out link.Sender) *ptyConn {
		c := &ptyConn{id: contract.TransportID{Instance: "ws", Conn: conn}, out: out, r: r, token: tok, attached: true, epoch: "e"}
		r.conns[c.id] = c
		if r.routes[tok] == nil {
			r.routes[tok] = &ptyRoute{socks: make(map[contract.TransportID]*ptyConn)}
		}
		r.routes[tok].socks[c.id] = c
		return c
	}
	mk(1, stuck)
	mk(2, plainSender{fine})
	out := func(off int64, data string) []contract.Output {
		return []contract.Output{{Token: tok, Offset: off, Data: []byte(data), Epoch: "e"}}
	}
	if err := r.OnOutput(context.Background(), out(0, "abc")); err != nil {
		t.Fatal(err)
	}
	if err := r.OnOutput(context.Background(), out(3, "def")); err != nil {
		t.Fatal(err)
	}
	kinds := func(s *stuckSender) string {
		s.mu.Lock()
		defer s.mu.Unlock()
		var b strings.Builder
		for _, c := range s.cmds {
			switch c.Kind {
			case contract.CommandSend:
				fmt.Fprintf(&b, "send %q;", c.Data)
			case contract.CommandClose:
				fmt.Fprintf(&b, "close %d;", c.Code)
			}
		}
		return b.String()
	}
	if got, want := kinds(stuck), `send "abc";close 1013;`; got != want {
		t.Errorf("stalled link: got %s want %s", got, want)
	}
	if stuck.waits != 1 {
		t.Errorf("stalled link: waited %d times, want 1 (no wait once its sockets are cut)", stuck.waits)
	}
	if got, want := kinds(fine), `send "abc";send "def";`; got != want {
		t.Errorf("other link: got %s want %s", got, want)
	}
}

// plainSender is a sender without flow control.
type plainSender struct{ s *stuckSender }

func (p plainSender) Send(cmd contract.Command) { p.s.Send(cmd) }

// recordingBackend records the input and resizes it is asked for.
type recordingBackend struct {
	contract.Backend
	mu      sync.Mutex
	writes  [][]byte
	resizes [][2]int
}

func (b *recordingBackend) Write(_ context.Context, _ string, _ contract.TransportID, data []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.writes = append(b.writes, append([]byte(nil), data...))
	return nil
}

func (b *recordingBackend) Resize(_ context.Context, _ string, _ contract.TransportID, cols, rows int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.resizes = append(b.resizes, [2]int{cols, rows})
	return nil
}

// TestResizeFramesNeverTyped: a frame that starts with the resize escape
// resizes when it is exactly a valid one within the largest size (1000x1000
// by default) and is dropped otherwise, counted — it never reaches the
// PTY as input, and one over the largest never reaches the backend.
func TestResizeFramesNeverTyped(t *testing.T) {
	r := New(zerolog.Nop(), metrics.New(), 0, 0)
	be := &recordingBackend{}
	r.SetBackend(be)
	tok := strings.Repeat("t", 16)
	c := &ptyConn{id: contract.TransportID{Instance: "ws", Conn: 1}, out: &stuckSender{}, r: r, token: tok, attached: true, epoch: "e"}
	r.conns[c.id] = c
	for _, f := range []string{
		"\x1b[RESIZE:99999;99999]", "\x1b[RESIZE:0;24]", "\x1b[RESIZE:80;0]", "\x1b[RESIZE:abc]",
		"\x1b[RESIZE:80;24", "\x1b[RESIZE:+80;24]", "\x1b[RESIZE:80;24]x", "\x1b[RESIZE:",
		"\x1b[RESIZE:1001;50]", "\x1b[RESIZE:50;1001]", "\x1b[RESIZE:10000;10000]",
		"\x1b[RESIZE:120;40]", "\x1b[RESIZE:300;100]", "\x1b[RESIZE:1000;1000]", "hello\n",
	} {
		c.OnFrame([]byte(f), false)
	}
	r.Wait()
	be.mu.Lock()
	defer be.mu.Unlock()
	if len(be.writes) != 1 || string(be.writes[0]) != "hello\n" {
		t.Errorf("writes = %q, want only \"hello\\n\"", be.writes)
	}
	if want := [][2]int{{120, 40}, {300, 100}, {1000, 1000}}; !slices.Equal(be.resizes, want) {
		t.Errorf("resizes = %v, want only %v", be.resizes, want)
	}
	if got := testutil.ToFloat64(r.metrics.BadResizes); got != 11 {
		t.Errorf("bad resizes counted %v, want 11", got)
	}
}

// TestResizeWithinTheRoutersLargest: a router given a largest size drops
// what is over it and passes what is within it, up to 10000x10000.
func TestResizeWithinTheRoutersLargest(t *testing.T) {
	for _, tt := range []struct {
		maxCols, maxRows int
		frames           []string
		want             [][2]int
		dropped          float64
	}{
		{200, 50, []string{"\x1b[RESIZE:201;50]", "\x1b[RESIZE:200;51]", "\x1b[RESIZE:200;50]"}, [][2]int{{200, 50}}, 2},
		{10000, 10000, []string{"\x1b[RESIZE:10000;10000]", "\x1b[RESIZE:10001;1]"}, [][2]int{{10000, 10000}}, 1},
	} {
		t.Run(fmt.Sprintf("%dx%d", tt.maxCols, tt.maxRows), func(t *testing.T) {
			r := New(zerolog.Nop(), metrics.New(), tt.maxCols, tt.maxRows)
			be := &recordingBackend{}
			r.SetBackend(be)
			c := &ptyConn{id: contract.TransportID{Instance: "ws", Conn: 1}, out: &stuckSender{}, r: r, token: strings.Repeat("t", 16), attached: true, epoch: "e"}
			r.conns[c.id] = c
			for _, f := range tt.frames {
				c.OnFrame([]byte(f), false)
			}
			r.Wait()
			be.mu.Lock()
			defer be.mu.Unlock()
			if !slices.Equal(be.resizes, tt.want) {
				t.Errorf("resizes = %v, want %v", be.resizes, tt.want)
			}
			if got := testutil.ToFloat64(r.metrics.BadResizes); got != tt.dropped {
				t.Errorf("bad resizes counted %v, want %v", got, tt.dropped)
			}
		})
	}
}

// orderBackend records writes and detaches in the order they reach it;
// while hold is open, a write waits for it.
type orderBackend struct {
	contract.Backend
	hold    chan struct{}
	entered chan struct{} // a write is waiting on hold

	mu  sync.Mutex
	ops []string
}

func (b *orderBackend) Write(_ context.Context, _ string, _ contract.TransportID, data []byte) error {
	select {
	case b.entered <- struct{}{}:
	default:
	}
	<-b.hold
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ops = append(b.ops, "write "+string(data))
	return nil
}

func (b *orderBackend) Detach(context.Context, string, contract.TransportID) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ops = append(b.ops, "detach")
	return nil
}

// TestInputBeforeCloseIsWritten: input a socket sent just before it
// closed (a line typed, then the tab closed) still reaches the PTY, in
// order, and only then is the socket detached.
func TestInputBeforeCloseIsWritten(t *testing.T) {
	r := New(zerolog.Nop(), metrics.New(), 0, 0)
	be := &orderBackend{hold: make(chan struct{}), entered: make(chan struct{}, 1)}
	r.SetBackend(be)
	tok := strings.Repeat("t", 16)
	c := &ptyConn{id: contract.TransportID{Instance: "ws", Conn: 1}, out: &stuckSender{}, r: r, token: tok, attached: true, epoch: "e"}
	r.conns[c.id] = c
	c.OnFrame([]byte("ls\r"), false)
	<-be.entered // the first write is at the backend, held
	c.OnFrame([]byte("exit\r"), false)
	c.OnClosed()
	close(be.hold)
	r.Wait()
	be.mu.Lock()
	defer be.mu.Unlock()
	if got, want := strings.Join(be.ops, ", "), "write ls\r, write exit\r, detach"; got != want {
		t.Errorf("backend saw %q, want %q", got, want)
	}
	if got := r.ConnCount(); got != 0 {
		t.Errorf("sockets routed after the close: %d, want 0", got)
	}
}

// attachRecorder records the attach requests it gets and answers each
// with an empty snapshot.
type attachRecorder struct {
	contract.Backend
	mu   sync.Mutex
	reqs []contract.AttachRequest
}

func (b *attachRecorder) Attach(_ context.Context, req contract.AttachRequest) (contract.AttachResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reqs = append(b.reqs, req)
	return contract.AttachResponse{Epoch: "e", Reset: true, Reason: wire.ReasonInitial, Snapshot: true}, nil
}

func (b *attachRecorder) Detach(context.Context, string, contract.TransportID) error { return nil }
func (b *attachRecorder) Close(context.Context, string) error                        { return nil }

// TestAttachSizeFromQuery: the writer's size in the query reaches the
// backend's attach; a size over the router's largest, malformed, or a
// view's never does, and only the first two are counted as bad resizes.
func TestAttachSizeFromQuery(t *testing.T) {
	tok := strings.Repeat("a", 16)
	for _, tt := range []struct {
		query      string
		cols, rows int
		bad        float64
	}{
		{"attach=" + tok + "&cols=100&rows=30", 100, 30, 0},
		{"attach=" + tok + "&cols=200&rows=50", 200, 50, 0},
		{"attach=" + tok + "&cols=201&rows=50", 0, 0, 1},
		{"attach=" + tok + "&cols=200&rows=51", 0, 0, 1},
		{"attach=" + tok + "&cols=100", 0, 0, 1},
		{"attach=" + tok + "&cols=100&rows=30&view=1", 0, 0, 0},
		{"attach=" + tok + "&offset=5&epoch=e&cols=100&rows=30", 100, 30, 0},
		{"cols=100&rows=30", 100, 30, 0},
		{"view=1&cols=100&rows=30", 100, 30, 0},
	} {
		t.Run(tt.query, func(t *testing.T) {
			r := New(zerolog.Nop(), metrics.New(), 200, 50)
			be := &attachRecorder{}
			r.SetBackend(be)
			c := r.Open(link.Opening{
				ID: contract.TransportID{Instance: "ws", Conn: 1}, Transport: "ws",
				Event: &contract.Event{Kind: contract.EventOpened, Path: "/api/pty", Query: tt.query},
				Out:   &stuckSender{}, Who: adminWho,
			})
			if c == nil {
				t.Fatal("Open refused the socket")
			}
			r.Wait()
			c.OnClosed()
			r.Wait()
			be.mu.Lock()
			defer be.mu.Unlock()
			if len(be.reqs) != 1 {
				t.Fatalf("the backend got %d attaches, want 1", len(be.reqs))
			}
			if got := be.reqs[0]; got.Cols != tt.cols || got.Rows != tt.rows {
				t.Errorf("attach size %dx%d, want %dx%d", got.Cols, got.Rows, tt.cols, tt.rows)
			}
			if got := testutil.ToFloat64(r.metrics.BadResizes); got != tt.bad {
				t.Errorf("bad resizes counted %v, want %v", got, tt.bad)
			}
		})
	}
}

// TestOnExit: the output stream's end of a PTY tells SetOnExit's
// function, with the token and the exit status, attached sockets or not;
// output that is not an end tells nothing.
func TestOnExit(t *testing.T) {
	r := New(zerolog.Nop(), metrics.New(), 0, 0)
	type exit struct {
		token string
		code  int
	}
	var got []exit
	r.SetOnExit(func(token string, code int, attended bool) {
		if attended {
			t.Errorf("PTY %s exited attended, with no socket attached", token)
		}
		got = append(got, exit{token, code})
	})
	outs := []contract.Output{{Token: "a", Data: []byte("hi")}, {Token: "a", Exited: true, ExitCode: 3}, {Token: "b", Exited: true}}
	if err := r.OnOutput(context.Background(), outs); err != nil {
		t.Fatal(err)
	}
	if want := []exit{{"a", 3}, {"b", 0}}; !slices.Equal(got, want) {
		t.Errorf("exits: got %v, want %v", got, want)
	}
}
