package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/coder/acp-go-sdk"

	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/prompt"
	"github.com/tether-agent/tether/host/internal/session"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/wire"
)

// call is what a handler knows of the request it serves besides params.
type call struct {
	id     json.RawMessage
	inline bool   // on the link's goroutine: return errWait rather than wait
	raw    []byte // the request's frame, for relaying it to another host
}

// errWait tells dispatch that an inline call needs to wait (a database
// read): it is queued for the worker and served there.
var errWait = errors.New("needs the worker")

// errReplied tells handle that the handler already sent its response
// (binds answer under the session lock).
var errReplied = errors.New("replied")

// live type-checks session_id and looks up that live session (4006,
// 4001).
func (c *conn) live(p params) (*session.Session, error) {
	sid, err := p.sessionID()
	if err != nil {
		return nil, err
	}
	return c.gw.table.Lookup(sid)
}

// method is one entry of the method table: its handler, and whether it
// may be served on the link's goroutine (inline). An inline method never
// waits — no database, agent or plugin call, only short in-memory locks —
// or, when it finds it must, returns errWait and is served by the
// connection's worker instead.
type method struct {
	serve  func(c *conn, cl call, p params) (any, error)
	inline bool
	need   need // what the caller's credential must reach (authorize.go)
}

// methods is the gateway's method table, keyed by the method names of
// package wire (TestMethodsAreWire checks it has each of them).
var methods map[string]method

func init() {
	methods = map[string]method{
		wire.MethodCreate:            {serve: (*conn).create, need: needCreate},
		wire.MethodBranch:            {serve: (*conn).branch, need: needBranch},
		wire.MethodResume:            {serve: (*conn).resume, need: needResume},
		wire.MethodActivate:          {serve: (*conn).activate, need: needView},
		wire.MethodClose:             {serve: (*conn).close, need: needWrite},
		wire.MethodActiveList:        {serve: (*conn).activeList, inline: true, need: needAnyone},
		wire.MethodList:              {serve: (*conn).list, need: needAnyone},
		wire.MethodEventsSince:       {serve: (*conn).eventsSince, inline: true, need: needView},
		wire.MethodSubmit:            {serve: (*conn).submit, need: needWrite},
		wire.MethodRuns:              {serve: (*conn).runs, inline: true, need: needView},
		wire.MethodInterrupt:         {serve: (*conn).interrupt, need: needWrite},
		wire.MethodPermissionRespond: {serve: (*conn).permissionRespond, need: needWrite},
		wire.MethodClusterHosts:      {serve: (*conn).clusterHosts, inline: true, need: needAdmin},
		wire.MethodCredentialCreate:  {serve: (*conn).credentialCreate, need: needAdmin},
		wire.MethodCredentialList:    {serve: (*conn).credentialList, need: needAdmin},
		wire.MethodCredentialRevoke:  {serve: (*conn).credentialRevoke, need: needAdmin},
		wire.MethodPushKey:           {serve: (*conn).pushKey, inline: true, need: needAnyone},
		wire.MethodPushSubscribe:     {serve: (*conn).pushSubscribe, need: needAnyone},
		wire.MethodPushUnsubscribe:   {serve: (*conn).pushUnsubscribe, need: needAnyone},
	}
	for name, m := range methods {
		if m.need == needUnset {
			panic("rpc: method " + name + " says nothing of the scope it needs")
		}
	}
}

// inline reports whether req may be served on the link's goroutine (see
// method). A malformed request is answered inline too: its error needs
// nothing else.
func (r *request) inline() bool {
	var name string
	if len(r.Method) == 0 || r.Method[0] != '"' || json.Unmarshal(r.Method, &name) != nil {
		return true
	}
	m, ok := methods[name]
	return !ok || m.inline
}

func (c *conn) create(cl call, p params) (any, error) {
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
	var late []session.Binding
	ferr := c.gw.table.Create(c.gw.ctx, c, session.CreateOptions{Title: title, CloseOnDisconnect: cod, Parent: parent, ForkCount: -1}, c.replyMade(cl.id, &late))
	return nil, c.bindDone(late, ferr)
}

func (c *conn) branch(cl call, p params) (any, error) {
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
		s, lerr := c.gw.table.Lookup(sid)
		if lerr != nil {
			return nil, lerr
		}
		// Fork at the last completed turn.
		var own string
		parent, fork, own = s.ForkPoint()
		if title == "" {
			title = own
		}
	}
	var late []session.Binding
	ferr := c.gw.table.Create(c.gw.ctx, c, session.CreateOptions{Title: title, Parent: parent, ForkCount: fork}, c.replyMade(cl.id, &late))
	return nil, c.bindDone(late, ferr)
}

func (c *conn) resume(cl call, p params) (any, error) {
	sid, err := p.sessionID()
	if err != nil {
		return nil, err
	}
	if _, _, err := p.integer("cols"); err != nil {
		return nil, err
	}
	var late []session.Binding
	rerr := c.gw.table.Resume(c.gw.ctx, c, sid, c.replyBind(cl.id, &late))
	if held := c.heldBy(rerr); held != nil {
		return nil, c.relayBind(cl, held)
	}
	return nil, c.bindDone(late, rerr)
}

func (c *conn) activate(cl call, p params) (any, error) {
	sid, err := p.sessionID()
	if err != nil {
		return nil, err
	}
	var late []session.Binding
	aerr := c.gw.table.Activate(c.gw.ctx, c, sid, c.replyBind(cl.id, &late))
	return nil, c.bindDone(late, aerr)
}

func (c *conn) close(cl call, p params) (any, error) {
	sid, err := p.sessionID()
	if err != nil {
		return nil, err
	}
	closed, cerr := c.gw.table.CloseBy(c.gw.ctx, sid, c.who.Name)
	if cerr != nil {
		return nil, cerr
	}
	return map[string]bool{"closed": closed}, nil
}

func (c *conn) activeList(cl call, _ params) (any, error) {
	all := c.gw.table.Active()
	if c.gw.remote != nil {
		if cl.inline {
			return nil, errWait // asks the other hosts
		}
		ctx, cancel := context.WithTimeout(c.gw.ctx, dialTimeout)
		all = append(all, c.gw.remote.Active(ctx)...)
		cancel()
	}
	all = filterKeys(c, all, func(e session.ActiveEntry) string { return e.SessionKey })
	return map[string]any{"sessions": all}, nil
}

func (c *conn) list(cl call, p params) (any, error) {
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
	out := make([]wire.StoredSession, 0, len(rows))
	for _, s := range rows {
		e := wire.StoredSession{ID: s.Key, Title: s.Title, StartedAt: s.StartedAt.Unix(), EndReason: s.EndReason, MessageCount: s.MessageCount,
			LastActive: max(s.LastActive.Unix(), s.StartedAt.Unix()), LastRunBy: s.LastRunBy}
		if !s.EndedAt.IsZero() {
			at := s.EndedAt.Unix()
			e.EndedAt = &at
		}
		out = append(out, e)
	}
	out = filterKeys(c, out, func(e wire.StoredSession) string { return e.ID })
	return map[string]any{"sessions": out}, nil
}

func (c *conn) eventsSince(cl call, p params) (any, error) {
	sid, err := p.sessionID()
	if err != nil {
		return nil, err
	}
	if !p.has("last_seen") {
		return nil, errorf(wire.CodeInvalidParams, "last_seen must be a non-negative integer")
	}
	last, _, err := p.integer("last_seen")
	if err != nil {
		return nil, err
	}
	rec, lerr := c.gw.table.Lookup(sid)
	if lerr != nil {
		return nil, lerr
	}
	if r, ok := rec.EventsSinceLive(uint64(last)); ok {
		return r, nil
	}
	if cl.inline {
		return nil, errWait // the database has the older events
	}
	ctx, cancel := context.WithTimeout(c.gw.ctx, 10*time.Second)
	defer cancel()
	r, eerr := rec.EventsSince(ctx, uint64(last))
	if eerr != nil {
		return nil, fmt.Errorf("events since %d: %w", last, eerr)
	}
	return r, nil
}

func (c *conn) submit(cl call, p params) (any, error) {
	sid, err := p.sessionID()
	if err != nil {
		return nil, err
	}
	if !p.has("text") {
		return nil, errorf(wire.CodeInvalidParams, "text must be a string")
	}
	text, err := p.str("text")
	if err != nil {
		return nil, err
	}
	msg := agent.Message{Text: text}
	if p.has("content") {
		if msg, err = c.gw.promptContent(text, p["content"]); err != nil {
			return nil, err
		}
	}
	rec, lerr := c.gw.table.Lookup(sid)
	if lerr != nil {
		return nil, lerr
	}
	runID, serr := rec.SubmitPrompt(msg, c.who.Name)
	if serr != nil {
		return nil, serr
	}
	return map[string]string{"status": "streaming", "run_id": runID}, nil
}

// promptContent is prompt.submit's prompt with content blocks: text (when
// not empty) as a first text block, then the blocks, checked against what
// the agent takes (docs/PROTOCOL.md, "Prompts carry the whole content").
func (g *Gateway) promptContent(text string, raw json.RawMessage) (agent.Message, *rpcError) {
	var blocks []acp.ContentBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return agent.Message{}, errorf(wire.CodeInvalidParams, "content must be an array of ACP content blocks: %v", err)
	}
	if text != "" {
		blocks = append([]acp.ContentBlock{acp.TextBlock(text)}, blocks...)
	}
	t, content, err := prompt.Check(blocks, g.promptCaps.Get())
	if err != nil {
		return agent.Message{}, errorf(wire.CodeInvalidParams, "content: %v", err)
	}
	return agent.Message{Text: t, Content: content}, nil
}

func (c *conn) runs(cl call, p params) (any, error) {
	rec, err := c.live(p)
	if err != nil {
		return nil, err
	}
	return map[string]any{"runs": rec.Runs()}, nil
}

func (c *conn) interrupt(cl call, p params) (any, error) {
	rec, err := c.live(p)
	if err != nil {
		return nil, err
	}
	if rec.InterruptBy(c.who.Name) {
		return map[string]string{"status": "interrupted"}, nil
	}
	return map[string]string{"status": "idle"}, nil
}

func (c *conn) permissionRespond(cl call, p params) (any, error) {
	rec, err := c.live(p)
	if err != nil {
		return nil, err
	}
	if !p.has("request_id") {
		return nil, errorf(wire.CodeInvalidParams, "request_id must be a string")
	}
	reqID, perr := p.str("request_id")
	if perr != nil {
		return nil, perr
	}
	raw, given := p["option_id"]
	if !given {
		return nil, errorf(wire.CodeInvalidParams, "option_id must be a string, or null to cancel")
	}
	var option *string
	if !bytes.Equal(bytes.TrimSpace(raw), nullID) {
		o, perr := p.str("option_id")
		if perr != nil {
			return nil, perr
		}
		option = &o
	}
	if err := rec.RespondPermission(reqID, option, c.who.Name, c.transport); err != nil {
		return nil, err
	}
	return map[string]bool{"resolved": true}, nil
}

// clusterHosts lists the cluster's hosts; a single host lists itself.
func (c *conn) clusterHosts(call, params) (any, error) {
	if c.gw.remote == nil {
		return wire.ClusterHosts{Hosts: []wire.ClusterHost{{ID: "", Sessions: len(c.gw.table.Active()), Alive: true, Self: true}}}, nil
	}
	return wire.ClusterHosts{Cluster: true, Hosts: c.gw.remote.Hosts()}, nil
}
