// Package wsclient is a small JSON-RPC 2.0 over WebSocket client for tether's
// gateway (GET /api/ws, SPEC §4). Tests use it to drive a running host, and
// the `tether sessions` command uses it to list sessions.
//
// A Client owns one connection and one reader goroutine. The reader answers
// pings, routes responses to the Call waiting for their id, queues server
// events (notifications with method "event") and everything else in unbounded
// queues, so a consumer that never reads events never blocks it. The reader
// ends when the connection ends; Close and Drop wait for it.
//
// Client frames are masked, as RFC 6455 requires of a client.
package wsclient

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
)

// DefaultTimeout is the Timeout used when Options.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// Close codes the client reports itself rather than receives.
const (
	// CloseNoStatus is reported when the server's close frame carried no code.
	CloseNoStatus = 1005
	// CloseAbnormal is reported when the connection ended without a close
	// frame from the server (TCP drop, Drop, a read or write error).
	CloseAbnormal = 1006
)

// closeWait is how long Close waits for the server to answer its close frame
// before it closes the TCP connection anyway.
const closeWait = 2 * time.Second

var (
	// ErrClosed is returned (possibly wrapped in a *CloseError) by calls
	// made on a connection that has ended or is being closed.
	ErrClosed = errors.New("wsclient: connection closed")

	// errQueueClosed reports that a queue is closed and drained, or that its
	// consumer was stopped.
	errQueueClosed = errors.New("wsclient: queue closed")
)

// Options configure Dial.
type Options struct {
	// Token is the access token. Dial adds it to the URL as ?token= unless
	// the URL already has a token parameter or Header carries an
	// Authorization header or a tether_token cookie.
	Token string
	// Header holds extra handshake request headers. A "Host" entry replaces
	// the Host header derived from the URL.
	Header http.Header
	// Origin, when not empty, is sent as the Origin header.
	Origin string
	// Timeout bounds the TCP connect plus the WebSocket handshake, every
	// frame write, and every Call whose ctx has no deadline. Zero means
	// DefaultTimeout; a negative value means no limit.
	Timeout time.Duration
}

// Event is a server event: the params of a JSON-RPC notification with method
// "event".
type Event struct {
	Type      string          `json:"type"`
	SessionID string          `json:"session_id"`
	Seq       uint64          `json:"seq"`
	Payload   json.RawMessage `json:"payload"`
	// Raw is the event object (the notification's params) as received.
	Raw json.RawMessage `json:"-"`
}

// Decode unmarshals the event's payload into v.
func (e Event) Decode(v any) error {
	return json.Unmarshal(e.Payload, v)
}

// RPCError is a JSON-RPC error object returned by the server.
type RPCError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

func (e *RPCError) Error() string {
	return fmt.Sprintf("rpc error %d: %s", e.Code, e.Message)
}

// ErrorCode returns the code of the *RPCError in err's chain, or 0 if there is
// none.
func ErrorCode(err error) int {
	var re *RPCError
	if errors.As(err, &re) {
		return re.Code
	}
	return 0
}

// CloseError reports that the connection has ended, with the close code the
// server sent (CloseAbnormal if it sent none). errors.Is(err, ErrClosed) is
// true for it.
type CloseError struct {
	Code   int
	Reason string
	// Err is the read error that ended the connection, if it did not end
	// with a close frame.
	Err error
}

func (e *CloseError) Error() string {
	s := fmt.Sprintf("wsclient: connection closed with code %d", e.Code)
	if e.Reason != "" {
		s += " " + strconv.Quote(e.Reason)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is makes errors.Is(err, ErrClosed) hold.
func (e *CloseError) Is(target error) bool { return target == ErrClosed }

func (e *CloseError) Unwrap() error { return e.Err }

// Client is a JSON-RPC client on one WebSocket connection. Its methods are
// safe for concurrent use.
type Client struct {
	conn    net.Conn
	timeout time.Duration           // 0: no limit
	events  *queue[Event]           // server events, in arrival order
	raw     *queue[json.RawMessage] // frames that are neither events nor awaited responses
	done    chan struct{}           // closed when the reader goroutine has returned
	stop    chan struct{}           // closed by Close/Drop; stops the pumps
	nextID  atomic.Int64
	once    sync.Once // runs Close or Drop, whichever comes first
	pumps   sync.WaitGroup

	wmu       sync.Mutex // serialises frame writes; guards closeSent
	closeSent bool

	mu       sync.Mutex            // guards the fields below
	pending  map[int64]chan []byte // nil once the reader has returned
	code     int
	reason   string
	readErr  error
	shut     bool // Close or Drop started: no new pumps
	eventsCh chan Event
	rawCh    chan json.RawMessage
}

// Dial connects to url (ws://host:port/api/ws?...) and returns once the TCP
// connection is up and the WebSocket handshake is done. It does not wait for
// any frame: if the server closes at once with a code (an access-control
// refusal), Dial still succeeds and the close shows through Closed and
// CloseCode. A handshake answered with another HTTP status than 101 is an
// error (a ws.StatusError in the chain).
func Dial(ctx context.Context, rawURL string, opts Options) (*Client, error) {
	timeout := opts.Timeout
	switch {
	case timeout == 0:
		timeout = DefaultTimeout
	case timeout < 0:
		timeout = 0
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("wsclient: dial: %w", err)
	}
	hdr := opts.Header.Clone()
	if hdr == nil {
		hdr = http.Header{}
	}
	host := hdr.Get("Host")
	hdr.Del("Host")
	if opts.Origin != "" {
		hdr.Set("Origin", opts.Origin)
	}
	if opts.Token != "" && !hasAuth(hdr) {
		q := u.Query()
		if !q.Has("token") {
			q.Set("token", opts.Token)
			u.RawQuery = q.Encode()
		}
	}
	d := ws.Dialer{Timeout: timeout, Host: host}
	if len(hdr) > 0 {
		d.Header = ws.HandshakeHeaderHTTP(hdr)
	}
	conn, br, _, err := d.Dial(ctx, u.String())
	if err != nil {
		return nil, fmt.Errorf("wsclient: dial %s: %w", redact(u), err)
	}
	c := &Client{
		conn:    conn,
		timeout: timeout,
		events:  newQueue[Event](),
		raw:     newQueue[json.RawMessage](),
		done:    make(chan struct{}),
		stop:    make(chan struct{}),
		pending: make(map[int64]chan []byte),
	}
	go c.readLoop(br)
	return c, nil
}

// hasAuth reports whether h already carries an access token.
func hasAuth(h http.Header) bool {
	if h.Get("Authorization") != "" {
		return true
	}
	r := http.Request{Header: h}
	_, err := r.Cookie("tether_token")
	return err == nil
}

// redact returns u as a string with its token parameter hidden.
func redact(u *url.URL) string {
	q := u.Query()
	if !q.Has("token") {
		return u.String()
	}
	q.Set("token", "REDACTED")
	v := *u
	v.RawQuery = q.Encode()
	return v.String()
}

type request struct {
	JSONRPC string `json:"jsonrpc"`
	ID      int64  `json:"id"`
	Method  string `json:"method"`
	Params  any    `json:"params,omitempty"`
}

type response struct {
	Result json.RawMessage `json:"result"`
	Error  *RPCError       `json:"error"`
}

// Call sends {"jsonrpc":"2.0","id":N,"method":method,"params":params} (params
// left out when nil; a json.RawMessage is sent as is) and waits for the
// response with that id. A server error comes back as a *RPCError; otherwise
// the result is unmarshalled into out when out is not nil. A response that
// arrives after Call gave up (ctx done) goes to the raw queue.
func (c *Client) Call(ctx context.Context, method string, params any, out any) error {
	if _, ok := ctx.Deadline(); !ok && c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	id := c.nextID.Add(1)
	b, err := json.Marshal(request{JSONRPC: "2.0", ID: id, Method: method, Params: params})
	if err != nil {
		return fmt.Errorf("wsclient: %s: encode params: %w", method, err)
	}
	ch := make(chan []byte, 1)
	c.mu.Lock()
	if c.pending == nil {
		c.mu.Unlock()
		return fmt.Errorf("wsclient: %s: %w", method, c.closedErr())
	}
	c.pending[id] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, id) // no-op on a nil map
		c.mu.Unlock()
	}()

	deadline, _ := ctx.Deadline()
	if err := c.write(ws.OpText, b, deadline); err != nil {
		return fmt.Errorf("wsclient: %s: %w", method, err)
	}
	select {
	case p := <-ch:
		return decodeResponse(method, p, out)
	case <-ctx.Done():
		return fmt.Errorf("wsclient: %s: %w", method, ctx.Err())
	case <-c.done:
		select {
		case p := <-ch:
			return decodeResponse(method, p, out)
		default:
		}
		return fmt.Errorf("wsclient: %s: %w", method, c.closedErr())
	}
}

func decodeResponse(method string, p []byte, out any) error {
	var r response
	if err := json.Unmarshal(p, &r); err != nil {
		return fmt.Errorf("wsclient: %s: decode response: %w", method, err)
	}
	if r.Error != nil {
		return r.Error
	}
	if out == nil {
		return nil
	}
	if r.Result == nil {
		return fmt.Errorf("wsclient: %s: response has no result: %s", method, p)
	}
	if err := json.Unmarshal(r.Result, out); err != nil {
		return fmt.Errorf("wsclient: %s: decode result: %w", method, err)
	}
	return nil
}

// SendRaw writes data as one text frame, unchecked (for malformed-input
// tests). Any answer shows up as a raw response unless it carries the id of
// a pending Call.
func (c *Client) SendRaw(data []byte) error {
	return c.write(ws.OpText, data, time.Time{})
}

// SendBinary writes data as one binary frame.
func (c *Client) SendBinary(data []byte) error {
	return c.write(ws.OpBinary, data, time.Time{})
}

// Events returns a channel of server events in arrival order. The channel is
// closed once the connection has ended and every queued event was delivered,
// or when Close or Drop is called. Events and NextEvent/WaitEvent take from
// the same queue: use one or the other.
func (c *Client) Events() <-chan Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.eventsCh == nil {
		ch := make(chan Event)
		c.eventsCh = ch
		c.startPumpLocked(func() { pump(c.events, ch, c.stop) }, func() { close(ch) })
	}
	return c.eventsCh
}

// RawResponses returns a channel of the text and binary frames that are
// neither events nor responses to a pending Call: responses with id null
// (parse errors) or an unknown id, other notifications, frames that are not
// JSON. It closes like the Events channel. RawResponses and NextRaw take from
// the same queue: use one or the other.
func (c *Client) RawResponses() <-chan json.RawMessage {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rawCh == nil {
		ch := make(chan json.RawMessage)
		c.rawCh = ch
		c.startPumpLocked(func() { pump(c.raw, ch, c.stop) }, func() { close(ch) })
	}
	return c.rawCh
}

// startPumpLocked runs f in a goroutine that Close and Drop wait for; after
// Close or Drop it runs closed instead.
func (c *Client) startPumpLocked(f, closed func()) {
	if c.shut {
		closed()
		return
	}
	c.pumps.Add(1)
	go func() {
		defer c.pumps.Done()
		f()
	}()
}

// pump moves items from q to ch until q is closed and drained or stop is
// closed, then closes ch.
func pump[T any](q *queue[T], ch chan<- T, stop <-chan struct{}) {
	defer close(ch)
	for {
		v, err := q.pop(context.Background(), stop)
		if err != nil {
			return
		}
		select {
		case ch <- v:
		case <-stop:
			return
		}
	}
}

// NextEvent returns the next server event, waiting until ctx is done. Once the
// connection has ended and the queue is empty it returns a *CloseError.
func (c *Client) NextEvent(ctx context.Context) (Event, error) {
	e, err := c.events.pop(ctx, nil)
	if errors.Is(err, errQueueClosed) {
		err = c.closedErr()
	}
	return e, err
}

// WaitEvent returns the first event for which match is true. Events before it
// that do not match are consumed and discarded.
func (c *Client) WaitEvent(ctx context.Context, match func(Event) bool) (Event, error) {
	for {
		e, err := c.NextEvent(ctx)
		if err != nil {
			return Event{}, err
		}
		if match(e) {
			return e, nil
		}
	}
}

// NextRaw returns the next raw response (see RawResponses), waiting until ctx
// is done. Once the connection has ended and the queue is empty it returns a
// *CloseError.
func (c *Client) NextRaw(ctx context.Context) (json.RawMessage, error) {
	p, err := c.raw.pop(ctx, nil)
	if errors.Is(err, errQueueClosed) {
		err = c.closedErr()
	}
	return p, err
}

// Closed returns a channel closed when the connection has ended.
func (c *Client) Closed() <-chan struct{} {
	return c.done
}

// CloseCode returns the close code and reason the server sent; CloseNoStatus
// for a close frame without a code, CloseAbnormal when the connection ended
// without a close frame. It returns 0, "" while the connection is open.
func (c *Client) CloseCode() (code int, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.code, c.reason
}

// closedErr describes the end of the connection.
func (c *Client) closedErr() error {
	select {
	case <-c.done:
	default:
		return ErrClosed // closing, not closed yet
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return &CloseError{Code: c.code, Reason: c.reason, Err: c.readErr}
}

// Close sends a close frame with code 1000, waits briefly for the server's
// answer, closes the connection and waits for the reader goroutine. It is
// idempotent and always returns nil.
func (c *Client) Close() error {
	c.once.Do(func() { c.shutdown(true) })
	return nil
}

// Drop closes the TCP connection abruptly, without a close frame: with
// SO_LINGER 0 the server sees a reset. It waits for the reader goroutine and
// is a no-op after Close or Drop.
func (c *Client) Drop() error {
	c.once.Do(func() { c.shutdown(false) })
	return nil
}

func (c *Client) shutdown(graceful bool) {
	c.mu.Lock()
	c.shut = true
	c.mu.Unlock()
	close(c.stop)

	if graceful {
		c.wmu.Lock()
		sent := c.closeSent
		c.closeSent = true
		if !sent {
			body := ws.NewCloseFrameBody(ws.StatusNormalClosure, "")
			_ = c.writeLocked(ws.OpClose, body, time.Now().Add(closeWait))
		}
		c.wmu.Unlock()
		t := time.NewTimer(closeWait)
		select {
		case <-c.done:
		case <-t.C:
		}
		t.Stop()
	} else if tc, ok := c.conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.conn.Close()
	<-c.done
	c.pumps.Wait()
}

// write writes one frame unless a close frame was already sent. A zero
// deadline means now + timeout.
func (c *Client) write(op ws.OpCode, p []byte, deadline time.Time) error {
	select {
	case <-c.done:
		return c.closedErr()
	default:
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closeSent {
		return ErrClosed
	}
	return c.writeLocked(op, p, deadline)
}

func (c *Client) writeLocked(op ws.OpCode, p []byte, deadline time.Time) error {
	if deadline.IsZero() && c.timeout > 0 {
		deadline = time.Now().Add(c.timeout)
	}
	_ = c.conn.SetWriteDeadline(deadline)
	if err := wsutil.WriteClientMessage(c.conn, op, p); err != nil {
		// A frame may be half written: the stream is unusable now. Closing
		// the connection ends the reader too.
		_ = c.conn.Close()
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

// closeReceived ends the read loop when the server's close frame arrived.
type closeReceived struct {
	code   int
	reason string
}

func (e *closeReceived) Error() string { return "close frame received" }

// readLoop is the reader goroutine. It reads from br if the handshake left
// buffered bytes there, else from the connection.
func (c *Client) readLoop(br *bufio.Reader) {
	var src io.Reader = c.conn
	if br != nil {
		src = br
	}
	code, reason, err := c.read(src)
	_ = c.conn.Close()
	if br != nil {
		ws.PutReader(br)
	}
	c.mu.Lock()
	c.code, c.reason, c.readErr = code, reason, err
	c.pending = nil
	c.mu.Unlock()
	c.events.close()
	c.raw.close()
	close(c.done)
}

// read reads frames until the connection ends and returns how it ended.
func (c *Client) read(src io.Reader) (code int, reason string, err error) {
	rd := &wsutil.Reader{
		Source:         src,
		State:          ws.StateClientSide,
		OnIntermediate: c.control,
	}
	for {
		hdr, err := rd.NextFrame()
		if err == nil && hdr.OpCode.IsControl() {
			err = c.control(hdr, rd)
			if err == nil {
				continue
			}
		}
		var p []byte
		if err == nil {
			p, err = io.ReadAll(rd)
		}
		if err != nil {
			var cr *closeReceived
			if errors.As(err, &cr) {
				return cr.code, cr.reason, nil
			}
			return CloseAbnormal, "", err
		}
		c.dispatch(hdr.OpCode, p)
	}
}

// control handles a control frame whose payload is r: answers a ping with a
// pong, answers a close frame (unless Close already sent one) and returns a
// *closeReceived for it.
func (c *Client) control(hdr ws.Header, r io.Reader) error {
	p, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	switch hdr.OpCode {
	case ws.OpPing:
		c.wmu.Lock()
		defer c.wmu.Unlock()
		if c.closeSent {
			return nil
		}
		return c.writeLocked(ws.OpPong, p, time.Time{})
	case ws.OpClose:
		code, reason := ws.ParseCloseFrameData(p)
		if len(p) < 2 {
			code = CloseNoStatus
		}
		c.wmu.Lock()
		if !c.closeSent {
			c.closeSent = true
			var body []byte
			if code != CloseNoStatus {
				body = ws.NewCloseFrameBody(code, "")
			}
			_ = c.writeLocked(ws.OpClose, body, time.Now().Add(closeWait))
		}
		c.wmu.Unlock()
		return &closeReceived{code: int(code), reason: reason}
	}
	return nil
}

// dispatch routes one data message: an event to the event queue, a response
// to the Call waiting for its id, anything else to the raw queue.
func (c *Client) dispatch(op ws.OpCode, p []byte) {
	if op == ws.OpText {
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params json.RawMessage `json:"params"`
		}
		if json.Unmarshal(p, &m) == nil {
			if m.ID == nil && m.Method == "event" {
				var e Event
				if json.Unmarshal(m.Params, &e) == nil {
					e.Raw = m.Params
					c.events.push(e)
					return
				}
			}
			var id int64
			if m.ID != nil && string(m.ID) != "null" && json.Unmarshal(m.ID, &id) == nil {
				c.mu.Lock()
				ch := c.pending[id]
				delete(c.pending, id)
				c.mu.Unlock()
				if ch != nil {
					ch <- p // buffered, one send per id
					return
				}
			}
		}
	}
	c.raw.push(json.RawMessage(p))
}
