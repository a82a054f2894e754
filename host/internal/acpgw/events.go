package acpgw

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/coder/acp-go-sdk"

	"github.com/tether-agent/tether/host/internal/prompt"
	"github.com/tether-agent/tether/host/internal/session"
	"github.com/tether-agent/tether/wire"
)

// event is a table event as a connection reads it.
type event struct {
	Type      string          `json:"type"`
	SessionID string          `json:"session_id"`
	Seq       uint64          `json:"seq"`
	Payload   json.RawMessage `json:"payload"`
}

// pumpEvents turns the bound sessions' events into ACP messages, in order.
// It also closes the socket when the protocol library ended the
// connection by itself.
func (c *conn) pumpEvents() {
	defer c.g.wg.Done()
	ended := c.asc.Done()
	for {
		select {
		case <-ended:
			ended = nil
			select {
			case <-c.stop:
				return // finish ended it
			default:
			}
			c.log.Warn().Msg("the acp library ended the connection; closing it")
			c.closeWith(wire.CloseInternalError, "acp connection ended")
		case <-c.events:
			for _, frame := range c.takeEvents() {
				select {
				case <-c.stop:
					return
				default:
				}
				if bytes.HasPrefix(frame, []byte(barrierPrefix)) {
					c.passBarrier(string(frame[len(barrierPrefix):]))
					continue
				}
				ev, ok := parseFrame(frame)
				if !ok {
					continue
				}
				c.handleEvent(ev)
			}
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
	case wire.EventACPUpdate:
		// The payload is the ACP library's encoding of the update
		// already: it goes out as it is, not decoded and encoded again.
		c.notifyRaw(key, ev.Seq, ev.Payload)
	case wire.EventMessageStart:
		var p struct {
			RunID   string          `json:"run_id"`
			Prompt  string          `json:"prompt"`
			By      string          `json:"by"`
			Content json.RawMessage `json:"content"`
		}
		_ = json.Unmarshal(ev.Payload, &p)
		c.mu.Lock()
		_, mine := c.runs[p.RunID]
		mine = mine || c.prompts[ev.SessionID] > 0 && c.promptText[ev.SessionID] == p.Prompt
		c.mu.Unlock()
		if mine && !replay {
			break
		}
		// One user_message_chunk per block the client sent (the text
		// when it sent text only).
		blocks := []acp.ContentBlock{acp.TextBlock(p.Prompt)}
		if len(p.Content) > 0 {
			if b, err := prompt.Blocks(p.Content); err == nil {
				blocks = b
			} else {
				c.log.Warn().Err(err).Uint64("seq", ev.Seq).Msg("a prompt's stored content blocks are unreadable; sending its text")
			}
		}
		for _, b := range blocks {
			c.notifyBy(key, ev.Seq, acp.UpdateUserMessage(b), p.By)
		}
	case wire.EventMessageDelta:
		if s != nil && s.Turns() {
			return // its acp.update carries the text
		}
		var p struct{ Text string }
		_ = json.Unmarshal(ev.Payload, &p)
		c.notify(key, ev.Seq, acp.UpdateAgentMessageText(p.Text))
	case wire.EventMessageComplete:
		var p runEnd
		_ = json.Unmarshal(ev.Payload, &p)
		c.finishRun(p)
	case wire.EventPermissionRequest:
		if !replay {
			c.ask(key, ev)
		}
	case wire.EventPermissionResolved:
		var p struct {
			RequestID string `json:"request_id"`
		}
		_ = json.Unmarshal(ev.Payload, &p)
		c.mu.Lock()
		a := c.asks[p.RequestID]
		delete(c.asks, p.RequestID)
		c.mu.Unlock()
		if a != nil {
			a.cancel() // withdrawn from this client: $/cancel_request
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
func (c *conn) notify(key string, seq uint64, u acp.SessionUpdate) { c.notifyBy(key, seq, u, "") }

// notifyBy is notify of an update someone made (a prompt): its _meta
// names them too (MetaBy).
func (c *conn) notifyBy(key string, seq uint64, u acp.SessionUpdate, by string) {
	n := acp.SessionNotification{SessionId: acp.SessionId(key), Update: u, Meta: map[string]any{MetaSeq: seq}}
	if by != "" {
		n.Meta[MetaBy] = by
	}
	if err := c.asc.SessionUpdate(c.g.ctx, n); err != nil {
		c.log.Debug().Err(err).Msg("session/update to the acp client")
	}
}

// notifyRaw sends one session/update whose update object is already
// encoded the way the ACP library encodes it (an acp.update payload),
// with the event's seq: the bytes the library would write for
// notify(key, seq, update), made without decoding the update (see
// TestRawUpdatesAsTheLibraryWrites).
func (c *conn) notifyRaw(key string, seq uint64, update json.RawMessage) {
	sid, err := json.Marshal(key)
	if err != nil || len(update) == 0 {
		return
	}
	line := make([]byte, 0, len(updatePrefix)+len(sid)+len(update)+48)
	line = append(line, updatePrefix...)
	line = strconv.AppendUint(line, seq, 10)
	line = append(line, `},"sessionId":`...)
	line = append(line, sid...)
	line = append(line, `,"update":`...)
	line = append(line, update...)
	line = append(line, "}}"...)
	c.fw.writeLine(line)
}

// updatePrefix starts a session/update notification with tether/seq, as
// the library writes it (the JSON-RPC envelope, then the params' members
// in the order it encodes them).
const updatePrefix = `{"jsonrpc":"2.0","method":"session/update","params":{"_meta":{"` + MetaSeq + `":`

// eventPrefix starts every event frame the table sends a viewer: the
// JSON-RPC envelope around the event's params.
var eventPrefix = []byte(`{"jsonrpc":"2.0","method":"event","params":`)

// parseFrame reads an event frame the table sent.
func parseFrame(frame []byte) (event, bool) {
	if p, ok := bytes.CutPrefix(frame, eventPrefix); ok && len(p) > 0 && p[len(p)-1] == '}' {
		if ev, ok := scanParams(p[:len(p)-1]); ok {
			return ev, true
		}
	}
	var n struct {
		Params event `json:"params"`
	}
	if json.Unmarshal(frame, &n) != nil {
		return event{}, false
	}
	return n.Params, true
}

// parseParams reads the params of an event (a frame's, or one the
// journal replays).
func parseParams(raw []byte) (event, bool) {
	if ev, ok := scanParams(raw); ok {
		return ev, true
	}
	var ev event
	if json.Unmarshal(raw, &ev) != nil {
		return event{}, false
	}
	return ev, true
}

// scanParams reads event params in the one layout the table writes them
// in — {"type":…,"session_id":…,"seq":…,"payload":…}, the strings
// without escapes, the payload last — without decoding the payload,
// which it returns as it is (a slice of p). Anything else is not ok
// (then decoded in full). It does not validate: the table encoded p.
func scanParams(p []byte) (event, bool) {
	var ev event
	rest, ok := bytes.CutPrefix(p, []byte(`{"type":"`))
	if !ok {
		return ev, false
	}
	if ev.Type, rest, ok = scanString(rest); !ok {
		return ev, false
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(`,"session_id":"`)); !ok {
		return ev, false
	}
	if ev.SessionID, rest, ok = scanString(rest); !ok {
		return ev, false
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(`,"seq":`)); !ok {
		return ev, false
	}
	i := 0
	for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
		i++
	}
	seq, err := strconv.ParseUint(string(rest[:i]), 10, 64)
	if err != nil {
		return ev, false
	}
	ev.Seq = seq
	if rest, ok = bytes.CutPrefix(rest[i:], []byte(`,"payload":`)); !ok || len(rest) < 2 || rest[len(rest)-1] != '}' {
		return ev, false
	}
	ev.Payload = rest[:len(rest)-1]
	return ev, true
}

// scanString reads a JSON string's body up to its closing quote when it
// has no escapes.
func scanString(b []byte) (string, []byte, bool) {
	i := bytes.IndexByte(b, '"')
	if i < 0 || bytes.IndexByte(b[:i], '\\') >= 0 {
		return "", nil, false
	}
	return string(b[:i]), b[i+1:], true
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
	if !c.can(key, true) {
		return // a viewer is not asked what it may not answer
	}
	ctx, cancel := context.WithCancel(c.g.ctx)
	a := &askState{cancel: cancel, done: make(chan struct{})}
	c.mu.Lock()
	if _, asked := c.asks[p.RequestID]; c.closed || asked {
		c.mu.Unlock()
		cancel()
		return
	}
	c.asks[p.RequestID] = a
	c.mu.Unlock()
	c.g.wg.Add(1)
	go func() {
		defer c.g.wg.Done()
		defer close(a.done)
		defer cancel()
		// It stays in asks until its answer was handed on: a close
		// (finish) waits for it while it is answered.
		defer func() {
			c.mu.Lock()
			if c.asks[p.RequestID] == a {
				delete(c.asks, p.RequestID)
			}
			c.mu.Unlock()
		}()
		resp, err := c.asc.RequestPermission(ctx, acp.RequestPermissionRequest{
			Meta:      map[string]any{MetaRequestID: p.RequestID},
			SessionId: acp.SessionId(key), ToolCall: p.ToolCall, Options: p.Options,
		})
		c.mu.Lock()
		open := c.asks[p.RequestID] == a
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
		if err := s.RespondPermission(p.RequestID, option, c.who.Name, c.transport); err != nil && !errors.Is(err, session.ErrAlreadyResolved) {
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
// the snapshot. It calls leave once the binding is recorded (or
// refused).
// truncated reports that the replay had to leave out events the journal
// no longer holds (pruned by retention, or lost with an earlier host).
func (c *conn) bind(ctx context.Context, key string, replayAfter *uint64, create *session.CreateOptions, leave func()) (snapshot session.Snapshot, truncated bool, err error) {
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
	leave()
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
	if replayAfter != nil && *replayAfter > snap.LatestSeq {
		truncated = true // a seq this session never had (another epoch)
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
			if ev, ok := parseParams(raw); ok && ev.Seq <= snap.LatestSeq {
				c.deliver(key, ev, true)
			}
		}
	}
	// Requests still open are asked here too: a client that binds later
	// answers them like one that saw them asked.
	for _, p := range snap.PendingPermissions {
		payload, err := json.Marshal(p)
		if err == nil {
			c.ask(key, event{Type: wire.EventPermissionRequest, SessionID: snap.SessionID, Payload: payload})
		}
	}
	return snap, truncated, nil
}
