package acpgw

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/coder/acp-go-sdk"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/session"
	"github.com/tether-agent/tether/wire"
)

// OnFrame implements link.Conn: one JSON-RPC message per text frame.
// Frames that are not JSON-RPC at all are answered here (the protocol
// reader would drop them silently); the rest go to the reader, as one
// line each.
func (c *conn) OnFrame(data []byte, binary bool) {
	c.g.cfg.Metrics.FramesIn.Inc()
	c.g.cfg.Metrics.BytesIn.Add(float64(len(data)))
	if binary {
		c.sendError(nil, -32600, "binary frames are not JSON-RPC messages")
		return
	}
	trimmed := bytes.TrimSpace(data)
	if !json.Valid(trimmed) {
		c.sendError(nil, -32700, "parse error")
		return
	}
	if len(trimmed) == 0 || trimmed[0] != '{' {
		c.sendError(nil, -32600, "a message must be one JSON object")
		return
	}
	var probe struct {
		ID     *json.RawMessage `json:"id"` // nil when absent or null, as the library reads it
		Method json.RawMessage  `json:"method"`
		Result json.RawMessage  `json:"result"`
		Error  json.RawMessage  `json:"error"`
	}
	err := json.Unmarshal(trimmed, &probe)
	var id json.RawMessage
	if probe.ID != nil {
		id = *probe.ID
	}
	if err != nil || (len(probe.Method) == 0 && probe.Result == nil && probe.Error == nil) {
		c.sendError(id, -32600, "invalid request: no method")
		return
	}
	var method string
	if len(probe.Method) > 0 && json.Unmarshal(probe.Method, &method) != nil {
		c.sendError(id, -32600, "invalid request: method must be a string")
		return
	}
	// The rest of what the protocol reader decodes: a message it cannot
	// read is dropped there without an answer.
	var envelope struct {
		JSONRPC string            `json:"jsonrpc"`
		Error   *acp.RequestError `json:"error"`
	}
	if json.Unmarshal(trimmed, &envelope) != nil {
		c.sendError(id, -32600, "invalid request: jsonrpc must be a string, error an object with a numeric code")
		return
	}
	if method == closedMethod {
		if id != nil {
			c.sendError(id, -32601, "Method not found")
		}
		return
	}
	if len(trimmed) >= maxLine {
		// The library's reader stops at a longer line, ending the
		// connection: refuse the message instead.
		if id != nil {
			c.sendError(id, -32602, fmt.Sprintf("message of %d bytes: at most %d", len(trimmed), maxLine-1))
		} else {
			c.log.Warn().Int("bytes", len(trimmed)).Str("method", method).Msg("acp notification too big; dropped")
		}
		return
	}
	if c.g.remote != nil && c.fromClient(trimmed, method, id) {
		return
	}
	// A JSON message holds newlines only as white space: one line.
	l := inLine{data: bytes.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, trimmed)}
	l.data = append(l.data, '\n')
	switch {
	case id != nil && method != "":
		l.request = compactID(id)
	case id != nil:
		l.response = compactID(id)
	}
	select {
	case c.in <- l:
	default:
		c.closeWith(wire.CloseTryAgainLater, "too many messages waiting")
	}
}

// compactID is a JSON-RPC id as compact JSON, to compare ids.
func compactID(id json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, id) != nil {
		return string(id)
	}
	return b.String()
}

// sendError answers a message the protocol reader does not see.
func (c *conn) sendError(id json.RawMessage, code int, msg string) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": code, "message": msg}})
	c.sendFrame(b)
}

func (c *conn) sendFrame(b []byte) {
	c.g.cfg.Metrics.FramesOut.Inc()
	c.g.cfg.Metrics.BytesOut.Add(float64(len(b)))
	c.out.Send(contract.Command{Kind: contract.CommandSend, Conn: c.id.Conn, Data: b})
}

// pumpIn feeds the client's messages to the protocol reader, in order.
// A request is fed once the one before it has started (its handler runs,
// or the library answered it), so a close knows which handlers to wait
// for. When the client has closed, it feeds what is left, then
// closedMethod, and ends the connection once that was handled (finish).
func (c *conn) pumpIn() {
	defer c.g.wg.Done()
	alive := true // the protocol reader still reads
	for {
		select {
		case l := <-c.in:
			alive = alive && c.feed(l)
		case <-c.closing:
		drain:
			for alive {
				select {
				case l := <-c.in:
					alive = c.feed(l)
				default:
					break drain
				}
			}
			if alive && c.feed(inLine{data: []byte(`{"jsonrpc":"2.0","method":"` + closedMethod + `"}` + "\n")}) {
				select {
				case <-c.drained:
				case <-c.asc.Done():
				case <-c.g.ctx.Done():
				}
			}
			c.finish(true)
			return
		case <-c.g.ctx.Done():
			c.finish(false)
			return
		}
	}
}

// feed hands one message to the protocol reader; a request, until its
// handler started. It reports whether the reader still reads.
func (c *conn) feed(l inLine) bool {
	var st *startingRequest
	c.mu.Lock()
	if l.request != "" {
		st = &startingRequest{id: l.request, started: make(chan struct{})}
		c.starting = st
	}
	if l.response != "" {
		for _, a := range c.asks {
			if a.rpcID == l.response {
				a.answered = true
			}
		}
	}
	c.mu.Unlock()
	select {
	case c.lines <- l.data:
	case <-c.asc.Done():
		return false
	case <-c.g.ctx.Done():
		return false
	}
	if st == nil {
		return true
	}
	// OnFrame answers what the reader would drop, so every request
	// starts; startWait only bounds the wait should one not.
	t := time.NewTimer(startWait)
	defer t.Stop()
	select {
	case <-st.started:
		return true
	case <-t.C:
		c.log.Warn().Str("id", st.id).Msg("acp request neither handled nor answered; reading on")
		c.started(st.id)
		return true
	case <-c.asc.Done():
		return false
	case <-c.g.ctx.Done():
		return false
	}
}

// started marks the starting request started: its handler runs (id "")
// or the response with id was sent.
func (c *conn) started(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.starting; st != nil && (id == "" || id == st.id) {
		c.starting = nil
		close(st.started)
	}
}

// enter is called first by every request handler: the request started,
// and the connection's bindings stay until the returned leave is called
// (idempotent), once the handler's work on them is done.
func (c *conn) enter() (leave func()) {
	c.mu.Lock()
	c.busy++
	c.mu.Unlock()
	c.started("")
	return sync.OnceFunc(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.busy--; c.busy == 0 && c.idle != nil {
			close(c.idle)
			c.idle = nil
		}
	})
}

// waitIdle waits until no handler is busy, or shutdown.
func (c *conn) waitIdle() {
	for {
		c.mu.Lock()
		if c.busy == 0 {
			c.mu.Unlock()
			return
		}
		if c.idle == nil {
			c.idle = make(chan struct{})
		}
		idle := c.idle
		c.mu.Unlock()
		select {
		case <-idle:
		case <-c.g.ctx.Done():
			return
		}
	}
}

// finish ends the connection. After a client's close (drained), every
// message it sent was handled first: its permission answers reach their
// session and its requests' handlers are done with the bindings. Then
// the connection leaves every session it bound through the table's
// funnel (runs it started go on) and its protocol reader ends.
func (c *conn) finish(drained bool) {
	c.mu.Lock()
	c.closed = true
	var answered []chan struct{}
	for _, a := range c.asks {
		if drained && a.answered {
			answered = append(answered, a.done)
		} else {
			a.cancel()
		}
	}
	c.mu.Unlock()
	if drained {
		for _, done := range answered {
			select {
			case <-done:
			case <-c.g.ctx.Done():
			}
		}
		c.waitIdle()
	}
	c.mu.Lock()
	bs := make([]session.Binding, 0, len(c.bindings))
	for _, b := range c.bindings {
		bs = append(bs, b)
	}
	c.bindings = nil
	c.mu.Unlock()
	c.closeLegs()
	close(c.stop)
	close(c.lines)
	c.g.cfg.Table.Detach(c.id, bs)
}

// OnClosed implements link.Conn: the connection ends once the messages
// the client sent before closing were handled (pumpIn, finish).
func (c *conn) OnClosed() {
	c.closeOnce.Do(func() { close(c.closing) })
}

// lineReader is the protocol reader's input: the lines pumpIn feeds, EOF
// once lines is closed. Only the library's reader goroutine reads it.
type lineReader struct {
	lines <-chan []byte
	cur   []byte
}

func (r *lineReader) Read(p []byte) (int, error) {
	if len(r.cur) == 0 {
		l, ok := <-r.lines
		if !ok {
			return 0, io.EOF
		}
		r.cur = l
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// warnWriter logs each line written to it at warn level.
type warnWriter struct{ log zerolog.Logger }

func (w warnWriter) Write(p []byte) (int, error) {
	w.log.Warn().Str("from", "acp-go-sdk").Msg(strings.TrimSpace(string(p)))
	return len(p), nil
}

// frameWriter turns the protocol writer's lines into text frames.
type frameWriter struct {
	c   *conn
	mu  sync.Mutex
	buf []byte
}

func (w *frameWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		if line := bytes.TrimSpace(w.buf[:i]); len(line) > 0 {
			if w.c.sent(line) {
				w.c.sendFrame(bytes.Clone(line))
			}
		}
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

// writeLine sends one whole message (a notification, without its
// newline) between the library's writes, as if the library wrote it.
// The library writes each message whole in one Write, so none is ever
// cut by it.
func (w *frameWriter) writeLine(line []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.c.sendFrame(line)
}

// rpcPrefix starts every message the library writes with an id: its
// responses and its requests (notifications have none).
var rpcPrefix = []byte(`{"jsonrpc":"2.0","id":`)

// sent notes a message to the client before it goes out: a response
// starts the request it answers (pumpIn waits for that); a permission
// request gets the JSON-RPC id its answer will carry. It reports whether
// the message goes out: not the answer to a bind another host answers
// (remote.go).
func (c *conn) sent(line []byte) bool {
	if !bytes.HasPrefix(line, rpcPrefix) {
		return true
	}
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Meta struct {
				RequestID string `json:"tether/request_id"`
			} `json:"_meta"`
		} `json:"params"`
	}
	if json.Unmarshal(line, &m) != nil {
		return true
	}
	switch m.Method {
	case "":
		c.started(compactID(m.ID))
		if c.g.remote != nil && c.dropAnswer(m.ID) {
			return false
		}
	case acp.ClientMethodSessionRequestPermission:
		c.mu.Lock()
		if a := c.asks[m.Params.Meta.RequestID]; a != nil {
			a.rpcID = compactID(m.ID)
		}
		c.mu.Unlock()
	}
	return true
}
