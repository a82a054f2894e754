package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gobwas/ws"

	"github.com/tether-agent/tether/wire"
)

// maxReady bounds the gateway.ready frame.
const maxReady = 64 << 10

// Event is a server event with the params object it came in, as received
// (for logging or forwarding).
type Event struct {
	wire.Event
	Raw json.RawMessage
}

// Conn is a JSON-RPC connection to a host's gateway (GET /api/ws). Its
// methods are safe for concurrent use: calls may overlap, and each
// response is matched to its call by id. One reader goroutine per Conn
// reads the host's frames; it ends with the connection, and Close or
// Abort wait for it.
type Conn struct {
	ws          *wsConn
	ready       Event
	events      chan Event // nil with Options.OnEvent
	onEvent     func(Event)
	onUnmatched func([]byte, bool)
	maxMessage  int64
	closeWait   time.Duration
	retries     int // Options.OverloadRetries
	nextID      atomic.Int64
	done        chan struct{} // closed when the reader has returned
	once        sync.Once     // Close or Abort, whichever comes first

	mu      sync.Mutex // guards the fields below
	pending map[int64]chan wire.Envelope
	err     error // why the connection ended; set before done is closed
}

// Dial connects to the gateway of the host at baseURL — http(s):// or
// ws(s)://host:port, with any path as a prefix, or the URL tether serve
// prints with its ?token= (moved to the Authorization header) — and
// returns once the host has sent gateway.ready. A host that refuses the
// socket closes it at once: Dial then returns a *CloseError with the
// code (wire.CloseUnauthorized, …).
func Dial(ctx context.Context, baseURL string, o Options) (*Conn, error) {
	u, token, err := Endpoint(baseURL, wire.PathRPC)
	if err != nil {
		return nil, err
	}
	if o.Token == "" {
		o.Token = token
	}
	return dial(ctx, u, o)
}

// DialURL is Dial for an endpoint URL used exactly as given, path and
// query included (http and https are mapped to ws and wss). It is for
// tools and tests that need a request Dial would not make, such as a
// host's access checks with a token in the query; Options.Token still
// travels in the Authorization header.
func DialURL(ctx context.Context, endpoint string, o Options) (*Conn, error) {
	u, err := wsURL(endpoint)
	if err != nil {
		return nil, err
	}
	return dial(ctx, u, o)
}

func dial(ctx context.Context, u *url.URL, o Options) (*Conn, error) {
	wc, first, err := dialWS(ctx, u, o, o.readBuffer(4<<10))
	if err != nil {
		return nil, err
	}
	msg, err := wc.readFirst(ctx, first, maxReady)
	if err != nil {
		wc.abort()
		return nil, err
	}
	ready, err := decodeReady(msg)
	if err != nil {
		wc.abort()
		return nil, err
	}
	c := &Conn{
		ws:          wc,
		ready:       ready,
		onEvent:     o.OnEvent,
		onUnmatched: o.OnUnmatched,
		maxMessage:  o.maxMessage(),
		closeWait:   o.closeWait(),
		retries:     o.overloadRetries(),
		done:        make(chan struct{}),
		pending:     make(map[int64]chan wire.Envelope),
	}
	if c.onEvent == nil {
		c.events = make(chan Event, o.eventBuffer())
	}
	go c.read()
	return c, nil
}

// decodeReady checks that the host's first frame is gateway.ready.
func decodeReady(msg []byte) (Event, error) {
	m, err := wire.DecodeEnvelope(msg)
	if err == nil && m.IsEvent() {
		var e wire.Event
		if e, err = m.Event(); err == nil && e.Type == wire.EventReady {
			return Event{Event: e, Raw: m.Params}, nil
		}
	}
	return Event{}, fmt.Errorf("%w: want gateway.ready first, got %.200q", ErrProtocol, msg)
}

// Ready returns the gateway.ready event the connection began with.
func (c *Conn) Ready() Event { return c.ready }

// Version returns the host's version from gateway.ready.
func (c *Conn) Version() string {
	var r wire.Ready
	_ = c.ready.Decode(&r)
	return r.Version
}

// Events returns the server events after gateway.ready, in order, in a
// channel of Options.EventBuffer that is closed once the connection has
// ended (after the events that arrived before the end). A reader that
// falls behind by a whole buffer ends the connection with
// ErrEventOverflow: no event is ever dropped silently. It returns nil
// when Options.OnEvent is set.
func (c *Conn) Events() <-chan Event { return c.events }

// Done returns a channel closed when the connection has ended.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns nil while the connection is open, and why it ended once
// Done is closed: a *CloseError (with ErrEventOverflow in its chain when
// that was the reason).
func (c *Conn) Err() error {
	select {
	case <-c.done:
	default:
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// closedErr is the error of a call on a connection that is ending.
func (c *Conn) closedErr() error {
	if err := c.Err(); err != nil {
		return err
	}
	return ErrClosed
}

// Call sends a request for method with params and waits for its
// response; params nil sends none, a json.RawMessage is sent as it is,
// anything else is encoded as JSON. The result is decoded into result
// unless it is nil. An error response is an *Error in the returned
// error's chain; an ended connection a *CloseError; ctx ending first
// ctx.Err() (a response that arrives later goes to Options.OnUnmatched).
// A call the host answers 5003 with data.retry_after_ms is sent again
// after it, as Options.OverloadRetries says.
func (c *Conn) Call(ctx context.Context, method string, params, result any) error {
	for attempt := 0; ; attempt++ {
		err := c.call(ctx, method, params, result)
		wait, ok := RetryAfter(err)
		if !ok || attempt >= c.retries || !overloadRetried[method] {
			return err
		}
		wait += rand.N(wait/2 + 1)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		case <-c.done:
			t.Stop()
			return err
		}
	}
}

// overloadRetried are the methods Call sends again after an overload's
// 5003: a second try cannot double what the first did, for the first
// wrote nothing (prompt.submit) or a second writes the same again.
var overloadRetried = map[string]bool{
	wire.MethodSubmit:      true,
	wire.MethodResume:      true,
	wire.MethodActivate:    true,
	wire.MethodEventsSince: true,
	wire.MethodList:        true,
	wire.MethodRuns:        true,
	wire.MethodActiveList:  true,
}

// call is one try of Call.
func (c *Conn) call(ctx context.Context, method string, params, result any) error {
	req := wire.Request{JSONRPC: wire.JSONRPCVersion, Method: method}
	switch p := params.(type) {
	case nil:
	case json.RawMessage:
		req.Params = p
	default:
		b, err := json.Marshal(params)
		if err != nil {
			return fmt.Errorf("%s: encoding params: %w", method, err)
		}
		req.Params = b
	}
	id := c.nextID.Add(1)
	req.ID = json.RawMessage(fmt.Appendf(nil, "%d", id))
	frame, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("%s: encoding request: %w", method, err)
	}
	ch := make(chan wire.Envelope, 1)
	c.mu.Lock()
	if c.pending == nil {
		c.mu.Unlock()
		return fmt.Errorf("%s: %w", method, c.closedErr())
	}
	c.pending[id] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, id) // a no-op once the map is gone
		c.mu.Unlock()
	}()
	if err := c.ws.write(ctx, ws.OpText, frame); err != nil {
		if errors.Is(err, ErrClosed) {
			err = c.closedErr()
		}
		return fmt.Errorf("%s: %w", method, err)
	}
	var resp wire.Envelope
	select {
	case resp = <-ch:
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", method, ctx.Err())
	case <-c.done:
		select {
		case resp = <-ch:
		default:
			return fmt.Errorf("%s: %w", method, c.closedErr())
		}
	}
	if resp.Error != nil {
		return fmt.Errorf("%s: %w", method, &Error{Code: resp.Error.Code, Message: resp.Error.Message, Data: resp.Error.Data})
	}
	if result != nil {
		if err := json.Unmarshal(resp.Result, result); err != nil {
			return fmt.Errorf("%s: decoding result: %w", method, err)
		}
	}
	return nil
}

// WriteRaw sends p as one frame, unchecked: for tests of a host's
// answers to malformed input. Any answer that is not a response to a
// pending call goes to Options.OnUnmatched.
func (c *Conn) WriteRaw(ctx context.Context, p []byte, binary bool) error {
	op := ws.OpText
	if binary {
		op = ws.OpBinary
	}
	if err := c.ws.write(ctx, op, p); err != nil {
		if errors.Is(err, ErrClosed) {
			return c.closedErr()
		}
		return err
	}
	return nil
}

// Close sends a close frame with code 1000, waits up to
// Options.CloseWait for the host's answer, closes the connection and
// waits for its reader. It is idempotent and returns nil.
func (c *Conn) Close() error {
	c.once.Do(func() {
		if c.ws.sendClose(wire.CloseNormal, "", c.closeWait) {
			t := time.NewTimer(c.closeWait)
			select {
			case <-c.done:
			case <-t.C:
			}
			t.Stop()
		}
		_ = c.ws.nc.Close()
		<-c.done
	})
	return nil
}

// Abort ends the connection at once, without a close frame (the host
// sees a reset), and waits for its reader. After Close it does nothing.
func (c *Conn) Abort() {
	c.once.Do(func() {
		c.ws.abort()
		<-c.done
	})
}

// read is the reader goroutine.
func (c *Conn) read() {
	var err error
	for err == nil {
		var msg []byte
		var op ws.OpCode
		msg, op, err = c.ws.readMessage(c.maxMessage)
		if err == nil {
			err = c.dispatch(msg, op == ws.OpBinary)
		}
	}
	_ = c.ws.nc.Close()
	c.mu.Lock()
	c.err = endErr(err)
	c.pending = nil
	c.mu.Unlock()
	close(c.done) // first: Err answers once Events is closed
	if c.events != nil {
		close(c.events)
	}
}

// dispatch routes one message: an event to the events, a response to its
// call, anything else to OnUnmatched. It fails only when the events
// overflow.
func (c *Conn) dispatch(msg []byte, binary bool) error {
	var m wire.Envelope
	var err error
	if !binary {
		m, err = wire.DecodeEnvelope(msg)
	}
	switch {
	case binary || err != nil:
	case m.IsEvent():
		e, err := m.Event()
		if err != nil {
			break
		}
		ev := Event{Event: e, Raw: m.Params}
		if c.onEvent != nil {
			c.onEvent(ev)
			return nil
		}
		select {
		case c.events <- ev:
			return nil
		default:
			return &CloseError{Code: wire.CloseAbnormal, Err: fmt.Errorf("%w (%d events)", ErrEventOverflow, cap(c.events))}
		}
	case m.IsResponse():
		id, ok := m.IntID()
		if !ok {
			break
		}
		c.mu.Lock()
		ch := c.pending[id]
		delete(c.pending, id)
		c.mu.Unlock()
		if ch != nil {
			ch <- m // buffered; one response per id
			return nil
		}
	}
	if c.onUnmatched != nil {
		c.onUnmatched(msg, binary)
	}
	return nil
}
