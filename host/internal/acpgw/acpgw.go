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
	"sync"

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
)

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
		in:         make(chan []byte, maxQueued),
		events:     make(chan json.RawMessage, 4096),
		stop:       make(chan struct{}),
		bindings:   make(map[string]session.Binding),
		byID:       make(map[string]string),
		loading:    make(map[string]*loadState),
		runs:       make(map[string]chan runEnd),
		ended:      make(map[string]runEnd),
		prompts:    make(map[string]int),
		promptText: make(map[string]string),
		asks:       make(map[string]context.CancelFunc),
	}
	pr, pw := io.Pipe()
	c.pw = pw
	c.asc = acp.NewAgentSideConnection(&acpAgent{c: c}, &frameWriter{c: c}, pr)
	c.asc.SetLogger(slog.New(slog.DiscardHandler))
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
	pw        *io.PipeWriter
	in        chan []byte          // client frames for the protocol reader
	events    chan json.RawMessage // table events for the event worker
	stop      chan struct{}        // closed when the connection ends
	stopOnce  sync.Once

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
	asks   map[string]context.CancelFunc
	closed bool
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

// Send implements session.Viewer: an event of a bound session, queued for
// the event worker (never blocking: a client that cannot keep up is
// closed with 1013 and can load its sessions again).
func (c *conn) Send(frame []byte) {
	select {
	case c.events <- frame:
	default:
		c.log.Warn().Msg("acp client too slow for its sessions' events; closing it")
		c.closeWith(contract.CloseTryAgainLater, "too slow")
	}
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
		ID     json.RawMessage `json:"id"`
		Method json.RawMessage `json:"method"`
		Result json.RawMessage `json:"result"`
		Error  json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(trimmed, &probe); err != nil || (len(probe.Method) == 0 && probe.Result == nil && probe.Error == nil) {
		c.sendError(probe.ID, -32600, "invalid request: no method")
		return
	}
	if len(probe.Method) > 0 && probe.Method[0] != '"' {
		c.sendError(probe.ID, -32600, "invalid request: method must be a string")
		return
	}
	// A JSON message holds newlines only as white space: one line.
	line := bytes.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, trimmed)
	select {
	case c.in <- append(line, '\n'):
	default:
		c.closeWith(contract.CloseTryAgainLater, "too many messages waiting")
	}
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

// pumpIn feeds the client's frames to the protocol reader.
func (c *conn) pumpIn() {
	defer c.g.wg.Done()
	for {
		select {
		case line := <-c.in:
			if _, err := c.pw.Write(line); err != nil {
				return
			}
		case <-c.stop:
			_ = c.pw.Close()
			return
		case <-c.g.ctx.Done():
			_ = c.pw.Close()
			return
		}
	}
}

// OnClosed implements link.Conn: the connection leaves every session it
// bound through the table's funnel; runs it started go on.
func (c *conn) OnClosed() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	bs := make([]session.Binding, 0, len(c.bindings))
	for _, b := range c.bindings {
		bs = append(bs, b)
	}
	c.bindings = nil
	for _, cancel := range c.asks {
		cancel()
	}
	c.mu.Unlock()
	c.stopOnce.Do(func() { close(c.stop) })
	c.g.cfg.Table.Detach(c.id, bs)
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
			w.c.sendFrame(bytes.Clone(line))
		}
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}
