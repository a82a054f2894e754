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
	"errors"
	"fmt"
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

// event is a table event as a connection reads it.
type event struct {
	Type      string          `json:"type"`
	SessionID string          `json:"session_id"`
	Seq       uint64          `json:"seq"`
	Payload   json.RawMessage `json:"payload"`
}

// pumpEvents turns the bound sessions' events into ACP messages, in order.
func (c *conn) pumpEvents() {
	defer c.g.wg.Done()
	for {
		select {
		case frame := <-c.events:
			if bytes.HasPrefix(frame, []byte(barrierPrefix)) {
				c.passBarrier(string(frame[len(barrierPrefix):]))
				continue
			}
			var n struct {
				Params event `json:"params"`
			}
			if json.Unmarshal(frame, &n) != nil {
				continue
			}
			c.handleEvent(n.Params)
		case <-c.stop:
			return
		case <-c.g.ctx.Done():
			return
		}
	}
}

// passBarrier tells the bind of key that its snapshot's events are
// stored.
func (c *conn) passBarrier(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ls := c.loading[key]; ls != nil {
		select {
		case <-ls.stored:
		default:
			close(ls.stored)
		}
	}
}

// handleEvent holds the event when its session is loading, else delivers
// it.
func (c *conn) handleEvent(ev event) {
	c.mu.Lock()
	key := c.byID[ev.SessionID]
	if ls := c.loading[key]; ls != nil && key != "" {
		ls.held = append(ls.held, ev)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	if key == "" {
		return
	}
	c.deliver(key, ev, false)
}

// deliver sends one event to the client as ACP: updates as session/update
// (with its seq), a prompt as a user_message_chunk (live, not to the
// client that sent it), an echo or exec agent's text as
// agent_message_chunk, permission requests as session/request_permission;
// a run's end answers the session/prompt that started it.
func (c *conn) deliver(key string, ev event, replay bool) {
	s := c.session(key)
	switch ev.Type {
	case "acp.update":
		var u acp.SessionUpdate
		if json.Unmarshal(ev.Payload, &u) == nil {
			c.notify(key, ev.Seq, u)
		}
	case "message.start":
		var p struct {
			RunID  string `json:"run_id"`
			Prompt string `json:"prompt"`
		}
		_ = json.Unmarshal(ev.Payload, &p)
		c.mu.Lock()
		_, mine := c.runs[p.RunID]
		mine = mine || c.prompts[ev.SessionID] > 0 && c.promptText[ev.SessionID] == p.Prompt
		c.mu.Unlock()
		if !mine || replay {
			c.notify(key, ev.Seq, acp.UpdateUserMessageText(p.Prompt))
		}
	case "message.delta":
		if s != nil && s.Turns() {
			return // its acp.update carries the text
		}
		var p struct{ Text string }
		_ = json.Unmarshal(ev.Payload, &p)
		c.notify(key, ev.Seq, acp.UpdateAgentMessageText(p.Text))
	case "message.complete":
		var p runEnd
		_ = json.Unmarshal(ev.Payload, &p)
		c.finishRun(p)
	case "permission.request":
		if !replay {
			c.ask(key, ev)
		}
	case "permission.resolved":
		var p struct {
			RequestID string `json:"request_id"`
		}
		_ = json.Unmarshal(ev.Payload, &p)
		c.mu.Lock()
		cancel := c.asks[p.RequestID]
		delete(c.asks, p.RequestID)
		c.mu.Unlock()
		if cancel != nil {
			cancel() // withdrawn from this client: $/cancel_request
		}
	}
}

// finishRun answers the session/prompt of a run this connection started.
// A run can end before its Submit returned here: while a prompt of this
// connection is being submitted, ends of runs nobody waits for are kept
// for it.
func (c *conn) finishRun(p runEnd) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch, ok := c.runs[p.RunID]; ok {
		ch <- p // buffered, one send
		delete(c.runs, p.RunID)
		return
	}
	if c.submitting > 0 {
		c.ended[p.RunID] = p
	}
}

// notify sends one session/update with the event's seq.
func (c *conn) notify(key string, seq uint64, u acp.SessionUpdate) {
	n := acp.SessionNotification{SessionId: acp.SessionId(key), Update: u, Meta: map[string]any{MetaSeq: seq}}
	if err := c.asc.SessionUpdate(c.g.ctx, n); err != nil {
		c.log.Debug().Err(err).Msg("session/update to the acp client")
	}
}

// ask sends a permission request to the client; its answer goes to the
// session (the first answer of any viewer wins) unless it was withdrawn.
func (c *conn) ask(key string, ev event) {
	var p struct {
		RequestID string                 `json:"request_id"`
		ToolCall  acp.ToolCallUpdate     `json:"tool_call"`
		Options   []acp.PermissionOption `json:"options"`
	}
	if json.Unmarshal(ev.Payload, &p) != nil {
		return
	}
	ctx, cancel := context.WithCancel(c.g.ctx)
	c.mu.Lock()
	if _, asked := c.asks[p.RequestID]; c.closed || asked {
		c.mu.Unlock()
		cancel()
		return
	}
	c.asks[p.RequestID] = cancel
	c.mu.Unlock()
	c.g.wg.Add(1)
	go func() {
		defer c.g.wg.Done()
		defer cancel()
		resp, err := c.asc.RequestPermission(ctx, acp.RequestPermissionRequest{SessionId: acp.SessionId(key), ToolCall: p.ToolCall, Options: p.Options})
		c.mu.Lock()
		_, open := c.asks[p.RequestID]
		delete(c.asks, p.RequestID)
		c.mu.Unlock()
		if err != nil || !open {
			return // withdrawn, or the client failed: dropped, never reaching the agent
		}
		s := c.session(key)
		if s == nil {
			return
		}
		var option *string
		if sel := resp.Outcome.Selected; sel != nil {
			o := string(sel.OptionId)
			option = &o
		}
		if err := s.RespondPermission(p.RequestID, option, c.transport); err != nil && !errors.Is(err, session.ErrAlreadyResolved) {
			c.log.Debug().Err(err).Msg("permission answer of the acp client")
		}
	}()
}

// session returns the bound live session of key, or nil.
func (c *conn) session(key string) *session.Session {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.bindings[key]; ok {
		return b.Session()
	}
	return nil
}

// bind binds the connection to key's live session (Resume) holding its
// live events, then replays the events from after (exclusive) up to the
// snapshot's latest seq, then lets the held live events go. It returns
// the snapshot.
// truncated reports that the replay had to leave out events the journal
// no longer holds (pruned by retention, or lost with an earlier host).
func (c *conn) bind(ctx context.Context, key string, replayAfter *uint64, create *session.CreateOptions) (snapshot session.Snapshot, truncated bool, err error) {
	ls := &loadState{stored: make(chan struct{})}
	var snap session.Snapshot
	var bound session.Binding
	reply := func(b session.Binding, sn session.Snapshot, send func([]byte)) {
		// Runs under the session's lock: record the binding (and hold
		// its live events) before any event of it reaches us.
		snap, bound = sn, b
		c.mu.Lock()
		if c.bindings != nil {
			c.bindings[sn.SessionKey] = b
			c.byID[sn.SessionID] = sn.SessionKey
			c.loading[sn.SessionKey] = ls
		}
		c.mu.Unlock()
		// Reaches Send once the events before the snapshot are stored.
		send([]byte(barrierPrefix + sn.SessionKey))
	}
	if create != nil {
		err = c.g.cfg.Table.Create(ctx, c, *create, reply)
	} else {
		err = c.g.cfg.Table.Resume(ctx, c, key, reply)
	}
	if err != nil {
		return session.Snapshot{}, false, err
	}
	key = snap.SessionKey
	defer func() {
		// Live events held meanwhile go out now, in order.
		for {
			c.mu.Lock()
			held := ls.held
			ls.held = nil
			if len(held) == 0 {
				if c.loading[key] == ls {
					delete(c.loading, key)
				}
				c.mu.Unlock()
				return
			}
			c.mu.Unlock()
			for _, ev := range held {
				if replayAfter == nil || ev.Seq > snap.LatestSeq {
					c.deliver(key, ev, false)
				}
			}
		}
	}()
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		c.g.cfg.Table.Detach(c.id, []session.Binding{bound})
		return session.Snapshot{}, false, errors.New("connection closed")
	}
	if replayAfter != nil && *replayAfter < snap.LatestSeq {
		select {
		case <-ls.stored:
		case <-c.stop:
			return session.Snapshot{}, false, errors.New("connection closed")
		case <-ctx.Done():
			return session.Snapshot{}, false, fmt.Errorf("replay of %s: %w", key, ctx.Err())
		}
		res, err := bound.Session().EventsSince(ctx, *replayAfter)
		if err != nil {
			return session.Snapshot{}, false, fmt.Errorf("replay of %s: %w", key, err)
		}
		truncated = res.Truncated
		for _, raw := range res.Events {
			var ev event
			if json.Unmarshal(raw, &ev) == nil && ev.Seq <= snap.LatestSeq {
				c.deliver(key, ev, true)
			}
		}
	}
	// Requests still open are asked here too: a client that binds later
	// answers them like one that saw them asked.
	for _, p := range snap.PendingPermissions {
		payload, err := json.Marshal(p)
		if err == nil {
			c.ask(key, event{Type: "permission.request", SessionID: snap.SessionID, Payload: payload})
		}
	}
	return snap, truncated, nil
}
