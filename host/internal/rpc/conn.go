package rpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/link"
	"github.com/tether-agent/tether/host/internal/session"
	"github.com/tether-agent/tether/wire"
)

// maxPending is the number of requests one socket may have waiting; one
// more is answered -32000 "busy".
const maxPending = 256

// conn is one admitted /api/ws connection: a viewer of the sessions it
// bound.
type conn struct {
	id        contract.TransportID
	transport string          // the transport's name
	who       access.Identity // who the connection's credential names
	out       link.Sender
	gw        *Gateway
	log       zerolog.Logger

	mu sync.Mutex // guards the fields below
	// bindings holds, by runtime id, what each bind of a live session
	// gave this connection; an entry goes when its session is released
	// (Released) and all go through the funnel when the connection
	// closes.
	bindings map[string]session.Binding
	// legs and remote are a cluster host's: the connection's legs to
	// other hosts by host id, and by runtime id the sessions live there
	// that it reaches through them (remote.go).
	legs   map[string]*leg
	remote map[string]*leg
	// created holds the stored keys of the sessions this connection
	// created, which a credential that is not admin reaches at once.
	created map[string]bool
	queue   []*request // requests waiting for the worker
	working bool
	closed  bool
}

var (
	_ session.Viewer = (*conn)(nil)
	_ link.Conn      = (*conn)(nil)
)

// ID implements session.Viewer.
func (c *conn) ID() contract.TransportID { return c.id }

// Transport implements session.Viewer.
func (c *conn) Transport() string { return c.transport }

// Send implements session.Viewer.
func (c *conn) Send(frame []byte) {
	c.gw.metrics.FramesOut.Inc()
	c.gw.metrics.BytesOut.Add(float64(len(frame)))
	c.out.Send(contract.Command{Kind: contract.CommandSend, Conn: c.id.Conn, Data: frame})
}

// Released implements session.Viewer: the connection forgets a session
// that was released while it was bound to it.
func (c *conn) Released(s *session.Session) {
	c.mu.Lock()
	if b, ok := c.bindings[s.ID()]; ok && b.Session() == s {
		delete(c.bindings, s.ID())
	}
	c.mu.Unlock()
}

// ready sends gateway.ready.
func (c *conn) ready() {
	pc := c.gw.promptCaps.Get()
	frame, _ := json.Marshal(map[string]any{
		"jsonrpc": wire.JSONRPCVersion,
		"method":  wire.MethodEvent,
		"params": map[string]any{"type": wire.EventReady, "payload": wire.Ready{
			Version:            c.gw.version,
			Identity:           &wire.Identity{Name: c.who.Name, Scopes: c.readyScopes()},
			PromptCapabilities: wire.PromptCapabilities{Image: pc.Image, Audio: pc.Audio, EmbeddedContext: pc.EmbeddedContext},
		}},
	})
	c.Send(frame)
}

// readyScopes is what gateway.ready says the connection may do.
func (c *conn) readyScopes() []string {
	if s := c.scopes(); s != nil {
		return s
	}
	return []string{}
}

// respond sends a result or an error for id.
func (c *conn) respond(id json.RawMessage, result any, rerr *rpcError) {
	if frame := c.encodeResponse(id, result, rerr); frame != nil {
		c.Send(frame)
	}
}

// encodeResponse encodes the response for id, or nil for a notification
// (it gets none).
func (c *conn) encodeResponse(id json.RawMessage, result any, rerr *rpcError) []byte {
	if id == nil {
		return nil
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
		return nil
	}
	return frame
}

// OnFrame takes one data frame. It never blocks: malformed frames are
// answered at once; a cheap request (one whose method is inline) is
// answered on the caller's goroutine when nothing of this connection is
// queued or running, so that an idle socket's lookups cost no goroutine
// hand-off; every other request is queued for the connection's worker.
func (c *conn) OnFrame(data []byte, binary bool) {
	c.gw.metrics.FramesIn.Inc()
	c.gw.metrics.BytesIn.Add(float64(len(data)))
	if binary {
		c.respond(nullID, nil, errorf(wire.CodeInvalidRequest, "binary frames are not JSON-RPC requests"))
		return
	}
	req, rerr := decodeRequest(data)
	if rerr != nil {
		c.respond(nullID, nil, rerr)
		return
	}
	if c.gw.remote != nil {
		req.raw = bytes.Clone(data) // to relay to another host
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
		c.respond(validID(req.ID), nil, errorf(wire.CodeBusy, "busy"))
		return
	}
	c.queue = append(c.queue, req)
	c.startWorkerAndUnlock()
}

// work drains the request queue in order, then exits; an idle socket has
// no worker goroutine.
func (c *conn) work() {
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

// dispatch checks and serves one decoded request. On the link's
// goroutine (inline), a call that turns out to need to wait is handed to
// the worker instead.
func (c *conn) dispatch(req *request, inline bool) {
	id := req.ID
	if len(id) > 0 {
		if v := validID(id); !bytes.Equal(v, id) {
			c.respond(nullID, nil, errorf(wire.CodeInvalidRequest, "id must be a string, a number or null"))
			return
		}
	}
	if len(req.JSONRPC) > 0 && string(req.JSONRPC) != `"2.0"` {
		c.respond(validID(id), nil, errorf(wire.CodeInvalidRequest, `jsonrpc must be "2.0"`))
		return
	}
	var name string
	// A null method would unmarshal as "": only a JSON string is a method.
	if len(req.Method) == 0 || req.Method[0] != '"' || json.Unmarshal(req.Method, &name) != nil {
		c.respond(validID(id), nil, errorf(wire.CodeInvalidRequest, "method must be a string"))
		return
	}
	p, perr := parseParams(req.Params)
	if perr != nil {
		c.respond(id, nil, perr)
		return
	}
	m, ok := methods[name]
	if !ok {
		c.respond(id, nil, errorf(wire.CodeMethodNotFound, "method not found: %s", name))
		return
	}
	if c.gw.remote != nil && relaysMethod(name) {
		if sid, err := p.sessionID(); err == nil {
			if l := c.relayed(sid); l != nil {
				if err := l.l.Send(req.raw, false); err != nil {
					c.respond(id, nil, errorf(wire.CodeOwnerUnreachable, "owner unreachable; retry: %v", err))
				}
				return
			}
		}
	}
	if err := c.authorize(m.need, p); err != nil {
		c.log.Debug().Str("method", name).Str("credential", c.who.Name).Msg("request outside the credential's scope")
		c.respond(id, nil, toRPCError(err))
		return
	}
	c.log.Debug().Str("method", name).Msg("request")
	handedOff := false // to the worker, which counts its time when it serves it
	defer func() {
		if !handedOff {
			c.gw.metrics.RPCDuration.WithLabelValues(name).Observe(time.Since(req.arrived).Seconds())
		}
	}()
	result, err := m.serve(c, call{id: id, inline: inline, raw: req.raw}, p)
	if errors.Is(err, errWait) {
		handedOff = true
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
func (c *conn) enqueue(req *request) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.queue = append([]*request{req}, c.queue...)
	c.startWorkerAndUnlock()
}

// startWorkerAndUnlock starts the connection's worker unless it runs, and
// unlocks c.mu.
func (c *conn) startWorkerAndUnlock() {
	start := !c.working
	c.working = true
	c.mu.Unlock()
	if start {
		c.gw.wg.Add(1)
		go c.work()
	}
}

// OnClosed detaches the connection from every session it is bound to,
// through the table's funnel.
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
	c.mu.Unlock()
	c.gw.table.Detach(c.id, bs)
	c.closeLegs()
}

// bound records b, what a bind gave this connection. It runs under the
// session's lock (from a Reply); if the connection closed meanwhile it
// reports false and the caller detaches b again.
func (c *conn) bound(b session.Binding) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.bindings[b.Session().ID()] = b
	return true
}

// replyBind returns the Reply of a bind request.
func (c *conn) replyBind(id json.RawMessage, late *[]session.Binding) session.Reply {
	return func(b session.Binding, snap session.Snapshot, send func([]byte)) {
		if !c.bound(b) {
			*late = append(*late, b)
		}
		if frame := c.encodeResponse(id, snap, nil); frame != nil {
			send(frame) // c.Send, now or once the session's events are stored
		}
	}
}

// replyMade is replyBind for a session this connection creates: the
// connection reaches it before the reply is sent (madeSession).
func (c *conn) replyMade(id json.RawMessage, late *[]session.Binding) session.Reply {
	reply := c.replyBind(id, late)
	return func(b session.Binding, snap session.Snapshot, send func([]byte)) {
		c.madeSession(snap.SessionKey)
		reply(b, snap, send)
	}
}

// bindDone finishes a bind: a connection that closed while it bound is
// detached from what it bound.
func (c *conn) bindDone(late []session.Binding, err error) error {
	if len(late) > 0 {
		c.gw.table.Detach(c.id, late)
	}
	if err != nil {
		return err
	}
	return errReplied
}
