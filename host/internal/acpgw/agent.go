package acpgw

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/coder/acp-go-sdk"

	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/prompt"
	"github.com/tether-agent/tether/host/internal/rpc"
	"github.com/tether-agent/tether/host/internal/session"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/wire"
)

// acpAgent is what the client's requests reach: tether playing the ACP
// agent for one connection.
type acpAgent struct{ c *conn }

var (
	_ acp.Agent                  = (*acpAgent)(nil)
	_ acp.AgentLoader            = (*acpAgent)(nil)
	_ acp.ExtensionMethodHandler = (*acpAgent)(nil)
)

// tableError is a table error as a JSON-RPC error, with tether's code.
func tableError(err error) error {
	code, msg := rpc.ErrorOf(err)
	return &acp.RequestError{Code: code, Message: msg}
}

// agentState is what tether stores of an /acp session for its agent: the
// working directory it was made with.
type agentState struct {
	Cwd string `json:"cwd,omitempty"`
}

// Initialize implements acp.Agent: protocol version 1, sessions that can
// be loaded, resumed and listed, and the configured agent's prompt
// capabilities.
func (a *acpAgent) Initialize(context.Context, acp.InitializeRequest) (acp.InitializeResponse, error) {
	a.c.enter()()
	// A prompt's blocks reach the agent as they are: what it takes is
	// what tether takes (text and resource links for echo and exec).
	pc := a.c.g.cfg.PromptCaps.Get()
	caps := acp.AgentCapabilities{PromptCapabilities: acp.PromptCapabilities{Image: pc.Image, Audio: pc.Audio, EmbeddedContext: pc.EmbeddedContext}}
	caps.LoadSession = true
	caps.SessionCapabilities = acp.SessionCapabilities{
		Resume: &acp.SessionResumeCapabilities{},
		List:   &acp.SessionListCapabilities{},
	}
	return acp.InitializeResponse{
		ProtocolVersion:   acp.ProtocolVersionNumber,
		AgentCapabilities: caps,
		AgentInfo:         &acp.Implementation{Name: "tether", Version: a.c.g.cfg.Version},
		AuthMethods:       []acp.AuthMethod{},
	}, nil
}

// Authenticate implements acp.Agent: access was decided when the socket
// opened (the token), so there is nothing to authenticate.
func (a *acpAgent) Authenticate(context.Context, acp.AuthenticateRequest) (acp.AuthenticateResponse, error) {
	a.c.enter()()
	return acp.AuthenticateResponse{}, nil
}

// NewSession implements acp.Agent: a new tether session with the
// configured agent, bound to this connection; its sessionId is the stored
// key.
func (a *acpAgent) NewSession(ctx context.Context, p acp.NewSessionRequest) (acp.NewSessionResponse, error) {
	leave := a.c.enter()
	defer leave()
	if !a.c.canCreate() {
		return acp.NewSessionResponse{}, a.c.forbid("session/new")
	}
	cwd := p.Cwd
	if !filepath.IsAbs(cwd) {
		return acp.NewSessionResponse{}, acp.NewInvalidParams(map[string]any{"cwd": "must be an absolute path"})
	}
	state, _ := json.Marshal(agentState{Cwd: filepath.Clean(cwd)})
	snap, _, err := a.c.bind(ctx, "", nil, &session.CreateOptions{ForkCount: -1, AgentState: state}, leave)
	if err != nil {
		return acp.NewSessionResponse{}, tableError(err)
	}
	a.c.madeSession(snap.SessionKey)
	return acp.NewSessionResponse{SessionId: acp.SessionId(snap.SessionKey)}, nil
}

// LoadSession implements acp.AgentLoader: bind, replay the whole history,
// then answer.
func (a *acpAgent) LoadSession(ctx context.Context, p acp.LoadSessionRequest) (acp.LoadSessionResponse, error) {
	leave := a.c.enter()
	defer leave()
	if err := checkKey(p.SessionId); err != nil {
		return acp.LoadSessionResponse{}, err
	}
	if !a.c.can(string(p.SessionId), false) {
		return acp.LoadSessionResponse{}, a.c.forbid("session/load")
	}
	var from uint64
	_, truncated, err := a.c.bind(ctx, string(p.SessionId), &from, nil, leave)
	if held := a.c.heldBy(err); held != nil {
		return acp.LoadSessionResponse{}, a.c.relayBind(string(p.SessionId), held)
	}
	if err != nil {
		return acp.LoadSessionResponse{}, tableError(err)
	}
	return acp.LoadSessionResponse{Meta: truncatedMeta(truncated)}, nil
}

// ResumeSession implements acp.Agent: bind, send exactly the updates after
// _meta["tether/after"] (none without it), then answer.
func (a *acpAgent) ResumeSession(ctx context.Context, p acp.ResumeSessionRequest) (acp.ResumeSessionResponse, error) {
	leave := a.c.enter()
	defer leave()
	if err := checkKey(p.SessionId); err != nil {
		return acp.ResumeSessionResponse{}, err
	}
	if !a.c.can(string(p.SessionId), false) {
		return acp.ResumeSessionResponse{}, a.c.forbid("session/resume")
	}
	var after *uint64
	if v, ok := p.Meta[MetaAfter]; ok {
		n, ok := seqOf(v)
		if !ok {
			return acp.ResumeSessionResponse{}, acp.NewInvalidParams(map[string]any{MetaAfter: "must be a non-negative integer"})
		}
		after = &n
	}
	_, truncated, err := a.c.bind(ctx, string(p.SessionId), after, nil, leave)
	if held := a.c.heldBy(err); held != nil {
		return acp.ResumeSessionResponse{}, a.c.relayBind(string(p.SessionId), held)
	}
	if err != nil {
		return acp.ResumeSessionResponse{}, tableError(err)
	}
	return acp.ResumeSessionResponse{Meta: truncatedMeta(truncated)}, nil
}

// checkKey refuses a sessionId that is not a stored key (a title, say:
// the native gateway resumes by title, but an ACP sessionId is the key
// every later message names).
func checkKey(id acp.SessionId) error {
	if !store.ValidKey(string(id)) {
		return &acp.RequestError{Code: wire.CodeStoredNotFound, Message: "stored session not found: a sessionId is a stored key"}
	}
	return nil
}

// truncatedMeta is the _meta of a load or resume response.
func truncatedMeta(truncated bool) map[string]any {
	if !truncated {
		return nil
	}
	return map[string]any{MetaTruncated: true}
}

// seqOf reads a seq from a decoded JSON number.
func seqOf(v any) (uint64, bool) {
	switch n := v.(type) {
	case float64:
		if n < 0 || n != float64(uint64(n)) {
			return 0, false
		}
		return uint64(n), true
	case json.Number:
		u, err := n.Int64()
		return uint64(u), err == nil && u >= 0
	}
	return 0, false
}

// ListSessions implements acp.Agent: the stored sessions, newest first,
// with the cwd each was made with (only those under p.Cwd when given).
func (a *acpAgent) ListSessions(ctx context.Context, p acp.ListSessionsRequest) (acp.ListSessionsResponse, error) {
	a.c.enter()()
	stored, err := a.c.g.cfg.Store.List(ctx, 0)
	if err != nil {
		return acp.ListSessionsResponse{}, tableError(fmt.Errorf("list: %v: %w", err, session.ErrStorageUnavailable))
	}
	out := acp.ListSessionsResponse{Sessions: []acp.SessionInfo{}}
	for _, s := range stored {
		cwd := a.c.g.cfg.Cwd
		var st agentState
		if json.Unmarshal([]byte(s.AgentState), &st) == nil && st.Cwd != "" {
			cwd = st.Cwd
		}
		if p.Cwd != nil && *p.Cwd != "" && filepath.Clean(*p.Cwd) != cwd {
			continue
		}
		if !a.c.can(s.Key, false) {
			continue
		}
		info := acp.SessionInfo{SessionId: acp.SessionId(s.Key), Cwd: cwd}
		if s.Title != "" {
			t := s.Title
			info.Title = &t
		}
		updated := s.StartedAt.UTC().Format(time.RFC3339)
		info.UpdatedAt = &updated
		out.Sessions = append(out.Sessions, info)
	}
	return out, nil
}

// Prompt implements acp.Agent: submit the prompt's content blocks to the
// bound session (refused with -32602 when the agent does not take one of
// them, or they are over 16 MiB) and answer when its run ends: its stop
// reason, "cancelled" when interrupted, error 5001 when it failed.
func (a *acpAgent) Prompt(ctx context.Context, p acp.PromptRequest) (acp.PromptResponse, error) {
	c := a.c
	leave := c.enter()
	defer leave()
	key := string(p.SessionId)
	if !c.can(key, true) {
		return acp.PromptResponse{}, c.forbid("session/prompt")
	}
	s := c.session(key)
	if s == nil {
		return acp.PromptResponse{}, &acp.RequestError{Code: wire.CodeUnknownSession, Message: "session not loaded on this connection: session/load or session/resume it first"}
	}
	text, content, err := prompt.Check(p.Prompt, c.g.cfg.PromptCaps.Get())
	if err != nil {
		return acp.PromptResponse{}, acp.NewInvalidParams(map[string]any{"prompt": err.Error()})
	}
	sid := s.ID()
	c.mu.Lock()
	c.submitting++
	c.prompts[sid]++
	c.promptText[sid] = text
	c.mu.Unlock()
	runID, err := s.SubmitPrompt(agent.Message{Text: text, Content: content}, c.who.Name)
	ch := make(chan runEnd, 1)
	c.mu.Lock()
	if err == nil {
		if end, ok := c.ended[runID]; ok {
			ch <- end
			delete(c.ended, runID)
		} else {
			c.runs[runID] = ch
		}
	}
	c.submitting--
	if c.submitting == 0 {
		clear(c.ended)
	}
	if c.prompts[sid]--; c.prompts[sid] == 0 {
		delete(c.prompts, sid)
		delete(c.promptText, sid)
	}
	c.mu.Unlock()
	leave()
	if err != nil {
		return acp.PromptResponse{}, tableError(err)
	}
	var end runEnd
	select {
	case end = <-ch:
	case <-c.stop:
		return acp.PromptResponse{}, errors.New("connection closed")
	case <-c.g.ctx.Done():
		return acp.PromptResponse{}, errors.New("shutting down")
	}
	switch end.Status {
	case "interrupted":
		return acp.PromptResponse{StopReason: acp.StopReasonCancelled}, nil
	case "failed":
		return acp.PromptResponse{}, &acp.RequestError{Code: CodeTurnFailed, Message: "turn failed", Data: map[string]any{"reason": end.Reason}}
	}
	reason := acp.StopReason(end.StopReason)
	if reason == "" {
		reason = acp.StopReasonEndTurn
	}
	return acp.PromptResponse{StopReason: reason}, nil
}

// Cancel implements acp.Agent: interrupt the bound session's run.
func (a *acpAgent) Cancel(_ context.Context, p acp.CancelNotification) error {
	if !a.c.can(string(p.SessionId), true) {
		return a.c.forbid("session/cancel")
	}
	if s := a.c.session(string(p.SessionId)); s != nil {
		s.InterruptBy(a.c.who.Name)
	}
	return nil
}

// CloseSession implements acp.Agent; tether does not advertise it.
func (a *acpAgent) CloseSession(context.Context, acp.CloseSessionRequest) (acp.CloseSessionResponse, error) {
	a.c.enter()()
	return acp.CloseSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionClose)
}

// SetSessionMode implements acp.Agent; tether's sessions have no modes.
func (a *acpAgent) SetSessionMode(context.Context, acp.SetSessionModeRequest) (acp.SetSessionModeResponse, error) {
	a.c.enter()()
	return acp.SetSessionModeResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionSetMode)
}

// SetSessionConfigOption implements acp.Agent; tether's sessions have no
// config options.
func (a *acpAgent) SetSessionConfigOption(context.Context, acp.SetSessionConfigOptionRequest) (acp.SetSessionConfigOptionResponse, error) {
	a.c.enter()()
	return acp.SetSessionConfigOptionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionSetConfigOption)
}

// HandleExtensionMethod implements acp.ExtensionMethodHandler: the
// connection's own closedMethod says every message before it was
// handled; every other extension method is unknown.
func (a *acpAgent) HandleExtensionMethod(_ context.Context, method string, _ json.RawMessage) (any, error) {
	if method == closedMethod {
		a.c.drainOnce.Do(func() { close(a.c.drained) })
		return nil, nil
	}
	return nil, acp.NewMethodNotFound(method)
}
