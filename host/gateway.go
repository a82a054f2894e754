package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/store"
)

// maxPending is the number of requests one socket may have waiting; one
// more is answered -32000 "busy" (SPEC §9).
const maxPending = 256

// Gateway is the JSON-RPC 2.0 dispatcher of /api/ws (SPEC §4).
type Gateway struct {
	table   *Table
	store   *store.Store
	version string
	log     zerolog.Logger
	metrics *Metrics
	// ctx is the gateway's lifetime, cancelled by Close; handlers that
	// wait (resume, close) use it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewGateway returns a dispatcher over table.
func NewGateway(table *Table, st *store.Store, version string, log zerolog.Logger, m *Metrics) *Gateway {
	ctx, cancel := context.WithCancel(context.Background())
	return &Gateway{table: table, store: st, version: version, log: log, metrics: m, ctx: ctx, cancel: cancel}
}

// Close cancels requests in flight and waits for their workers.
func (g *Gateway) Close() {
	g.cancel()
	g.wg.Wait()
}

// sender queues a command to a connection's transport. It never blocks.
type sender interface {
	send(cmd contract.Command)
}

// flowSender is a sender whose queue is bounded by waiting: the PTY
// output path waits for room so that backpressure reaches the backend.
type flowSender interface {
	sender
	// waitRoom waits, at most d, until the queue is under its high-water
	// mark; it reports false if d passed first.
	waitRoom(ctx context.Context, d time.Duration) bool
}

// gconn is one admitted /api/ws connection.
type gconn struct {
	id        contract.TransportID
	transport string // the transport's name
	out       sender
	gw        *Gateway
	log       zerolog.Logger

	mu       sync.Mutex // guards the fields below
	sessions map[string]*record
	queue    []*request // requests waiting for the worker
	working  bool
	closed   bool
}

var _ Viewer = (*gconn)(nil)

func (g *Gateway) newConn(id contract.TransportID, transport string, out sender) *gconn {
	return &gconn{
		id:        id,
		transport: transport,
		out:       out,
		gw:        g,
		log:       g.log.With().Str("transport_id", id.String()).Logger(),
		sessions:  make(map[string]*record),
	}
}

// ID implements Viewer.
func (c *gconn) ID() contract.TransportID { return c.id }

// Transport implements Viewer.
func (c *gconn) Transport() string { return c.transport }

// Send implements Viewer.
func (c *gconn) Send(frame []byte) {
	c.gw.metrics.FramesOut.Inc()
	c.gw.metrics.BytesOut.Add(float64(len(frame)))
	c.out.send(contract.Command{Kind: contract.CommandSend, Conn: c.id.Conn, Data: frame})
}

// ready sends gateway.ready.
func (c *gconn) ready() {
	frame, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0",
		"method":  "event",
		"params":  map[string]any{"type": "gateway.ready", "payload": map[string]string{"version": c.gw.version}},
	})
	c.Send(frame)
}

// rpcError is a JSON-RPC error object.
type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *rpcError) Error() string { return fmt.Sprintf("%d %s", e.Code, e.Message) }

func errorf(code int, format string, args ...any) *rpcError {
	return &rpcError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// request is a decoded JSON-RPC request.
type request struct {
	JSONRPC json.RawMessage `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  json.RawMessage `json:"method"`
	Params  json.RawMessage `json:"params"`
}

var nullID = json.RawMessage("null")

// respond sends a result or an error for id.
func (c *gconn) respond(id json.RawMessage, result any, rerr *rpcError) {
	if id == nil {
		return // a notification gets no response
	}
	var frame []byte
	var err error
	if rerr != nil {
		frame, err = json.Marshal(struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Error   *rpcError       `json:"error"`
		}{"2.0", id, rerr})
	} else {
		frame, err = json.Marshal(struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Result  any             `json:"result"`
		}{"2.0", id, result})
	}
	if err != nil {
		c.log.Error().Err(err).Msg("encoding response")
		return
	}
	c.Send(frame)
}

// onFrame takes one data frame. It never blocks: malformed frames are
// answered at once; a cheap request (one that never waits, see inline)
// is answered on the caller's goroutine when nothing of this connection is
// queued or running, so that an idle socket's lookups cost no goroutine
// hand-off; every other request is queued for the connection's worker.
func (c *gconn) onFrame(data []byte, binary bool) {
	c.gw.metrics.FramesIn.Inc()
	c.gw.metrics.BytesIn.Add(float64(len(data)))
	if binary {
		c.respond(nullID, nil, errorf(contract.CodeInvalidRequest, "binary frames are not JSON-RPC requests"))
		return
	}
	req, rerr := decodeRequest(data)
	if rerr != nil {
		c.respond(nullID, nil, rerr)
		return
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	if !c.working && req.inline() {
		// In order: nothing of this connection is queued or running,
		// and the caller delivers its frames one at a time.
		c.mu.Unlock()
		c.dispatch(req, true)
		return
	}
	if len(c.queue) >= maxPending {
		c.mu.Unlock()
		c.respond(validID(req.ID), nil, errorf(contract.CodeBusy, "busy"))
		return
	}
	c.queue = append(c.queue, req)
	c.startWorkerLocked()
}

// decodeRequest parses a text frame in one pass: invalid JSON is -32700,
// a JSON value that is not an object -32600. The request's fields are
// copies (json.RawMessage copies what it decodes), so data may be reused.
func decodeRequest(data []byte) (*request, *rpcError) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		if !json.Valid(trimmed) {
			return nil, errorf(contract.CodeParseError, "parse error")
		}
		return nil, errorf(contract.CodeInvalidRequest, "a request must be one JSON object")
	}
	req := new(request)
	if err := json.Unmarshal(trimmed, req); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, errorf(contract.CodeParseError, "parse error")
		}
		return nil, errorf(contract.CodeInvalidRequest, "invalid request: %v", err)
	}
	return req, nil
}

// validID returns id if it is a valid JSON-RPC id (string, number, null),
// else null.
func validID(id json.RawMessage) json.RawMessage {
	if len(id) == 0 {
		return nullID
	}
	switch id[0] {
	case '"', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'n':
		return id
	}
	return nullID
}

// work drains the request queue in order, then exits; an idle socket has
// no worker goroutine.
func (c *gconn) work() {
	defer c.gw.wg.Done()
	for {
		c.mu.Lock()
		if len(c.queue) == 0 || c.closed {
			c.queue = nil
			c.working = false
			c.mu.Unlock()
			return
		}
		req := c.queue[0]
		c.queue[0] = nil
		c.queue = c.queue[1:]
		c.mu.Unlock()
		c.dispatch(req, false)
	}
}

// handle decodes and dispatches one request frame on the caller's
// goroutine.
func (c *gconn) handle(data []byte) {
	req, rerr := decodeRequest(data)
	if rerr != nil {
		c.respond(nullID, nil, rerr)
		return
	}
	c.dispatch(req, false)
}

// inline reports whether req is for a method that may be served on the
// link's goroutine: it never waits (no database, agent or plugin call;
// only short in-memory locks). A malformed request is answered inline
// too: its error needs nothing else.
func (r *request) inline() bool {
	if len(r.Method) == 0 || r.Method[0] != '"' {
		return true
	}
	switch string(r.Method) {
	case `"session.events.since"`, `"session.active_list"`, `"session.runs"`:
		return true
	}
	return false
}

// dispatch checks and serves one decoded request. On the link's
// goroutine (inline), a call that turns out to need to wait is handed to
// the worker instead.
func (c *gconn) dispatch(req *request, inline bool) {
	id := req.ID
	if len(id) > 0 {
		if v := validID(id); !bytes.Equal(v, id) {
			c.respond(nullID, nil, errorf(contract.CodeInvalidRequest, "id must be a string, a number or null"))
			return
		}
	}
	if len(req.JSONRPC) > 0 && string(req.JSONRPC) != `"2.0"` {
		c.respond(validID(id), nil, errorf(contract.CodeInvalidRequest, `jsonrpc must be "2.0"`))
		return
	}
	var method string
	// A null method would unmarshal as "": only a JSON string is a method.
	if len(req.Method) == 0 || req.Method[0] != '"' || json.Unmarshal(req.Method, &method) != nil {
		c.respond(validID(id), nil, errorf(contract.CodeInvalidRequest, "method must be a string"))
		return
	}
	p, perr := parseParams(req.Params)
	if perr != nil {
		c.respond(id, nil, perr)
		return
	}
	h, ok := methods[method]
	if !ok {
		c.respond(id, nil, errorf(contract.CodeMethodNotFound, "method not found: %s", method))
		return
	}
	c.log.Debug().Str("method", method).Msg("request")
	result, err := h(c, call{id: id, inline: inline}, p)
	if errors.Is(err, errWait) {
		c.enqueue(req)
		return
	}
	if errors.Is(err, errReplied) {
		return
	}
	if err != nil {
		c.respond(id, nil, toRPCError(err))
		return
	}
	c.respond(id, result, nil)
}

// enqueue hands req to the connection's worker, at the head of its
// queue: it was taken inline because nothing was queued.
func (c *gconn) enqueue(req *request) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.queue = append([]*request{req}, c.queue...)
	c.startWorkerLocked()
}

// startWorkerLocked starts the connection's worker unless it runs, and
// unlocks c.mu.
func (c *gconn) startWorkerLocked() {
	start := !c.working
	c.working = true
	c.mu.Unlock()
	if start {
		c.gw.wg.Add(1)
		go c.work()
	}
}

// call is what a handler knows of the request it serves besides params.
type call struct {
	id     json.RawMessage
	inline bool // on the link's goroutine: return errWait rather than wait
}

// errWait tells dispatch that an inline call needs to wait (a database
// read): it is queued for the worker and served there.
var errWait = errors.New("needs the worker")

// errReplied tells handle that the handler already sent its response
// (binds answer under the session lock).
var errReplied = errors.New("replied")

// toRPCError maps table errors to SPEC §4 codes.
func toRPCError(err error) *rpcError {
	var re *rpcError
	switch {
	case errors.As(err, &re):
		return re
	case errors.Is(err, ErrUnknownSession):
		return errorf(contract.CodeUnknownSession, "unknown session_id; resume by stored key")
	case errors.Is(err, ErrNoLongerLive):
		return errorf(contract.CodeStoredNotFound, "session no longer live; retry resume")
	case errors.Is(err, ErrStoredNotFound):
		return errorf(contract.CodeStoredNotFound, "stored session not found")
	case errors.Is(err, ErrSessionBusy):
		return errorf(contract.CodeSessionBusy, "session busy: a run is in flight")
	case errors.Is(err, ErrBuildFailed), errors.Is(err, ErrTableClosed):
		return errorf(contract.CodeResumeFailed, "%v", err)
	}
	return errorf(contract.CodeInternalError, "internal error: %v", err)
}

// onClosed detaches the connection from every session it viewed, through
// the table's funnel.
func (c *gconn) onClosed() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	recs := make([]*record, 0, len(c.sessions))
	for _, rec := range c.sessions {
		recs = append(recs, rec)
	}
	c.mu.Unlock()
	c.gw.table.Detach(c.id, recs)
}

// bound records that the connection now views rec. It runs under rec.mu
// (from a Reply); if the connection closed meanwhile it reports false and
// the caller detaches it again.
func (c *gconn) bound(rec *record) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sessions[rec.id] = rec
	return !c.closed
}

// replyBind returns the Reply of a bind request.
func (c *gconn) replyBind(id json.RawMessage, late *[]*record) Reply {
	return func(rec *record, snap Snapshot) {
		if !c.bound(rec) {
			*late = append(*late, rec)
		}
		c.respond(id, snap, nil)
	}
}

// bindDone finishes a bind: a connection that closed while it bound is
// detached from what it bound.
func (c *gconn) bindDone(late []*record, err error) error {
	if len(late) > 0 {
		c.gw.table.Detach(c.id, late)
	}
	if err != nil {
		return err
	}
	return errReplied
}

// params is a decoded params object.
type params map[string]json.RawMessage

func parseParams(raw json.RawMessage) (params, *rpcError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, nullID) {
		return params{}, nil
	}
	if raw[0] != '{' {
		return nil, errorf(contract.CodeInvalidParams, "params must be an object")
	}
	var p params
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, errorf(contract.CodeInvalidParams, "params must be an object")
	}
	return p, nil
}

func (p params) has(name string) bool {
	v, ok := p[name]
	return ok && !bytes.Equal(v, nullID)
}

func (p params) str(name string) (string, *rpcError) {
	if !p.has(name) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(p[name], &s); err != nil {
		return "", errorf(contract.CodeInvalidParams, "%s must be a string", name)
	}
	return s, nil
}

func (p params) boolean(name string) (bool, *rpcError) {
	if !p.has(name) {
		return false, nil
	}
	var b bool
	if err := json.Unmarshal(p[name], &b); err != nil {
		return false, errorf(contract.CodeInvalidParams, "%s must be a boolean", name)
	}
	return b, nil
}

// integer decodes a non-negative integer (a JSON number with no fraction).
func (p params) integer(name string) (int64, bool, *rpcError) {
	if !p.has(name) {
		return 0, false, nil
	}
	// A JSON string holding a number would decode into a json.Number too:
	// only a number token is an integer.
	if c := p[name][0]; c != '-' && (c < '0' || c > '9') {
		return 0, false, errorf(contract.CodeInvalidParams, "%s must be a non-negative integer", name)
	}
	// The value is one JSON number token (params decoded it): an integer
	// is digits with an optional minus, which is what ParseInt takes.
	v, err := strconv.ParseInt(string(p[name]), 10, 64)
	if err != nil || v < 0 {
		return 0, false, errorf(contract.CodeInvalidParams, "%s must be a non-negative integer", name)
	}
	return v, true, nil
}

// sessionID type-checks session_id; a missing or empty one is 4006.
func (p params) sessionID() (string, *rpcError) {
	s, err := p.str("session_id")
	if err != nil {
		return "", err
	}
	if s == "" {
		return "", errorf(contract.CodeSessionRequired, "session_id required")
	}
	return s, nil
}

// live type-checks session_id and looks up that live session (4006,
// 4001).
func (c *gconn) live(p params) (*record, error) {
	sid, err := p.sessionID()
	if err != nil {
		return nil, err
	}
	return c.gw.table.Lookup(sid)
}

// handler answers one method. It returns the result, an error, or
// errReplied when it has responded itself.
type handler func(c *gconn, cl call, p params) (any, error)

var methods map[string]handler

func init() {
	methods = map[string]handler{
		"session.create":       (*gconn).create,
		"session.branch":       (*gconn).branch,
		"session.resume":       (*gconn).resume,
		"session.activate":     (*gconn).activate,
		"session.close":        (*gconn).close,
		"session.active_list":  (*gconn).activeList,
		"session.list":         (*gconn).list,
		"session.events.since": (*gconn).eventsSince,
		"prompt.submit":        (*gconn).submit,
		"session.runs":         (*gconn).runs,
		"session.interrupt":    (*gconn).interrupt,
	}
}

func (c *gconn) create(cl call, p params) (any, error) {
	title, err := p.str("title")
	if err != nil {
		return nil, err
	}
	cod, err := p.boolean("close_on_disconnect")
	if err != nil {
		return nil, err
	}
	parent, err := p.str("parent_session_id")
	if err != nil {
		return nil, err
	}
	if _, _, err := p.integer("cols"); err != nil {
		return nil, err
	}
	var late []*record
	ferr := c.gw.table.Create(c.gw.ctx, c, CreateOptions{Title: title, CloseOnDisconnect: cod, Parent: parent, ForkCount: -1}, c.replyBind(cl.id, &late))
	return nil, c.bindDone(late, ferr)
}

func (c *gconn) branch(cl call, p params) (any, error) {
	sid, err := p.sessionID()
	if err != nil {
		return nil, err
	}
	if _, _, err := p.integer("cols"); err != nil {
		return nil, err
	}
	title, err := p.str("title")
	if err != nil {
		return nil, err
	}
	parent, fork := sid, -1
	if !store.ValidKey(sid) {
		rec, lerr := c.gw.table.Lookup(sid)
		if lerr != nil {
			return nil, lerr
		}
		rec.mu.Lock()
		// Fork at the last completed turn: a turn in flight is not part
		// of the prefix (its rows are not all stored yet).
		parent, fork = rec.key, len(rec.messages)-rec.inflightRowsLocked()
		if title == "" {
			title = rec.title
		}
		rec.mu.Unlock()
	}
	var late []*record
	ferr := c.gw.table.Create(c.gw.ctx, c, CreateOptions{Title: title, Parent: parent, ForkCount: fork}, c.replyBind(cl.id, &late))
	return nil, c.bindDone(late, ferr)
}

func (c *gconn) resume(cl call, p params) (any, error) {
	sid, err := p.sessionID()
	if err != nil {
		return nil, err
	}
	if _, _, err := p.integer("cols"); err != nil {
		return nil, err
	}
	var late []*record
	rerr := c.gw.table.Resume(c.gw.ctx, c, sid, c.replyBind(cl.id, &late))
	return nil, c.bindDone(late, rerr)
}

func (c *gconn) activate(cl call, p params) (any, error) {
	sid, err := p.sessionID()
	if err != nil {
		return nil, err
	}
	var late []*record
	aerr := c.gw.table.Activate(c, sid, c.replyBind(cl.id, &late))
	return nil, c.bindDone(late, aerr)
}

func (c *gconn) close(cl call, p params) (any, error) {
	sid, err := p.sessionID()
	if err != nil {
		return nil, err
	}
	closed, cerr := c.gw.table.Close(c.gw.ctx, sid)
	if cerr != nil {
		return nil, cerr
	}
	return map[string]bool{"closed": closed}, nil
}

func (c *gconn) activeList(call, params) (any, error) {
	return map[string]any{"sessions": c.gw.table.Active()}, nil
}

// storedEntry is one row of session.list.
type storedEntry struct {
	ID           string `json:"id"`
	Title        string `json:"title"`
	StartedAt    int64  `json:"started_at"`
	EndedAt      *int64 `json:"ended_at"`
	EndReason    string `json:"end_reason"`
	MessageCount int    `json:"message_count"`
}

func (c *gconn) list(cl call, p params) (any, error) {
	limit, _, err := p.integer("limit")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(c.gw.ctx, 10*time.Second)
	defer cancel()
	rows, lerr := c.gw.store.List(ctx, int(min(limit, 10000)))
	if lerr != nil {
		return nil, fmt.Errorf("list stored sessions: %w", lerr)
	}
	out := make([]storedEntry, 0, len(rows))
	for _, s := range rows {
		e := storedEntry{ID: s.Key, Title: s.Title, StartedAt: s.StartedAt.Unix(), EndReason: s.EndReason, MessageCount: s.MessageCount}
		if !s.EndedAt.IsZero() {
			at := s.EndedAt.Unix()
			e.EndedAt = &at
		}
		out = append(out, e)
	}
	return map[string]any{"sessions": out}, nil
}

func (c *gconn) eventsSince(cl call, p params) (any, error) {
	sid, err := p.sessionID()
	if err != nil {
		return nil, err
	}
	if !p.has("last_seen") {
		return nil, errorf(contract.CodeInvalidParams, "last_seen must be a non-negative integer")
	}
	last, _, err := p.integer("last_seen")
	if err != nil {
		return nil, err
	}
	rec, lerr := c.gw.table.Lookup(sid)
	if lerr != nil {
		return nil, lerr
	}
	if r, ok := c.gw.table.eventsSinceLive(rec, uint64(last)); ok {
		return r, nil
	}
	if cl.inline {
		return nil, errWait // the database has the older events
	}
	ctx, cancel := context.WithTimeout(c.gw.ctx, 10*time.Second)
	defer cancel()
	r, eerr := c.gw.table.eventsSince(ctx, rec, uint64(last))
	if eerr != nil {
		return nil, fmt.Errorf("events since %d: %w", last, eerr)
	}
	return r, nil
}

func (c *gconn) submit(cl call, p params) (any, error) {
	sid, err := p.sessionID()
	if err != nil {
		return nil, err
	}
	if !p.has("text") {
		return nil, errorf(contract.CodeInvalidParams, "text must be a string")
	}
	text, err := p.str("text")
	if err != nil {
		return nil, err
	}
	rec, lerr := c.gw.table.Lookup(sid)
	if lerr != nil {
		return nil, lerr
	}
	runID, serr := c.gw.table.submit(rec, text)
	if serr != nil {
		return nil, serr
	}
	return map[string]string{"status": "streaming", "run_id": runID}, nil
}

func (c *gconn) runs(cl call, p params) (any, error) {
	rec, err := c.live(p)
	if err != nil {
		return nil, err
	}
	return map[string]any{"runs": rec.runList()}, nil
}

func (c *gconn) interrupt(cl call, p params) (any, error) {
	rec, err := c.live(p)
	if err != nil {
		return nil, err
	}
	if rec.interrupt() {
		return map[string]string{"status": "interrupted"}, nil
	}
	return map[string]string{"status": "idle"}, nil
}
