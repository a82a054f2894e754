package acpagent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"sync"

	"github.com/coder/acp-go-sdk"
	"github.com/tether-agent/tether/host/agent"
)

// state is what an ACP session keeps across lives.
type state struct {
	SessionID string `json:"session_id,omitempty"`
	Cwd       string `json:"cwd,omitempty"`
}

// NewAgent implements agent.Factory: it attaches the stored session's
// agent session (session/load when the agent can, else a new one: its
// context is reset), or makes a new one.
func (f *Factory) NewAgent(ctx context.Context, key string, raw json.RawMessage) (agent.Agent, error) {
	var st state
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &st); err != nil {
			return nil, fmt.Errorf("acp agent state of %s: %w", key, err)
		}
	}
	if st.Cwd == "" || !filepath.IsAbs(st.Cwd) {
		st.Cwd = f.cfg.Cwd
	}
	s := &session{f: f, key: key, id: acp.SessionId(st.SessionID), cwd: st.Cwd}
	p, err := f.current(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.attach(ctx, p); err != nil {
		return nil, err
	}
	return s, nil
}

// route returns the session an agent's message is about.
func (f *Factory) route(id acp.SessionId) *session {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sessions[id]
}

// session is one live session's ACP agent session.
type session struct {
	f   *Factory
	key string

	mu      sync.Mutex // guards the fields below
	id      acp.SessionId
	cwd     string
	gen     int          // the process generation id is attached in
	reset   bool         // the context could not be carried over
	ev      agent.Events // the turn in flight's, or nil
	loading bool         // session/load in flight: its replay is dropped
}

var (
	_ agent.Turner   = (*session)(nil)
	_ agent.Stateful = (*session)(nil)
)

func (s *session) events() agent.Events {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.loading {
		return nil
	}
	return s.ev
}

// attach makes the session's agent session live in process p: session/load
// of the stored one when the agent supports it, else (or when the load
// fails) a new one, with the context reset.
func (s *session) attach(ctx context.Context, p *process) error {
	s.mu.Lock()
	id, cwd := s.id, s.cwd
	s.mu.Unlock()
	if id != "" && p.caps.LoadSession {
		s.f.mu.Lock()
		s.f.sessions[id] = s
		s.f.mu.Unlock()
		s.mu.Lock()
		s.loading = true
		s.mu.Unlock()
		_, err := p.conn.LoadSession(ctx, acp.LoadSessionRequest{SessionId: id, Cwd: cwd, McpServers: []acp.McpServer{}})
		s.mu.Lock()
		s.loading = false
		if err == nil {
			s.gen = p.gen
		}
		s.mu.Unlock()
		if err == nil {
			return nil
		}
		s.f.log.Warn().Err(err).Str("session_key", s.key).Msg("session/load failed; starting a new agent session (context reset)")
	}
	resp, err := p.conn.NewSession(ctx, acp.NewSessionRequest{Cwd: cwd, McpServers: []acp.McpServer{}})
	if err != nil {
		return fmt.Errorf("acp session/new for %s: %w", s.key, err)
	}
	s.f.mu.Lock()
	if id != "" {
		delete(s.f.sessions, id)
	}
	s.f.sessions[resp.SessionId] = s
	s.f.mu.Unlock()
	s.mu.Lock()
	s.reset = s.reset || id != ""
	s.id, s.gen = resp.SessionId, p.gen
	s.mu.Unlock()
	return nil
}

// State implements agent.Stateful.
func (s *session) State() json.RawMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, _ := json.Marshal(state{SessionID: string(s.id), Cwd: s.cwd})
	return b
}

// ContextReset implements agent.Stateful.
func (s *session) ContextReset() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reset
}

// Run implements agent.Agent; the table takes Turns of a Turner.
func (s *session) Run(context.Context, []agent.Message, string, func(string)) error {
	return ErrNoTurn
}

// Turn implements agent.Turner: session/prompt with the prompt's content
// blocks as its client sent them (one text block for a text prompt). Its
// updates and permission requests come through ev; cancelling ctx sends
// session/cancel and waits (a bounded time) for the agent's stop reason.
func (s *session) Turn(ctx context.Context, _ []agent.Message, prompt agent.Message, ev agent.Events) (string, error) {
	blocks := []acp.ContentBlock{acp.TextBlock(prompt.Text)}
	if len(prompt.Content) > 0 {
		if err := json.Unmarshal(prompt.Content, &blocks); err != nil {
			return "", fmt.Errorf("the prompt's content blocks: %w", err)
		}
	}
	p, err := s.f.current(ctx)
	if err != nil {
		return "", err
	}
	if ctx.Err() != nil {
		return "cancelled", ctx.Err() // interrupted before it was sent
	}
	s.mu.Lock()
	stale := s.gen != p.gen
	s.mu.Unlock()
	if stale {
		// The agent was restarted since: reattach the session first.
		if err := s.attach(ctx, p); err != nil {
			return "", err
		}
	}
	s.mu.Lock()
	s.ev = ev
	id := s.id
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.ev = nil
		s.mu.Unlock()
	}()
	type result struct {
		resp acp.PromptResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := p.conn.Prompt(context.WithoutCancel(ctx), acp.PromptRequest{SessionId: id, Prompt: blocks})
		done <- result{resp, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		cctx, cancel := context.WithTimeout(context.Background(), cancelGrace)
		if err := p.conn.Cancel(cctx, acp.CancelNotification{SessionId: id}); err != nil {
			s.f.log.Debug().Err(err).Msg("session/cancel")
		}
		select {
		case r = <-done:
		case <-cctx.Done():
			cancel()
			return "cancelled", ctx.Err()
		case <-p.conn.Done():
			cancel()
			return "", fmt.Errorf("the agent exited during the turn: %w", ErrAgentDown)
		case <-p.done:
			cancel()
			return "", fmt.Errorf("the agent exited during the turn: %w", ErrAgentDown)
		}
		cancel()
	}
	if r.err != nil {
		select {
		case <-p.done:
			return "", fmt.Errorf("the agent exited during the turn: %w", ErrAgentDown)
		case <-p.conn.Done():
			return "", fmt.Errorf("the agent closed its stdio during the turn: %w", ErrAgentDown)
		default:
		}
		return "", fmt.Errorf("session/prompt: %w", r.err)
	}
	return string(r.resp.StopReason), nil
}

// Close implements agent.Agent: the session leaves the router.
func (s *session) Close() error {
	s.mu.Lock()
	id := s.id
	s.mu.Unlock()
	s.f.mu.Lock()
	if s.f.sessions[id] == s {
		delete(s.f.sessions, id)
	}
	s.f.mu.Unlock()
	return nil
}

var _ io.Closer = (*session)(nil)
