// Package acpgw is the /acp endpoint: tether as the Agent Client Protocol
// agent to unmodified ACP clients (editors, the SDKs' clients), one ACP
// JSON-RPC message per WebSocket text frame, spoken with
// github.com/coder/acp-go-sdk. An ACP session is a tether session (its
// sessionId is the stored key): session/new creates one with the
// configured agent, session/prompt submits a prompt and answers when its
// run ends, session/load replays the session's whole history from the
// journal before answering, session/resume with _meta["tether/after"]
// replays only what came after, and every session/update carries the
// event's seq in _meta["tether/seq"]. A connection is a viewer of the
// sessions it bound, like a native /api/ws one, so both kinds watch and
// drive the same session at once.
package acpgw

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/coder/acp-go-sdk"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/link"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/internal/session"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/wire"
)

// CodeTurnFailed is the JSON-RPC error of a session/prompt whose turn
// failed (the agent's error, or its crash); data.reason says why.
const CodeTurnFailed = wire.CodeTurnFailed

// Meta keys tether reads and writes.
const (
	// MetaSeq carries an update's event seq in session/update's _meta.
	MetaSeq = "tether/seq"
	// MetaAfter, in session/resume's _meta, asks for the updates after a
	// seq.
	MetaAfter = "tether/after"
	// MetaTruncated, true in a load's or resume's response _meta, says
	// the replay left out updates the journal no longer holds.
	MetaTruncated = "tether/truncated"
	// MetaRequestID, in a session/request_permission's _meta, is the
	// request's id (the request_id native clients see).
	MetaRequestID = "tether/request_id"
)

// closedMethod is the extension notification the connection feeds its
// protocol reader after a closed client's last message: the library
// dispatches notifications in order, so when it is handled every message
// before it was. A client cannot send it (OnFrame refuses it).
const closedMethod = "_tether/closed"

// startWait bounds how long the reader waits for a request to start
// before it feeds the next message.
const startWait = 10 * time.Second

// maxQueued bounds a connection's frames waiting for the protocol
// reader; a client that floods past it is closed with 1013.
const maxQueued = 1024

// Config configures a Gateway.
type Config struct {
	Table *session.Table
	Store *store.Store
	// Cwd is the working directory of sessions a client makes without
	// one.
	Cwd     string
	Version string
	Log     zerolog.Logger
	Metrics *metrics.Metrics
}

// Gateway is the /acp endpoint.
type Gateway struct {
	cfg    Config
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

var _ link.Endpoint = (*Gateway)(nil)

// New returns the /acp endpoint.
func New(cfg Config) *Gateway {
	ctx, cancel := context.WithCancel(context.Background())
	return &Gateway{cfg: cfg, ctx: ctx, cancel: cancel}
}

// Close ends every connection's work and waits for it.
func (g *Gateway) Close() {
	g.cancel()
	g.wg.Wait()
}

// Open implements link.Endpoint.
func (g *Gateway) Open(id contract.TransportID, transport string, _ *contract.Event, out link.FlowSender) link.Conn {
	out.Send(contract.Command{Kind: contract.CommandAdmit, Conn: id.Conn})
	c := &conn{
		g:          g,
		id:         id,
		transport:  transport,
		out:        out,
		log:        g.cfg.Log.With().Str("transport_id", id.String()).Str("endpoint", wire.PathACP).Logger(),
		in:         make(chan inLine, maxQueued),
		lines:      make(chan []byte),
		events:     make(chan struct{}, 1),
		closing:    make(chan struct{}),
		drained:    make(chan struct{}),
		stop:       make(chan struct{}),
		bindings:   make(map[string]session.Binding),
		byID:       make(map[string]string),
		loading:    make(map[string]*loadState),
		runs:       make(map[string]chan runEnd),
		ended:      make(map[string]runEnd),
		prompts:    make(map[string]int),
		promptText: make(map[string]string),
		asks:       make(map[string]*askState),
	}
	c.asc = acp.NewAgentSideConnection(&acpAgent{c: c}, &frameWriter{c: c}, &lineReader{lines: c.lines})
	// The library's own complaints (a notification it could not
	// handle, a connection it closed on overflow) are tether's warnings.
	c.asc.SetLogger(slog.New(slog.NewTextHandler(warnWriter{c.log}, &slog.HandlerOptions{Level: slog.LevelError})))
	g.wg.Add(2)
	go c.pumpIn()
	go c.pumpEvents()
	return c
}

// conn is one /acp connection: an ACP agent-side connection to the client
// and a viewer of the sessions it bound.
type conn struct {
	g         *Gateway
	id        contract.TransportID
	transport string
	out       link.Sender
	log       zerolog.Logger
	asc       *acp.AgentSideConnection
	in        chan inLine   // client frames for the protocol reader
	lines     chan []byte   // what the protocol reader reads; closed at the end
	events    chan struct{} // capacity 1: evq has frames for the event worker
	closing   chan struct{} // closed by OnClosed
	closeOnce sync.Once
	drained   chan struct{} // closed when the protocol reader handled closedMethod
	evmu      sync.Mutex    // guards evq, evbytes and evcut; a leaf lock
	evq       [][]byte      // events for the event worker, in order
	evbytes   int
	evcut     bool // the queue overflowed: the connection is being closed
	drainOnce sync.Once
	stop      chan struct{} // closed when the connection has ended

	mu sync.Mutex // guards the fields below
	// bindings by stored key (the ACP sessionId), and the stored key of
	// each bound runtime id.
	bindings map[string]session.Binding
	byID     map[string]string
	// loading holds the sessions being loaded or resumed: their live
	// events wait until the replay is out.
	loading map[string]*loadState
	// runs this connection submitted, by run id: told how they ended.
	runs map[string]chan runEnd
	// submitting counts this connection's Submits under way; ended keeps
	// the ends of runs that finished meanwhile (one may be a run whose
	// Submit has not returned yet).
	submitting int
	ended      map[string]runEnd
	// prompts and promptText: per runtime session id, this connection's
	// prompts being submitted and the last one's text, so their
	// message.start is not sent back to it as another client's prompt.
	prompts    map[string]int
	promptText map[string]string
	// asks are this connection's open permission requests to its client,
	// by request id: cancelled (withdrawn) when another answer wins.
	asks map[string]*askState
	// starting is the client request just fed to the protocol reader,
	// until its handler starts or it is answered; busy counts handlers
	// whose work on the connection's bindings is not done, and idle is
	// closed when busy drops to 0.
	starting *startingRequest
	busy     int
	idle     chan struct{}
	// closed: the connection has ended (or is ending): no binding is
	// kept and no request asked.
	closed bool
}

// askState is one permission request open at the client.
type askState struct {
	cancel context.CancelFunc // withdraws it
	done   chan struct{}      // closed when its goroutine is done
	// rpcID is the JSON-RPC id the client sees (compact), and answered
	// says the client's answer to it was fed to the protocol reader.
	rpcID    string
	answered bool
}

// startingRequest is a client request fed to the protocol reader whose
// handler has not started yet.
type startingRequest struct {
	id      string        // its JSON-RPC id, compact
	started chan struct{} // closed when its handler starts or it is answered
}

// inLine is one client message for the protocol reader.
type inLine struct {
	data []byte
	// request is the id of a request, response the id of a response
	// (compact), or "".
	request, response string
}

var (
	_ session.Viewer = (*conn)(nil)
	_ link.Conn      = (*conn)(nil)
)

// loadState holds a session's live events while its replay is sent.
type loadState struct {
	held []event
	// stored is closed when every event up to the bind's snapshot is
	// stored (so the journal can replay them all): the table hands the
	// barrier frame to Send only then.
	stored chan struct{}
}

// barrierPrefix starts the frames bind passes to the table's send
// function as a barrier; never a JSON-RPC message.
const barrierPrefix = "\x00barrier:"

// runEnd is how a run ended, from its message.complete.
type runEnd struct {
	RunID      string `json:"run_id"`
	Text       string `json:"text"`
	Status     string `json:"status"`
	StopReason string `json:"stop_reason"`
	Reason     string `json:"reason"`
}

// ID implements session.Viewer.
func (c *conn) ID() contract.TransportID { return c.id }

// Transport implements session.Viewer.
func (c *conn) Transport() string { return c.transport }

// maxEventBytes bounds the events queued for one /acp connection's event
// worker, like the WebSocket transport's send queue: a burst of updates
// (an agent streaming thousands unpaced) waits there while the worker
// encodes them; past the bound the connection is closed with 1013.
const maxEventBytes = 16 << 20

// Send implements session.Viewer: an event of a bound session, queued for
// the event worker (never blocking: a connection whose queue passes
// maxEventBytes is closed with 1013 and can load its sessions again).
func (c *conn) Send(frame []byte) {
	c.evmu.Lock()
	if c.evcut {
		c.evmu.Unlock()
		return
	}
	if c.evbytes+len(frame) > maxEventBytes {
		c.evcut, c.evq, c.evbytes = true, nil, 0
		c.evmu.Unlock()
		c.log.Warn().Msg("acp client too slow for its sessions' events; closing it")
		c.closeWith(contract.CloseTryAgainLater, "too slow")
		return
	}
	c.evq = append(c.evq, frame)
	c.evbytes += len(frame)
	c.evmu.Unlock()
	select {
	case c.events <- struct{}{}:
	default:
	}
}

// takeEvents returns the queued events and empties the queue.
func (c *conn) takeEvents() [][]byte {
	c.evmu.Lock()
	defer c.evmu.Unlock()
	q := c.evq
	c.evq, c.evbytes = nil, 0
	return q
}

// Released implements session.Viewer.
func (c *conn) Released(s *session.Session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.bindings[s.Key()]; ok && b.Session() == s {
		delete(c.bindings, s.Key())
		delete(c.byID, s.ID())
	}
}

func (c *conn) closeWith(code int, reason string) {
	c.out.Send(contract.Command{Kind: contract.CommandClose, Conn: c.id.Conn, Code: code, Reason: reason})
}

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
		c.closeWith(contract.CloseTryAgainLater, "too many messages waiting")
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
			w.c.sent(line)
			w.c.sendFrame(bytes.Clone(line))
		}
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

// rpcPrefix starts every message the library writes with an id: its
// responses and its requests (notifications have none).
var rpcPrefix = []byte(`{"jsonrpc":"2.0","id":`)

// sent notes a message to the client before it goes out: a response
// starts the request it answers (pumpIn waits for that); a permission
// request gets the JSON-RPC id its answer will carry.
func (c *conn) sent(line []byte) {
	if !bytes.HasPrefix(line, rpcPrefix) {
		return
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
		return
	}
	switch m.Method {
	case "":
		c.started(compactID(m.ID))
	case acp.ClientMethodSessionRequestPermission:
		c.mu.Lock()
		if a := c.asks[m.Params.Meta.RequestID]; a != nil {
			a.rpcID = compactID(m.ID)
		}
		c.mu.Unlock()
	}
}
