package client_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"

	"github.com/tether-agent/tether/wire"
)

// testWait bounds every wait of these tests; nothing sleeps a fixed time.
const testWait = 10 * time.Second

// fakeHost is a small gobwas WebSocket server on 127.0.0.1:0 that plays
// the host's side of the protocol: each upgraded connection is handed to
// the test as a peer.
type fakeHost struct {
	URL    string // http://127.0.0.1:PORT
	ln     net.Listener
	peers  chan *peer
	reject atomic.Int32 // an HTTP status to refuse upgrades with; 0 upgrades
	dials  atomic.Int32 // requests seen
	wg     sync.WaitGroup

	mu  sync.Mutex // guards the field below
	all []net.Conn
}

// peer is the host's end of one connection.
type peer struct {
	net.Conn
	t      testing.TB
	uri    string
	path   string
	query  url.Values
	header http.Header
	br     *bufio.Reader

	wmu sync.Mutex // serialises frames (the test's and control replies)
}

func newFakeHost(t testing.TB) *fakeHost {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &fakeHost{URL: "http://" + ln.Addr().String(), ln: ln, peers: make(chan *peer, 16)}
	h.wg.Add(1)
	go h.accept(t)
	t.Cleanup(func() {
		_ = ln.Close()
		h.mu.Lock()
		for _, c := range h.all {
			_ = c.Close()
		}
		h.mu.Unlock()
		h.wg.Wait()
	})
	return h
}

func (h *fakeHost) accept(t testing.TB) {
	defer h.wg.Done()
	for {
		nc, err := h.ln.Accept()
		if err != nil {
			return
		}
		h.mu.Lock()
		h.all = append(h.all, nc)
		h.mu.Unlock()
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.dials.Add(1)
			p := &peer{Conn: nc, t: t, header: http.Header{}}
			u := ws.Upgrader{
				OnRequest: func(uri []byte) error {
					p.uri = string(uri)
					if status := h.reject.Load(); status != 0 {
						return ws.RejectConnectionError(ws.RejectionStatus(int(status)))
					}
					return nil
				},
				OnHost: func(host []byte) error {
					p.header.Set("Host", string(host))
					return nil
				},
				OnHeader: func(key, value []byte) error {
					p.header.Add(string(key), string(value))
					return nil
				},
			}
			if _, err := u.Upgrade(nc); err != nil {
				_ = nc.Close()
				return
			}
			pu, _ := url.ParseRequestURI(p.uri)
			p.path, p.query = pu.Path, pu.Query()
			p.br = bufio.NewReader(nc)
			h.peers <- p
		}()
	}
}

// next returns the next connection.
func (h *fakeHost) next(t testing.TB) *peer {
	t.Helper()
	select {
	case p := <-h.peers:
		return p
	case <-time.After(testWait):
		t.Fatal("no connection")
	}
	return nil
}

// Write makes wsutil's control replies go under wmu.
func (p *peer) Write(b []byte) (int, error) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	return p.Conn.Write(b)
}

func (p *peer) frame(f ws.Frame) error {
	b, err := ws.CompileFrame(f)
	if err != nil {
		return err
	}
	_, err = p.Write(b)
	return err
}

func (p *peer) text(s string) {
	p.t.Helper()
	if err := p.frame(ws.NewTextFrame([]byte(s))); err != nil {
		p.t.Errorf("send text: %v", err)
	}
}

func (p *peer) binary(s string) {
	p.t.Helper()
	if err := p.frame(ws.NewBinaryFrame([]byte(s))); err != nil {
		p.t.Errorf("send binary: %v", err)
	}
}

func (p *peer) json(v any) {
	p.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		p.t.Fatal(err)
	}
	p.text(string(b))
}

func (p *peer) ready() {
	p.t.Helper()
	p.text(`{"jsonrpc":"2.0","method":"event","params":{"type":"gateway.ready","payload":{"version":"9.9"}}}`)
}

func (p *peer) event(e wire.Event) {
	p.t.Helper()
	b, err := wire.NewEvent(e)
	if err != nil {
		p.t.Fatal(err)
	}
	p.text(string(b))
}

func (p *peer) replay(r wire.Replay) {
	p.t.Helper()
	r.Type = wire.ReplayType
	p.json(r)
}

func (p *peer) sendClose(code int, reason string) {
	p.t.Helper()
	if err := p.frame(ws.NewCloseFrame(ws.NewCloseFrameBody(ws.StatusCode(code), reason))); err != nil {
		p.t.Errorf("send close: %v", err)
	}
}

// read returns the client's next data message; control frames are
// answered on the way (a close frame is answered and returned as a
// wsutil.ClosedError).
func (p *peer) read() (ws.OpCode, []byte, error) {
	_ = p.SetReadDeadline(time.Now().Add(testWait))
	msg, op, err := wsutil.ReadClientData(struct {
		io.Reader
		io.Writer
	}{p.br, p})
	return op, msg, err
}

// readClose expects a close frame next and returns its code.
func (p *peer) readClose() int {
	p.t.Helper()
	op, msg, err := p.read()
	var ce wsutil.ClosedError
	if !errors.As(err, &ce) {
		p.t.Fatalf("got %v %q %v from the client, want a close frame", op, msg, err)
	}
	return int(ce.Code)
}

// readFrame reads one raw frame, control frames included, unanswered,
// and fails the test unless it was masked (RFC 6455 for a client).
func (p *peer) readFrame() ws.Frame {
	p.t.Helper()
	_ = p.SetReadDeadline(time.Now().Add(testWait))
	h, err := ws.ReadHeader(p.br)
	if err != nil || h.Length > 1<<20 {
		p.t.Fatalf("read frame: %v (%d bytes)", err, h.Length)
	}
	f := ws.Frame{Header: h, Payload: make([]byte, h.Length)}
	if _, err := io.ReadFull(p.br, f.Payload); err != nil {
		p.t.Fatalf("read frame payload: %v", err)
	}
	if !f.Header.Masked {
		p.t.Errorf("an unmasked %v frame from the client", f.Header.OpCode)
	}
	return ws.UnmaskFrameInPlace(f)
}

// rpcHandler answers one request: a result, or an error object.
type rpcHandler func(req wire.Request) (any, *wire.ErrorObject)

// serve answers the client's requests with handle, each in its own
// goroutine (so responses may overtake each other), until the client
// goes; it returns when they are all answered.
func (p *peer) serve(handle rpcHandler) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		_, msg, err := p.read()
		if err != nil {
			return
		}
		var req wire.Request
		if json.Unmarshal(msg, &req) != nil {
			p.json(wire.Response{JSONRPC: "2.0", ID: json.RawMessage("null"), Error: &wire.ErrorObject{Code: wire.CodeParseError, Message: "parse error"}})
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			result, eo := handle(req)
			resp := wire.Response{JSONRPC: "2.0", ID: req.ID, Error: eo}
			if eo == nil {
				b, err := json.Marshal(result)
				if err != nil {
					p.t.Errorf("encode result: %v", err)
					return
				}
				resp.Result = b
			}
			p.json(resp)
		}()
	}
}

// gateway is a connection that got gateway.ready and is served by handle
// in the background until the client goes or the test ends.
func (h *fakeHost) gateway(t testing.TB, handle rpcHandler) *peer {
	t.Helper()
	p := h.next(t)
	p.ready()
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.serve(handle)
	}()
	t.Cleanup(func() {
		_ = p.Close()
		<-done
	})
	return p
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	t.Cleanup(cancel)
	return ctx
}

// result is what a call run in the background returned.
type result[T any] struct {
	v   T
	err error
}

// background runs f in a goroutine the test waits for at its end.
func background[T any](t testing.TB, f func() (T, error)) <-chan result[T] {
	ch := make(chan result[T], 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		v, err := f()
		ch <- result[T]{v, err}
	}()
	t.Cleanup(wg.Wait)
	return ch
}

func wait[T any](t testing.TB, ch <-chan result[T]) (T, error) {
	t.Helper()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-time.After(testWait):
		t.Fatal("call did not return")
	}
	var zero T
	return zero, nil
}

func bufioReader(r io.Reader) *bufio.Reader { return bufio.NewReader(r) }

// errReset is what a read of a connection reset by its peer returns.
var errReset = syscall.ECONNRESET
