package session

import (
	"context"
	"errors"
	"fmt"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/store"
)

// Submit starts a run answering text and returns its run id, or
// ErrSessionBusy while another run is in flight. The run belongs to the
// session, not to a socket: only interrupt, close, reap and shutdown end
// it early.
func (s *Session) Submit(text string) (string, error) {
	t := s.t
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return "", fmt.Errorf("%s: %w", s.id, ErrUnknownSession)
	}
	if s.run != nil {
		s.mu.Unlock()
		return "", fmt.Errorf("%s: %w", s.id, ErrSessionBusy)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	now := t.now()
	ru := &run{id: contract.RandomHex(8), started: now, cancel: cancel, done: make(chan struct{}), progress: now}
	history := make([]agent.Message, len(s.messages))
	copy(history, s.messages)
	s.messages = append(s.messages, agent.Message{Role: agent.RoleUser, Text: text})
	s.run = ru
	s.runs = append(s.runs, RunInfo{RunID: ru.id, Status: statusRunning, StartedAt: now.Unix()})
	s.lastActive = now
	s.emitLocked("message.start", map[string]string{"run_id": ru.id})
	ru.startSeq = s.seq
	t.wg.Add(1)
	s.mu.Unlock()

	go s.runAgent(runCtx, ru, history, text)
	return ru.id, nil
}

// runAgent runs the agent for one prompt and records its end.
func (s *Session) runAgent(ctx context.Context, ru *run, history []agent.Message, prompt string) {
	t := s.t
	defer t.wg.Done()
	defer ru.cancel()
	persistCtx := context.WithoutCancel(ctx)
	if err := t.store.AppendMessages(persistCtx, s.key, agent.Message{Role: agent.RoleUser, Text: prompt}); err != nil {
		s.log.Error().Err(err).Msg("persisting prompt")
	}
	if err := t.store.StartRun(persistCtx, s.key, store.Run{ID: ru.id, Status: statusRunning, StartedAt: ru.started, StartSeq: ru.startSeq}); err != nil {
		s.log.Error().Err(err).Msg("persisting run")
	}
	err := s.agent.Run(ctx, history, prompt, func(delta string) {
		if delta == "" {
			return
		}
		s.mu.Lock()
		ru.text.WriteString(delta)
		ru.progress = t.now()
		s.lastActive = ru.progress
		s.emitLocked("message.delta", map[string]string{"text": delta})
		s.mu.Unlock()
	})

	s.mu.Lock()
	status := statusComplete
	switch {
	case ru.interrupted || errors.Is(err, context.Canceled):
		status = statusInterrupted
	case err != nil:
		status = statusFailed
	}
	answer := ru.text.String()
	s.mu.Unlock()
	if err != nil && status == statusFailed {
		s.log.Warn().Err(err).Str("run_id", ru.id).Msg("run failed")
	}
	// The answer is stored before the client is told the run ended.
	if err := t.store.AppendMessages(persistCtx, s.key, agent.Message{Role: agent.RoleAssistant, Text: answer}); err != nil {
		s.log.Error().Err(err).Msg("persisting answer")
	}
	if err := t.store.EndRun(persistCtx, s.key, ru.id, status, t.now()); err != nil {
		s.log.Error().Err(err).Msg("persisting run end")
	}

	s.mu.Lock()
	ended := t.now().Unix()
	for i := range s.runs {
		if s.runs[i].RunID == ru.id {
			s.runs[i].Status = status
			s.runs[i].EndedAt = &ended
		}
	}
	s.messages = append(s.messages, agent.Message{Role: agent.RoleAssistant, Text: answer})
	s.run = nil
	s.lastActive = t.now()
	s.emitLocked("message.complete", map[string]string{"text": answer, "status": status})
	gen := s.gen
	idle := len(s.viewers) == 0 && !s.closing
	seq, epoch := s.seq, s.epoch
	s.mu.Unlock()
	close(ru.done)

	if err := t.store.SetCursor(persistCtx, s.key, epoch, seq); err != nil {
		s.log.Error().Err(err).Msg("persisting event cursor")
	}
	if idle {
		t.release(releaseRef{s: s, gen: gen}, settled)
	}
}

// Interrupt cancels the run in flight, reporting whether there was one.
func (s *Session) Interrupt() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.run == nil {
		return false
	}
	if !s.run.interrupted {
		s.run.interrupted = true
		s.run.cancel()
	}
	return true
}

// Runs copies session.runs, oldest first.
func (s *Session) Runs() []RunInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]RunInfo, len(s.runs))
	copy(out, s.runs)
	return out
}
