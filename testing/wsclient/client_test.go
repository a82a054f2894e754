package wsclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
	"go.uber.org/goleak"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testServer is a tiny gobwas WebSocket server on 127.0.0.1:0. Each accepted
// connection is upgraded and handed to handler in its own goroutine; Cleanup
// closes the listener and every connection and waits for the goroutines.
type testServer struct {
	ln      net.Listener
	url     string
	handler func(*serverConn)
	wg      sync.WaitGroup

	mu    sync.Mutex // guards the fields below
	conns []*serverConn
}

// serverConn is the server side of one connection. Writes are whole frames
// under wmu, so that handler goroutines and the control replies that
// wsutil.ReadClientData writes never interleave.
type serverConn struct {
	net.Conn
	uri    string
	header http.Header

	wmu sync.Mutex
}

func newServer(tb testing.TB, handler func(*serverConn)) *testServer {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen: %v", err)
	}
	s := &testServer{ln: ln, url: "ws://" + ln.Addr().String() + "/api/ws", handler: handler}
	s.wg.Add(1)
	go s.accept()
	tb.Cleanup(s.close)
	return s
}

func (s *testServer) accept() {
	defer s.wg.Done()
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			return
		}
		sc := &serverConn{Conn: conn, header: http.Header{}}
		s.mu.Lock()
		s.conns = append(s.conns, sc)
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer conn.Close()
			u := ws.Upgrader{
				OnRequest: func(uri []byte) error {
					sc.uri = string(uri)
					if strings.Contains(sc.uri, "refuse") {
						return ws.RejectConnectionError(ws.RejectionStatus(http.StatusForbidden))
					}
					return nil
				},
				OnHost: func(host []byte) error {
					sc.header.Set("Host", string(host))
					return nil
				},
				OnHeader: func(key, value []byte) error {
					sc.header.Add(string(key), string(value))
					return nil
				},
			}
			if _, err := u.Upgrade(conn); err != nil {
				return
			}
			// As the host does, unless the test plays a refusal.
			if !strings.Contains(sc.uri, "noready") {
				if err := sc.send(readyEvent); err != nil {
					return
				}
			}
			s.handler(sc)
		}()
	}
}

func (s *testServer) close() {
	s.ln.Close()
	s.mu.Lock()
	for _, sc := range s.conns {
		sc.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// readyEvent is the host's first frame.
var readyEvent = map[string]any{"jsonrpc": "2.0", "method": "event", "params": map[string]any{
	"type": "gateway.ready", "payload": map[string]any{"version": "test"},
}}

func (sc *serverConn) writeFrame(f ws.Frame) error {
	b, err := ws.CompileFrame(f)
	if err != nil {
		return err
	}
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	_, err = sc.Conn.Write(b)
	return err
}

// Write makes the control replies of wsutil.ReadClientData go under wmu.
func (sc *serverConn) Write(p []byte) (int, error) {
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	return sc.Conn.Write(p)
}

func (sc *serverConn) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return sc.writeFrame(ws.NewTextFrame(b))
}

func (sc *serverConn) sendClose(code ws.StatusCode, reason string) error {
	return sc.writeFrame(ws.NewCloseFrame(ws.NewCloseFrameBody(code, reason)))
}

type rpcRequest struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
}

// rpcHandler serves a few test methods until the client goes away:
//
//	echo {..}              → result: the params, or "absent" without params
//	fail                   → error 4001 with data
//	slow {"ms":N,...}      → after N ms, result: the params
//	events {"n":N}         → N events with seq 1..N, then result {"sent":N}
//	close {"code","reason"} → a close frame with that code
//
// A frame that is not JSON gets a -32700 error with id null. Each request is
// served in its own goroutine, so responses may come out of order.
func rpcHandler(sc *serverConn) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		p, _, err := wsutil.ReadClientData(sc)
		if err != nil {
			return
		}
		var req rpcRequest
		if err := json.Unmarshal(p, &req); err != nil {
			sc.send(map[string]any{
				"jsonrpc": "2.0",
				"id":      nil,
				"error":   map[string]any{"code": -32700, "message": "parse error"},
			})
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			serveRPC(sc, req)
		}()
	}
}

func serveRPC(sc *serverConn, req rpcRequest) {
	reply := func(result any) {
		sc.send(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": result})
	}
	switch req.Method {
	case "echo":
		if req.Params == nil {
			reply("absent")
			return
		}
		reply(req.Params)
	case "fail":
		sc.send(map[string]any{"jsonrpc": "2.0", "id": req.ID, "error": map[string]any{
			"code": 4001, "message": "unknown session", "data": map[string]any{"x": 1},
		}})
	case "slow":
		var p struct{ MS int }
		json.Unmarshal(req.Params, &p)
		time.Sleep(time.Duration(p.MS) * time.Millisecond)
		reply(req.Params)
	case "events":
		var p struct{ N int }
		json.Unmarshal(req.Params, &p)
		for i := 1; i <= p.N; i++ {
			sc.send(map[string]any{"jsonrpc": "2.0", "method": "event", "params": map[string]any{
				"type": "message.delta", "session_id": "0123abcd", "seq": i,
				"payload": map[string]any{"text": fmt.Sprintf("w%d ", i)},
			}})
		}
		reply(map[string]any{"sent": p.N})
	case "close":
		var p struct {
			Code   int
			Reason string
		}
		json.Unmarshal(req.Params, &p)
		sc.sendClose(ws.StatusCode(p.Code), p.Reason)
	default:
		sc.send(map[string]any{"jsonrpc": "2.0", "id": req.ID, "error": map[string]any{
			"code": -32601, "message": "method not found",
		}})
	}
}

func dial(tb testing.TB, url string, opts Options) *Client {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, url, opts)
	if err != nil {
		tb.Fatalf("Dial: %v", err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

func testContext(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

func TestCallRoundTrip(t *testing.T) {
	s := newServer(t, rpcHandler)
	c := dial(t, s.url, Options{Token: "secret"})
	ctx := testContext(t)

	var got map[string]any
	if err := c.Call(ctx, "echo", map[string]any{"session_id": "abc", "cols": 80}, &got); err != nil {
		t.Fatalf("Call echo: %v", err)
	}
	if got["session_id"] != "abc" || got["cols"] != float64(80) {
		t.Errorf("echo result: got %v, want session_id abc, cols 80", got)
	}

	var absent string
	if err := c.Call(ctx, "echo", nil, &absent); err != nil {
		t.Fatalf("Call echo without params: %v", err)
	}
	if absent != "absent" {
		t.Errorf("nil params: got %q, want params left out", absent)
	}

	var raw json.RawMessage
	if err := c.Call(ctx, "echo", json.RawMessage(`{"last_seen":"x"}`), &raw); err != nil {
		t.Fatalf("Call echo with raw params: %v", err)
	}
	if string(raw) != `{"last_seen":"x"}` {
		t.Errorf("raw params: got %s, want them sent as is", raw)
	}

	err := c.Call(ctx, "fail", map[string]any{}, nil)
	var re *client.Error
	if !errors.As(err, &re) {
		t.Fatalf("Call fail: got %v, want *client.Error", err)
	}
	if re.Code != 4001 || re.Message != "unknown session" || string(re.Data) != `{"x":1}` {
		t.Errorf("client.Error: got %+v (data %s), want 4001 unknown session {\"x\":1}", re, re.Data)
	}
	if code := ErrorCode(err); code != 4001 {
		t.Errorf("ErrorCode: got %d, want 4001", code)
	}
	if code := ErrorCode(c.Call(ctx, "nope", nil, nil)); code != -32601 {
		t.Errorf("unknown method: got code %d, want -32601", code)
	}
}

func TestHandshake(t *testing.T) {
	tests := []struct {
		name       string
		path       string
		opts       Options
		wantURI    string
		wantHeader map[string]string
	}{
		{
			name:    "token in query",
			path:    "/api/ws",
			opts:    Options{Token: "secret"},
			wantURI: "/api/ws?token=secret",
		},
		{
			name:    "token from url kept",
			path:    "/api/ws?token=fromurl",
			opts:    Options{Token: "secret"},
			wantURI: "/api/ws?token=fromurl",
		},
		{
			name:       "bearer header instead of query",
			path:       "/api/ws",
			opts:       Options{Token: "secret", Header: http.Header{"Authorization": {"Bearer secret"}}},
			wantURI:    "/api/ws",
			wantHeader: map[string]string{"Authorization": "Bearer secret"},
		},
		{
			name:       "cookie instead of query",
			path:       "/api/ws",
			opts:       Options{Token: "secret", Header: http.Header{"Cookie": {"tether_token=secret"}}},
			wantURI:    "/api/ws",
			wantHeader: map[string]string{"Cookie": "tether_token=secret"},
		},
		{
			name:       "origin and host",
			path:       "/api/pty?attach=abc",
			opts:       Options{Origin: "http://evil.example", Header: http.Header{"Host": {"evil.example:80"}}},
			wantURI:    "/api/pty?attach=abc",
			wantHeader: map[string]string{"Origin": "http://evil.example", "Host": "evil.example:80"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seen := make(chan *serverConn, 1)
			s := newServer(t, func(sc *serverConn) {
				seen <- sc
				rpcHandler(sc)
			})
			url := strings.TrimSuffix(s.url, "/api/ws") + tt.path
			dial(t, url, tt.opts)
			sc := <-seen
			if sc.uri != tt.wantURI {
				t.Errorf("request URI: got %q, want %q", sc.uri, tt.wantURI)
			}
			for k, v := range tt.wantHeader {
				if got := sc.header.Get(k); got != v {
					t.Errorf("header %s: got %q, want %q", k, got, v)
				}
			}
		})
	}
}

func TestDialRefused(t *testing.T) {
	s := newServer(t, rpcHandler)
	_, err := Dial(testContext(t), s.url+"?refuse=1", Options{Token: "secret"})
	var se ws.StatusError
	if !errors.As(err, &se) || int(se) != http.StatusForbidden {
		t.Fatalf("Dial: got %v, want ws.StatusError 403", err)
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("error %q shows the token", err)
	}
}

func TestConcurrentCalls(t *testing.T) {
	s := newServer(t, rpcHandler)
	c := dial(t, s.url, Options{})
	ctx := testContext(t)

	const goroutines, calls = 16, 40
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				want := fmt.Sprintf("g%d-%d", g, i)
				var got struct {
					MS  int
					Tag string
				}
				params := map[string]any{"ms": rand.IntN(5), "tag": want}
				if err := c.Call(ctx, "slow", params, &got); err != nil {
					t.Errorf("Call %s: %v", want, err)
					return
				}
				if got.Tag != want {
					t.Errorf("Call %s: got result for %s", want, got.Tag)
				}
			}
		}()
	}
	wg.Wait()
}

func TestEventsInOrder(t *testing.T) {
	s := newServer(t, rpcHandler)
	c := dial(t, s.url, Options{})
	ctx := testContext(t)

	const n = 500
	if err := c.Call(ctx, "events", map[string]any{"n": n}, nil); err != nil {
		t.Fatalf("Call events: %v", err)
	}
	if e, err := c.NextEvent(ctx); err != nil || e.Type != "gateway.ready" || !strings.Contains(string(e.Raw), `"version":"test"`) {
		t.Fatalf("first event: got %+v, %v; want gateway.ready", e, err)
	}
	for i := 1; i <= n; i++ {
		e, err := c.NextEvent(ctx)
		if err != nil {
			t.Fatalf("NextEvent %d: %v", i, err)
		}
		if e.Seq != uint64(i) || e.Type != "message.delta" || e.SessionID != "0123abcd" {
			t.Fatalf("event %d: got %+v", i, e)
		}
		var p struct{ Text string }
		if err := e.Decode(&p); err != nil || p.Text != fmt.Sprintf("w%d ", i) {
			t.Fatalf("event %d payload: got %q, %v", i, p.Text, err)
		}
		if !strings.Contains(string(e.Raw), `"seq":`) {
			t.Fatalf("event %d Raw: got %s, want the event object", i, e.Raw)
		}
	}

	// The same through the channel, and WaitEvent skipping the others.
	if err := c.Call(ctx, "events", map[string]any{"n": 10}, nil); err != nil {
		t.Fatalf("Call events: %v", err)
	}
	e, err := c.WaitEvent(ctx, func(e Event) bool { return e.Seq == 3 })
	if err != nil || e.Seq != 3 {
		t.Fatalf("WaitEvent: got %+v, %v", e, err)
	}
	ch := c.Events()
	for want := uint64(4); want <= 10; want++ {
		select {
		case e := <-ch:
			if e.Seq != want {
				t.Fatalf("Events: got seq %d, want %d", e.Seq, want)
			}
		case <-ctx.Done():
			t.Fatalf("Events: no event with seq %d", want)
		}
	}
}

func TestUnconsumedEventsDoNotBlock(t *testing.T) {
	s := newServer(t, rpcHandler)
	c := dial(t, s.url, Options{})
	ctx := testContext(t)
	c.Events() // a pump with nobody reading its channel must not block either
	if err := c.Call(ctx, "events", map[string]any{"n": 20000}, nil); err != nil {
		t.Fatalf("Call events: %v", err)
	}
	var got string
	if err := c.Call(ctx, "echo", "still there", &got); err != nil || got != "still there" {
		t.Fatalf("Call echo after 20000 unread events: got %q, %v", got, err)
	}
}

func TestRawResponses(t *testing.T) {
	s := newServer(t, rpcHandler)
	c := dial(t, s.url, Options{})
	ctx := testContext(t)

	if err := c.SendRaw([]byte("{not json")); err != nil {
		t.Fatalf("SendRaw: %v", err)
	}
	p, err := c.NextRaw(ctx)
	if err != nil {
		t.Fatalf("NextRaw: %v", err)
	}
	var resp struct {
		ID    json.RawMessage
		Error client.Error
	}
	if err := json.Unmarshal(p, &resp); err != nil || string(resp.ID) != "null" || resp.Error.Code != -32700 {
		t.Fatalf("parse error response: got %s, want -32700 with id null", p)
	}

	// A response that arrives after its Call gave up is raw too.
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	err = c.Call(short, "slow", map[string]any{"ms": 200}, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Call slow: got %v, want deadline exceeded", err)
	}
	select {
	case p := <-c.RawResponses():
		if !strings.Contains(string(p), `"ms":200`) {
			t.Fatalf("late response: got %s", p)
		}
	case <-ctx.Done():
		t.Fatal("late response not delivered as raw")
	}
}

func TestSendBinary(t *testing.T) {
	got := make(chan []byte, 1)
	s := newServer(t, func(sc *serverConn) {
		p, op, err := wsutil.ReadClientData(sc)
		if err == nil && op == ws.OpBinary {
			got <- p
		}
		close(got)
		wsutil.ReadClientData(sc) // until the client goes
	})
	c := dial(t, s.url, Options{})
	if err := c.SendBinary([]byte{0, 1, 2}); err != nil {
		t.Fatalf("SendBinary: %v", err)
	}
	if p := <-got; string(p) != "\x00\x01\x02" {
		t.Errorf("server got %q, want a binary frame 00 01 02", p)
	}
}

func TestPingAnswered(t *testing.T) {
	got := make(chan wsutil.Message, 1)
	s := newServer(t, func(sc *serverConn) {
		sc.writeFrame(ws.NewPingFrame([]byte("hello")))
		// ReadClientMessage insists on masked frames (server side state).
		m, err := wsutil.ReadClientMessage(sc, nil)
		if err == nil && len(m) == 1 {
			got <- m[0]
		}
		close(got)
		wsutil.ReadClientData(sc)
	})
	dial(t, s.url, Options{})
	select {
	case m := <-got:
		if m.OpCode != ws.OpPong || string(m.Payload) != "hello" {
			t.Errorf("got opcode %v payload %q, want a masked pong \"hello\"", m.OpCode, m.Payload)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no pong")
	}
}

func TestCloseCodeReported(t *testing.T) {
	s := newServer(t, func(sc *serverConn) {
		sc.sendClose(4401, "unauthorized")
		wsutil.ReadClientData(sc) // reads the client's answer
	})
	c := dial(t, s.url, Options{})
	select {
	case <-c.Closed():
	case <-time.After(5 * time.Second):
		t.Fatal("connection not closed")
	}
	if code, reason := c.CloseCode(); code != 4401 || reason != "unauthorized" {
		t.Errorf("CloseCode: got %d %q, want 4401 unauthorized", code, reason)
	}
	ctx := testContext(t)
	err := c.Call(ctx, "echo", nil, nil)
	var ce *client.CloseError
	if !errors.Is(err, client.ErrClosed) || !errors.As(err, &ce) || ce.Code != 4401 {
		t.Errorf("Call after close: got %v, want a *client.CloseError 4401", err)
	}
	if e, err := c.NextEvent(ctx); err != nil || e.Type != "gateway.ready" {
		t.Errorf("NextEvent after close: got %+v, %v; want the gateway.ready that came before", e, err)
	}
	if _, err := c.NextEvent(ctx); !errors.Is(err, client.ErrClosed) {
		t.Errorf("NextEvent after close: got %v, want client.ErrClosed", err)
	}
	if err := c.SendRaw([]byte("{}")); !errors.Is(err, client.ErrClosed) {
		t.Errorf("SendRaw after close: got %v, want client.ErrClosed", err)
	}
	if _, ok := <-c.Events(); ok {
		t.Error("Events channel still open after close")
	}
}

// TestRefusedBeforeReady: a socket closed before gateway.ready (an
// access refusal) dials, and shows the code as a closed client.
func TestRefusedBeforeReady(t *testing.T) {
	for _, tt := range []struct {
		name string
		code int
		h    func(*serverConn)
	}{
		{"close frame", 4403, func(sc *serverConn) { sc.sendClose(4403, "forbidden"); wsutil.ReadClientData(sc) }},
		{"dropped", wire.CloseAbnormal, func(*serverConn) {}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t, tt.h)
			c := dial(t, s.url+"?noready=1", Options{})
			select {
			case <-c.Closed():
			default:
				t.Fatal("a refused client is not closed")
			}
			if code, _ := c.CloseCode(); code != tt.code {
				t.Errorf("CloseCode: %d, want %d", code, tt.code)
			}
			ctx := testContext(t)
			if _, err := c.NextEvent(ctx); !errors.Is(err, client.ErrClosed) {
				t.Errorf("NextEvent: %v, want client.ErrClosed", err)
			}
			var ce *client.CloseError
			if err := c.Call(ctx, "echo", nil, nil); !errors.As(err, &ce) || ce.Code != tt.code {
				t.Errorf("Call: %v", err)
			}
			if err := c.SendRaw([]byte("{}")); !errors.Is(err, client.ErrClosed) {
				t.Errorf("SendRaw: %v", err)
			}
			if _, ok := <-c.Events(); ok {
				t.Error("Events open")
			}
			if _, ok := <-c.RawResponses(); ok {
				t.Error("RawResponses open")
			}
			c.Drop()
		})
	}
}

func TestCloseSendsNormalClosure(t *testing.T) {
	got := make(chan error, 1)
	s := newServer(t, func(sc *serverConn) {
		_, _, err := wsutil.ReadClientData(sc)
		got <- err
	})
	c := dial(t, s.url, Options{})
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	var ce wsutil.ClosedError
	if err := <-got; !errors.As(err, &ce) || ce.Code != ws.StatusNormalClosure {
		t.Errorf("server read: got %v, want a close frame 1000", err)
	}
	if code, _ := c.CloseCode(); code != 1000 {
		t.Errorf("CloseCode after Close: got %d, want the echoed 1000", code)
	}
	if err := c.Call(testContext(t), "echo", nil, nil); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Call after Close: got %v, want client.ErrClosed", err)
	}
	c.Close() // idempotent
	c.Drop()
}

func TestDropIsAbrupt(t *testing.T) {
	got := make(chan error, 1)
	s := newServer(t, func(sc *serverConn) {
		_, _, err := wsutil.ReadClientData(sc)
		got <- err
	})
	c := dial(t, s.url, Options{})
	if err := c.Drop(); err != nil {
		t.Fatalf("Drop: %v", err)
	}
	select {
	case err := <-got:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("server read: got %v, want a connection reset", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("server saw nothing")
	}
	if code, _ := c.CloseCode(); code != wire.CloseAbnormal {
		t.Errorf("CloseCode after Drop: got %d, want %d", code, wire.CloseAbnormal)
	}
}

func TestServerDropReported(t *testing.T) {
	s := newServer(t, func(sc *serverConn) {
		// return: the connection closes without a close frame
	})
	c := dial(t, s.url, Options{})
	select {
	case <-c.Closed():
	case <-time.After(5 * time.Second):
		t.Fatal("connection not closed")
	}
	if code, _ := c.CloseCode(); code != wire.CloseAbnormal {
		t.Errorf("CloseCode: got %d, want %d", code, wire.CloseAbnormal)
	}
}

func TestCloseDuringCalls(t *testing.T) {
	s := newServer(t, rpcHandler)
	c := dial(t, s.url, Options{})
	ctx := testContext(t)
	errs := make(chan error, 8)
	for range 8 {
		go func() { errs <- c.Call(ctx, "slow", map[string]any{"ms": 300}, nil) }()
	}
	time.Sleep(50 * time.Millisecond)
	c.Drop()
	for range 8 {
		if err := <-errs; !errors.Is(err, client.ErrClosed) {
			t.Errorf("Call during Drop: got %v, want client.ErrClosed", err)
		}
	}
}
