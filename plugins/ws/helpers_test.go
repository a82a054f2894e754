package ws_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	gobws "github.com/gobwas/ws"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/plugins/ws"
)

// waitTimeout guards every wait in these tests; reaching it is a failure,
// never a way to synchronise.
const waitTimeout = 10 * time.Second

func testLogger(t testing.TB) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
}

// startServer starts a Server on 127.0.0.1:0 with req and stops it in
// cleanup. setup, if given, runs before Start.
func startServer(t testing.TB, req contract.StartRequest, setup ...func(*ws.Server)) (*ws.Server, string) {
	t.Helper()
	s := ws.New(testLogger(t))
	for _, f := range setup {
		f(s)
	}
	if req.Listen == "" {
		req.Listen = "127.0.0.1:0"
	}
	resp, err := s.Start(context.Background(), req)
	if err != nil {
		t.Fatalf("Start: got error %v, want nil", err)
	}
	if resp.Version != ws.Version {
		t.Errorf("Start: got version %q, want %q", resp.Version, ws.Version)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := s.Stop(ctx, contract.StopRequest{}); err != nil {
			t.Errorf("Stop: got error %v, want nil", err)
		}
	})
	return s, resp.Addr
}

// recorder is an EventSink that keeps every event.
type recorder struct {
	mu      sync.Mutex // guards the fields below
	events  []contract.Event
	batches []int // size of each batch received
	changed chan struct{}
}

func newRecorder() *recorder {
	return &recorder{changed: make(chan struct{})}
}

func (r *recorder) sink(_ context.Context, evs []contract.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range evs {
		e.Data = bytes.Clone(e.Data)
		r.events = append(r.events, e)
	}
	r.batches = append(r.batches, len(evs))
	close(r.changed)
	r.changed = make(chan struct{})
	return nil
}

// link runs tr.Link with a new recorder until cleanup.
func link(t testing.TB, tr contract.Transport) *recorder {
	t.Helper()
	r := newRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Link(ctx, r.sink) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Link: got error %v, want nil", err)
		}
	})
	return r
}

// find returns the index of the first event from index from on that
// matches pred, or -1.
func (r *recorder) findLocked(from int, pred func(contract.Event) bool) int {
	for i := from; i < len(r.events); i++ {
		if pred(r.events[i]) {
			return i
		}
	}
	return -1
}

// wait returns the first event matching pred, waiting for it.
func (r *recorder) wait(t testing.TB, what string, pred func(contract.Event) bool) contract.Event {
	t.Helper()
	return r.waitFrom(t, what, 0, pred)
}

func (r *recorder) waitFrom(t testing.TB, what string, from int, pred func(contract.Event) bool) contract.Event {
	t.Helper()
	e, _ := r.waitIndex(t, what, from, pred)
	return e
}

func (r *recorder) waitIndex(t testing.TB, what string, from int, pred func(contract.Event) bool) (contract.Event, int) {
	t.Helper()
	timeout := time.After(waitTimeout)
	for {
		r.mu.Lock()
		i := r.findLocked(from, pred)
		ch := r.changed
		if i >= 0 {
			e := r.events[i]
			r.mu.Unlock()
			return e, i
		}
		r.mu.Unlock()
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("waiting for %s: timed out after %v", what, waitTimeout)
		}
	}
}

// has reports whether an event matching pred was received.
func (r *recorder) has(pred func(contract.Event) bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.findLocked(0, pred) >= 0
}

// forConn returns the events of conn received so far.
func (r *recorder) forConn(conn uint64) []contract.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []contract.Event
	for _, e := range r.events {
		if e.Conn == conn {
			out = append(out, e)
		}
	}
	return out
}

// opened waits for the Opened event of c.
func (r *recorder) opened(t testing.TB, c *client) contract.Event {
	t.Helper()
	local := c.nc.LocalAddr().String()
	// The OS may reuse a local port: skip earlier connections from the same
	// address that are already closed. (pred runs with r.mu held.)
	return r.wait(t, "opened from "+local, func(e contract.Event) bool {
		if e.Kind != contract.EventOpened || e.Remote != local {
			return false
		}
		for _, x := range r.events {
			if x.Kind == contract.EventClosed && x.Conn == e.Conn {
				return false
			}
		}
		return true
	})
}

// closed waits for the Closed event of conn.
func (r *recorder) closed(t testing.TB, conn uint64) contract.Event {
	t.Helper()
	return r.wait(t, fmt.Sprintf("closed of conn %d", conn), func(e contract.Event) bool {
		return e.Kind == contract.EventClosed && e.Conn == conn
	})
}

func isClosed(conn uint64) func(contract.Event) bool {
	return func(e contract.Event) bool { return e.Kind == contract.EventClosed && e.Conn == conn }
}

func isFrame(conn uint64) func(contract.Event) bool {
	return func(e contract.Event) bool { return e.Kind == contract.EventFrame && e.Conn == conn }
}

func exec(t testing.TB, tr contract.Transport, cmds ...contract.Command) {
	t.Helper()
	if err := tr.Exec(context.Background(), cmds); err != nil {
		t.Fatalf("Exec: got error %v, want nil", err)
	}
}

func admit(conn uint64) contract.Command {
	return contract.Command{Kind: contract.CommandAdmit, Conn: conn}
}

func sendText(conn uint64, s string) contract.Command {
	return contract.Command{Kind: contract.CommandSend, Conn: conn, Data: []byte(s)}
}

// client is a WebSocket client speaking raw frames.
type client struct {
	t  testing.TB
	nc net.Conn
	r  io.Reader
}

func dial(t testing.TB, addr, target string, hdr http.Header) *client {
	t.Helper()
	d := gobws.Dialer{Timeout: waitTimeout}
	if hdr != nil {
		d.Header = gobws.HandshakeHeaderHTTP(hdr)
	}
	nc, br, _, err := d.Dial(context.Background(), "ws://"+addr+target)
	if err != nil {
		t.Fatalf("dial %s: %v", target, err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &client{t: t, nc: nc, r: nc}
	if br != nil {
		c.r = br
	}
	return c
}

// write sends one masked frame.
func (c *client) write(op gobws.OpCode, fin bool, p []byte) error {
	f := gobws.NewFrame(op, fin, bytes.Clone(p))
	return gobws.WriteFrame(c.nc, gobws.MaskFrameInPlace(f))
}

func (c *client) mustWrite(op gobws.OpCode, p []byte) {
	c.t.Helper()
	if err := c.write(op, true, p); err != nil {
		c.t.Fatalf("client write: %v", err)
	}
}

// maxClientFrame bounds what the test client reads in one frame.
const maxClientFrame = 16 << 20

func (c *client) readFrame() (gobws.Frame, error) {
	if err := c.nc.SetReadDeadline(time.Now().Add(waitTimeout)); err != nil {
		return gobws.Frame{}, err
	}
	h, err := gobws.ReadHeader(c.r)
	if err != nil {
		return gobws.Frame{}, err
	}
	if h.Masked {
		return gobws.Frame{}, fmt.Errorf("server sent a masked frame")
	}
	if h.Length > maxClientFrame {
		return gobws.Frame{}, fmt.Errorf("frame of %d bytes", h.Length)
	}
	p := make([]byte, h.Length)
	if _, err := io.ReadFull(c.r, p); err != nil {
		return gobws.Frame{}, err
	}
	return gobws.Frame{Header: h, Payload: p}, nil
}

// readMessage returns the next data message, answering pings.
func (c *client) readMessage() (gobws.OpCode, []byte) {
	c.t.Helper()
	for {
		f, err := c.readFrame()
		if err != nil {
			c.t.Fatalf("client read: %v", err)
		}
		switch f.Header.OpCode {
		case gobws.OpPing:
			if err := c.write(gobws.OpPong, true, f.Payload); err != nil {
				c.t.Fatalf("client pong: %v", err)
			}
		case gobws.OpPong:
		case gobws.OpClose:
			code, reason := closeCode(f.Payload)
			c.t.Fatalf("client read: got close %d %q, want a data message", code, reason)
		default:
			return f.Header.OpCode, f.Payload
		}
	}
}

// readClose reads until the server's close frame, echoes it and returns
// its code and reason.
func (c *client) readClose() (int, string, error) {
	for {
		f, err := c.readFrame()
		if err != nil {
			return 0, "", err
		}
		if f.Header.OpCode != gobws.OpClose {
			continue
		}
		code, reason := closeCode(f.Payload)
		_ = c.write(gobws.OpClose, true, f.Payload)
		return code, reason, nil
	}
}

func (c *client) mustReadClose() (int, string) {
	c.t.Helper()
	code, reason, err := c.readClose()
	if err != nil {
		c.t.Fatalf("client: reading close frame: %v", err)
	}
	return code, reason
}

func closeCode(p []byte) (int, string) {
	if len(p) < 2 {
		return 1005, ""
	}
	return int(binary.BigEndian.Uint16(p)), string(p[2:])
}

func closePayload(code int, reason string) []byte {
	return append(binary.BigEndian.AppendUint16(nil, uint16(code)), reason...)
}

// httpDo fetches url without keep-alive, so no client goroutine lingers.
func httpDo(t testing.TB, method, url string) (int, string) {
	t.Helper()
	cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: waitTimeout}
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, url, err)
	}
	return resp.StatusCode, string(body)
}

func isNetClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrUnexpectedEOF)
}
