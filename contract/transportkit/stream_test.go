package transportkit_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/contract/transportkit"
	"github.com/tether-agent/tether/wire"
)

// hello is a small Protocol for the tests: "HELLO [query]" opens, then one
// text message per line; "CLOSE <code> <reason>" closes.
type hello struct {
	listenErr error                           // Listen fails with it
	wrap      func(net.Listener) net.Listener // wraps the listener
}

func (p *hello) Listen(ctx context.Context, req contract.StartRequest) (net.Listener, string, error) {
	if p.listenErr != nil {
		return nil, "", p.listenErr
	}
	network, addr := "tcp", req.Listen
	if path, ok := strings.CutPrefix(req.Listen, "unix:"); ok {
		network, addr = "unix", path
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, network, addr)
	if err != nil {
		return nil, "", err
	}
	if p.wrap != nil {
		ln = p.wrap(ln)
	}
	return ln, ln.Addr().String(), nil
}

func (*hello) Open(_ net.Conn, r *bufio.Reader) (contract.Event, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return contract.Event{}, err
	}
	query, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "HELLO")
	if query = strings.TrimPrefix(query, " "); !ok {
		return contract.Event{}, &transportkit.CloseError{Code: wire.CloseProtocolError, Reason: "want HELLO"}
	}
	return contract.Event{Path: "/api/ws", Query: query}, nil
}

func (*hello) ReadMessage(r *bufio.Reader, max int64) (transportkit.Message, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return transportkit.Message{}, err
	}
	line = strings.TrimSuffix(line, "\n")
	if rest, ok := strings.CutPrefix(line, "CLOSE "); ok {
		code, reason, _ := strings.Cut(rest, " ")
		n, _ := strconv.Atoi(code)
		return transportkit.Message{}, &transportkit.CloseError{Code: n, Reason: reason, Peer: true}
	}
	if int64(len(line)) > max {
		return transportkit.Message{}, &transportkit.CloseError{Code: wire.CloseTooBig, Reason: "too big"}
	}
	return transportkit.Message{Data: []byte(line)}, nil
}

func (*hello) AppendMessage(b []byte, m transportkit.Message) ([]byte, error) {
	if m.Binary {
		return nil, &transportkit.CloseError{Code: 1003, Reason: "text only"}
	}
	return append(append(b, m.Data...), '\n'), nil
}

func (*hello) AppendClose(b []byte, code int, reason string) []byte {
	return fmt.Appendf(b, "CLOSE %d %s\n", code, reason)
}

// startStream starts a Stream of p with req (Listen defaults to
// 127.0.0.1:0), links it to a new sink and stops it at cleanup.
func startStream(t *testing.T, p transportkit.Protocol, req contract.StartRequest) (*transportkit.Stream, string, *sink) {
	t.Helper()
	s := newStream(t, p)
	if req.Listen == "" {
		req.Listen = "127.0.0.1:0"
	}
	resp, err := s.Start(context.Background(), req)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if resp.Version != "test" || resp.Addr == "" {
		t.Errorf("Start: got %+v, want the config's version and an address", resp)
	}
	events := newSink(false)
	link(t, s, events)
	t.Cleanup(func() { stopStream(t, s, contract.StopRequest{}) })
	return s, resp.Addr, events
}

func newStream(t *testing.T, p transportkit.Protocol) *transportkit.Stream {
	return transportkit.NewStream(transportkit.StreamConfig{
		Protocol: p,
		Version:  "test",
		Log:      zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel),
	})
}

func stopStream(t *testing.T, s *transportkit.Stream, req contract.StopRequest) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := s.Stop(ctx, req); err != nil {
		t.Errorf("Stop: got %v, want nil", err)
	}
}

// peer is a client of the hello protocol.
type peer struct {
	t  *testing.T
	nc net.Conn
	r  *bufio.Reader
}

func dialPeer(t *testing.T, network, addr string) *peer {
	t.Helper()
	nc, err := net.DialTimeout(network, strings.TrimPrefix(addr, "unix:"), wait)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(wait))
	return &peer{t: t, nc: nc, r: bufio.NewReader(nc)}
}

func (p *peer) write(line string) {
	p.t.Helper()
	if _, err := io.WriteString(p.nc, line+"\n"); err != nil {
		p.t.Fatalf("client write: %v", err)
	}
}

// rest reads until the server ends the connection and returns the lines.
func (p *peer) rest() []string {
	p.t.Helper()
	var out []string
	for {
		line, err := p.r.ReadString('\n')
		if err != nil {
			if !errors.Is(err, io.EOF) {
				p.t.Fatalf("client read: %v (after %q)", err, out)
			}
			return out
		}
		out = append(out, strings.TrimSuffix(line, "\n"))
	}
}

// closedOf waits for the Closed event of conn and returns it.
func closedOf(t *testing.T, events *sink, conn uint64) contract.Event {
	t.Helper()
	var ev contract.Event
	events.until(t, fmt.Sprintf("the Closed of connection %d", conn), func(evs []contract.Event) bool {
		for _, e := range evs {
			if e.Kind == contract.EventClosed && e.Conn == conn {
				ev = e
				return true
			}
		}
		return false
	})
	return ev
}

func TestStreamOpen(t *testing.T) {
	_, addr, events := startStream(t, &hello{}, contract.StartRequest{})
	bad := dialPeer(t, "tcp", addr)
	bad.write("GET / HTTP/1.1")
	if got := bad.rest(); len(got) != 1 || got[0] != "CLOSE 1002 want HELLO" {
		t.Errorf("refused handshake: got %q, want the protocol's close line, then the end", got)
	}

	good := dialPeer(t, "tcp", addr)
	good.write("HELLO token=t")
	ev := events.until(t, "an Opened", func(evs []contract.Event) bool { return len(evs) > 0 })[0]
	want := contract.Event{Kind: contract.EventOpened, Conn: 1, Path: "/api/ws", Query: "token=t",
		Remote: good.nc.LocalAddr().String(), Host: addr}
	if ev.Kind != want.Kind || ev.Conn != want.Conn || ev.Path != want.Path || ev.Query != want.Query || ev.Remote != want.Remote || ev.Host != want.Host {
		t.Errorf("Opened: got %+v, want %+v (the refused connection never opened)", ev, want)
	}
}

func TestStreamOpenUnix(t *testing.T) {
	dir, err := os.MkdirTemp("", "tk")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_, addr, events := startStream(t, &hello{}, contract.StartRequest{Listen: "unix:" + filepath.Join(dir, "s")})
	dialPeer(t, "unix", addr).write("HELLO")
	ev := events.until(t, "an Opened", func(evs []contract.Event) bool { return len(evs) > 0 })[0]
	if ev.Remote != "unix" || ev.Host != addr {
		t.Errorf("Opened on a Unix socket: got Remote %q Host %q, want %q and %q", ev.Remote, ev.Host, "unix", addr)
	}
}

func TestStreamCloses(t *testing.T) {
	tests := []struct {
		name       string
		req        contract.StartRequest
		admit      bool
		do         func(s *transportkit.Stream, p *peer, id uint64)
		wantLines  []string // what the client reads after its handshake
		wantCode   int
		wantReason string
	}{
		{
			name:       "admit timeout",
			req:        contract.StartRequest{PeerTimeout: 100 * time.Millisecond},
			do:         func(*transportkit.Stream, *peer, uint64) {},
			wantLines:  []string{"CLOSE 1013 admit timeout"},
			wantCode:   wire.CloseTryAgainLater,
			wantReason: "admit timeout",
		},
		{
			name:  "host close after what was queued",
			admit: true,
			do: func(s *transportkit.Stream, _ *peer, id uint64) {
				_ = s.Exec(context.Background(), []contract.Command{
					{Kind: contract.CommandSend, Conn: id, Data: []byte("one")},
					{Kind: contract.CommandSend, Conn: id, Data: []byte("two")},
					{Kind: contract.CommandClose, Conn: id, Code: 4409, Reason: "superseded"},
					{Kind: contract.CommandSend, Conn: id, Data: []byte("too late")},
				})
			},
			wantLines:  []string{"one", "two", "CLOSE 4409 superseded"},
			wantCode:   4409,
			wantReason: "superseded",
		},
		{
			name:  "a message the protocol cannot carry",
			admit: true,
			do: func(s *transportkit.Stream, _ *peer, id uint64) {
				_ = s.Exec(context.Background(), []contract.Command{{Kind: contract.CommandSend, Conn: id, Binary: true, Data: []byte{0}}})
			},
			wantLines:  []string{"CLOSE 1003 text only"},
			wantCode:   1003,
			wantReason: "text only",
		},
		{
			name:  "send queue full",
			req:   contract.StartRequest{SendQueue: 8},
			admit: true,
			do: func(s *transportkit.Stream, _ *peer, id uint64) {
				_ = s.Exec(context.Background(), []contract.Command{{Kind: contract.CommandSend, Conn: id, Data: []byte("123456789")}})
			},
			wantLines:  []string{"CLOSE 1013 send queue full"},
			wantCode:   wire.CloseTryAgainLater,
			wantReason: "send queue full",
		},
		{
			name:      "message too big",
			req:       contract.StartRequest{MaxMessage: 4},
			admit:     true,
			do:        func(_ *transportkit.Stream, p *peer, _ uint64) { p.write("12345") },
			wantLines: []string{"CLOSE 1009 too big"},
			wantCode:  wire.CloseTooBig, wantReason: "too big",
		},
		{
			name:      "peer close",
			admit:     true,
			do:        func(_ *transportkit.Stream, p *peer, _ uint64) { p.write("CLOSE 4000 bye") },
			wantLines: nil, // no close line back
			wantCode:  4000, wantReason: "bye",
		},
		{
			name:      "peer gone",
			admit:     true,
			do:        func(_ *transportkit.Stream, p *peer, _ uint64) { _ = p.nc.(*net.TCPConn).CloseWrite() },
			wantLines: nil,
			wantCode:  wire.CloseAbnormal,
		},
		{
			name:  "stop",
			admit: true,
			do: func(s *transportkit.Stream, _ *peer, _ uint64) {
				stopStream(t, s, contract.StopRequest{Code: 1012, Reason: "swapped"})
			},
			wantLines:  []string{"CLOSE 1012 swapped"},
			wantCode:   wire.CloseServiceRestart,
			wantReason: "swapped",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, addr, events := startStream(t, &hello{}, tt.req)
			p := dialPeer(t, "tcp", addr)
			p.write("HELLO")
			id := events.until(t, "an Opened", func(evs []contract.Event) bool { return len(evs) > 0 })[0].Conn
			if tt.admit {
				_ = s.Exec(context.Background(), []contract.Command{{Kind: contract.CommandAdmit, Conn: id}})
			}
			tt.do(s, p, id)
			if got := p.rest(); strings.Join(got, "|") != strings.Join(tt.wantLines, "|") {
				t.Errorf("client read %q, want %q, then the end", got, tt.wantLines)
			}
			if e := closedOf(t, events, id); e.Code != tt.wantCode || e.Reason != tt.wantReason {
				t.Errorf("Closed: got %d %q, want %d %q", e.Code, e.Reason, tt.wantCode, tt.wantReason)
			}
		})
	}
}

func TestStreamNoFrameBeforeAdmit(t *testing.T) {
	s, addr, events := startStream(t, &hello{}, contract.StartRequest{})
	p := dialPeer(t, "tcp", addr)
	p.write("HELLO")
	p.write("early")
	id := events.until(t, "an Opened", func(evs []contract.Event) bool { return len(evs) > 0 })[0].Conn
	other := dialPeer(t, "tcp", addr)
	other.write("HELLO")
	other.write("sync")
	oid := events.until(t, "the second Opened", func(evs []contract.Event) bool { return len(evs) > 1 })[1].Conn
	_ = s.Exec(context.Background(), []contract.Command{{Kind: contract.CommandAdmit, Conn: oid}})
	events.until(t, "the other's frame", func(evs []contract.Event) bool { return len(evs) > 2 })
	for _, e := range events.events() {
		if e.Kind == contract.EventFrame && e.Conn == id {
			t.Fatalf("got a Frame of connection %d before its admission", id)
		}
	}
	_ = s.Exec(context.Background(), []contract.Command{{Kind: contract.CommandAdmit, Conn: id}})
	events.until(t, "the early frame", func(evs []contract.Event) bool {
		return evs[len(evs)-1].Kind == contract.EventFrame && evs[len(evs)-1].Conn == id && string(evs[len(evs)-1].Data) == "early"
	})
}

func TestStreamStopDropsUnopened(t *testing.T) {
	s, addr, events := startStream(t, &hello{}, contract.StartRequest{})
	p := dialPeer(t, "tcp", addr) // sends no handshake
	// A round trip on another connection: the first one was accepted.
	q := dialPeer(t, "tcp", addr)
	q.write("HELLO")
	events.until(t, "an Opened", func(evs []contract.Event) bool { return len(evs) > 0 })
	stopStream(t, s, contract.StopRequest{})
	if got := p.rest(); len(got) != 0 {
		t.Errorf("a connection still in its handshake at Stop: got %q, want it dropped", got)
	}
	if got := names(events.events()); len(got) != 2 || got[1] != "closed 1 " {
		t.Errorf("events: got %q, want the opened connection's Opened and Closed only", got)
	}
}

func TestStreamStart(t *testing.T) {
	t.Run("negative setting", func(t *testing.T) {
		s := newStream(t, &hello{})
		if _, err := s.Start(context.Background(), contract.StartRequest{Listen: "127.0.0.1:0", SendQueue: -1}); !errors.Is(err, contract.ErrInvalidArgument) {
			t.Errorf("Start: got %v, want contract.ErrInvalidArgument", err)
		}
		stopStream(t, s, contract.StopRequest{})
	})
	t.Run("twice", func(t *testing.T) {
		s, _, _ := startStream(t, &hello{}, contract.StartRequest{})
		if _, err := s.Start(context.Background(), contract.StartRequest{Listen: "127.0.0.1:0"}); !errors.Is(err, contract.ErrInvalidArgument) {
			t.Errorf("second Start: got %v, want contract.ErrInvalidArgument", err)
		}
	})
	t.Run("after Stop", func(t *testing.T) {
		s := newStream(t, &hello{})
		stopStream(t, s, contract.StopRequest{})
		if _, err := s.Start(context.Background(), contract.StartRequest{Listen: "127.0.0.1:0"}); !errors.Is(err, contract.ErrStopped) {
			t.Errorf("Start after Stop: got %v, want contract.ErrStopped", err)
		}
	})
	t.Run("listen fails, then works", func(t *testing.T) {
		p := &hello{listenErr: errors.New("no socket for you")}
		s := newStream(t, p)
		if _, err := s.Start(context.Background(), contract.StartRequest{Listen: "127.0.0.1:0"}); !errors.Is(err, p.listenErr) {
			t.Errorf("Start: got %v, want the Listen error", err)
		}
		p.listenErr = nil
		if _, err := s.Start(context.Background(), contract.StartRequest{Listen: "127.0.0.1:0"}); err != nil {
			t.Errorf("Start after a failed one: got %v, want nil", err)
		}
		stopStream(t, s, contract.StopRequest{})
	})
}

// flakyListener fails its first Accept with an error that is not
// net.ErrClosed (as running out of file descriptors does).
type flakyListener struct {
	net.Listener
	failed bool
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if !l.failed {
		l.failed = true
		return nil, errors.New("accept: too many open files")
	}
	return l.Listener.Accept()
}

func TestStreamAcceptRetries(t *testing.T) {
	p := &hello{wrap: func(ln net.Listener) net.Listener { return &flakyListener{Listener: ln} }}
	_, addr, events := startStream(t, p, contract.StartRequest{})
	dialPeer(t, "tcp", addr).write("HELLO")
	events.until(t, "an Opened after a failed accept", func(evs []contract.Event) bool { return len(evs) > 0 })
}

func TestStreamStats(t *testing.T) {
	if _, err := newStream(t, &hello{}).Stats(context.Background()); !errors.Is(err, contract.ErrNotStarted) {
		t.Errorf("Stats before Start: got %v, want contract.ErrNotStarted", err)
	}
	s, addr, events := startStream(t, &hello{}, contract.StartRequest{})
	count := func(when string, want int64) {
		t.Helper()
		st, err := s.Stats(context.Background())
		if err != nil || st.Connections != want || st.Refused503 != 0 {
			t.Errorf("Stats %s: got %+v %v, want %d connections", when, st, err, want)
		}
	}
	count("at first", 0)
	p := dialPeer(t, "tcp", addr)
	p.write("HELLO")
	events.until(t, "an Opened", func(evs []contract.Event) bool { return len(evs) > 0 })
	count("with one open", 1)
	p.nc.Close()
	_ = s.Exec(context.Background(), []contract.Command{{Kind: contract.CommandAdmit, Conn: 1}})
	closedOf(t, events, 1)
	count("once it was reported Closed", 0)
}
