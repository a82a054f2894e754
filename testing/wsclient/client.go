// Package wsclient is a JSON-RPC test client for tether's gateway (GET
// /api/ws): a thin wrapper over package client that tests drive a
// running host with. On top of client.Conn it keeps every server event
// and every frame no call waited for in unbounded queues (so a test that
// reads no events never blocks the connection), takes gateway.ready as
// the first event, turns a socket the host refused into a Client that is
// already closed with the code, puts Options.Token in the URL's query
// (the host's query-token path; client itself only ever sends a bearer
// header) and sends raw or binary frames for malformed-input tests.
package wsclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/tether-agent/tether/client"
)

// DefaultTimeout is the Timeout used when Options.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// closeWait is how long Close waits for the server to answer its close frame
// before it closes the TCP connection anyway.
const closeWait = 2 * time.Second

// errQueueClosed reports that a queue is closed and drained, or that its
// consumer was stopped.
var errQueueClosed = errors.New("wsclient: queue closed")

// Options configure Dial.
type Options struct {
	// Token is the access token. Dial adds it to the URL as ?token= unless
	// the URL already has a token parameter or Header carries an
	// Authorization header or a page cookie (tether_PORT, or tether_token).
	Token string
	// Header holds extra handshake request headers. A "Host" entry replaces
	// the Host header derived from the URL.
	Header http.Header
	// Origin, when not empty, is sent as the Origin header.
	Origin string
	// Timeout bounds the TCP connect plus the WebSocket handshake and
	// gateway.ready, every frame write, and every Call whose ctx has no
	// deadline. Zero means DefaultTimeout; a negative value means no limit.
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

func eventOf(e client.Event) Event {
	return Event{Type: e.Type, SessionID: e.SessionID, Seq: e.Seq, Payload: e.Payload, Raw: e.Raw}
}

// ErrorCode returns the code of the *client.Error in err's chain, or 0 if there is
// none.
func ErrorCode(err error) int { return client.ErrorCode(err) }

// Client is a JSON-RPC client on one WebSocket connection. Its methods are
// safe for concurrent use.
type Client struct {
	conn    *client.Conn       // nil when the host refused the socket
	refused *client.CloseError // how it was refused; nil with a conn
	timeout time.Duration      // 0: no limit
	events  *queue[Event]
	raw     *queue[json.RawMessage] // frames that are neither events nor awaited responses
	done    <-chan struct{}         // closed when the connection has ended
	stop    chan struct{}           // closed by Close/Drop; stops the pumps
	once    sync.Once               // runs Close or Drop, whichever comes first
	pumps   sync.WaitGroup          // the pumps and the watcher of the end

	mu       sync.Mutex // guards the fields below
	shut     bool       // Close or Drop started: no new pumps
	eventsCh chan Event
	rawCh    chan json.RawMessage
}

// Dial connects to url (ws://host:port/api/ws?...) and returns once the
// host has sent gateway.ready, which is the first event NextEvent
// returns. A socket the host refuses by closing it before gateway.ready
// (an access-control refusal) is not an error: Dial returns a Client
// already closed, with the code in CloseCode. A handshake answered with
// another HTTP status than 101 is an error (a *client.DialError).
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
	if opts.Token != "" && !hasAuth(hdr) {
		q := u.Query()
		if !q.Has("token") {
			q.Set("token", opts.Token)
			u.RawQuery = q.Encode()
		}
	}
	c := &Client{
		timeout: timeout,
		events:  newQueue[Event](),
		raw:     newQueue[json.RawMessage](),
		stop:    make(chan struct{}),
	}
	limit := timeout
	if limit == 0 {
		limit = -1
	}
	conn, err := client.DialURL(ctx, u.String(), client.Options{
		Origin:       opts.Origin,
		Host:         host,
		Header:       hdr,
		DialTimeout:  limit,
		WriteTimeout: limit,
		CloseWait:    closeWait,
		OnEvent:      func(e client.Event) { c.events.push(eventOf(e)) },
		OnUnmatched:  func(frame []byte, _ bool) { c.raw.push(json.RawMessage(frame)) },
	})
	var ce *client.CloseError
	switch {
	case errors.As(err, &ce):
		c.refused = ce
		done := make(chan struct{})
		close(done)
		c.done = done
		c.events.close()
		c.raw.close()
		return c, nil
	case err != nil:
		return nil, fmt.Errorf("wsclient: %w", err)
	}
	c.conn, c.done = conn, conn.Done()
	c.events.pushFront(eventOf(conn.Ready()))
	c.pumps.Add(1)
	go func() {
		defer c.pumps.Done()
		<-c.done
		c.events.close()
		c.raw.close()
	}()
	return c, nil
}

// hasAuth reports whether h already carries an access token.
func hasAuth(h http.Header) bool {
	if h.Get("Authorization") != "" {
		return true
	}
	r := http.Request{Header: h}
	for _, c := range r.Cookies() {
		if strings.HasPrefix(c.Name, "tether_") {
			return true // a page cookie (tether_PORT) or the old tether_token
		}
	}
	return false
}

// withTimeout bounds ctx by the client's timeout when it has no deadline.
func (c *Client) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); !ok && c.timeout > 0 {
		return context.WithTimeout(ctx, c.timeout)
	}
	return ctx, func() {}
}

// Call sends {"jsonrpc":"2.0","id":N,"method":method,"params":params} (params
// left out when nil; a json.RawMessage is sent as is) and waits for the
// response with that id. A server error comes back as a *client.Error; otherwise
// the result is unmarshalled into out when out is not nil. A response that
// arrives after Call gave up (ctx done) goes to the raw queue.
func (c *Client) Call(ctx context.Context, method string, params any, out any) error {
	if c.conn == nil {
		return fmt.Errorf("wsclient: %s: %w", method, c.refused)
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	if err := c.conn.Call(ctx, method, params, out); err != nil {
		return fmt.Errorf("wsclient: %w", err)
	}
	return nil
}

// SendRaw writes data as one text frame, unchecked (for malformed-input
// tests). Any answer shows up as a raw response unless it carries the id of
// a pending Call.
func (c *Client) SendRaw(data []byte) error { return c.send(data, false) }

// SendBinary writes data as one binary frame.
func (c *Client) SendBinary(data []byte) error { return c.send(data, true) }

func (c *Client) send(data []byte, binary bool) error {
	if c.conn == nil {
		return c.refused
	}
	ctx, cancel := c.withTimeout(context.Background())
	defer cancel()
	return c.conn.WriteRaw(ctx, data, binary)
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
// connection has ended and the queue is empty it returns a *client.CloseError.
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
// *client.CloseError.
func (c *Client) NextRaw(ctx context.Context) (json.RawMessage, error) {
	p, err := c.raw.pop(ctx, nil)
	if errors.Is(err, errQueueClosed) {
		err = c.closedErr()
	}
	return p, err
}

// Closed returns a channel closed when the connection has ended.
func (c *Client) Closed() <-chan struct{} { return c.done }

// CloseCode returns the close code and reason the server sent; wire.CloseNoStatus
// for a close frame without a code, wire.CloseAbnormal when the connection ended
// without a close frame. It returns 0, "" while the connection is open.
func (c *Client) CloseCode() (code int, reason string) {
	var ce *client.CloseError
	if errors.As(c.closedErr(), &ce) {
		return ce.Code, ce.Reason
	}
	return 0, ""
}

// closedErr describes the end of the connection (client.ErrClosed while it is
// ending).
func (c *Client) closedErr() error {
	if c.conn == nil {
		return c.refused
	}
	if err := c.conn.Err(); err != nil {
		return err
	}
	return client.ErrClosed
}

// Close sends a close frame with code 1000, waits briefly for the server's
// answer, closes the connection and waits for its goroutines. It is
// idempotent and always returns nil.
func (c *Client) Close() error {
	c.once.Do(func() { c.shutdown(true) })
	return nil
}

// Drop closes the TCP connection abruptly, without a close frame: with
// SO_LINGER 0 the server sees a reset. It waits for the connection's
// goroutines and is a no-op after Close or Drop.
func (c *Client) Drop() error {
	c.once.Do(func() { c.shutdown(false) })
	return nil
}

func (c *Client) shutdown(graceful bool) {
	c.mu.Lock()
	c.shut = true
	c.mu.Unlock()
	close(c.stop)
	if c.conn != nil {
		if graceful {
			_ = c.conn.Close()
		} else {
			c.conn.Abort()
		}
	}
	c.pumps.Wait()
}
