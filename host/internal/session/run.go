package session

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/notify"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/wire"
)

// Submit starts a run answering text and returns its run id, or
// ErrSessionBusy while another run is in flight. The prompt and the run
// are stored before it answers (ErrStorageUnavailable when they cannot
// be). The run belongs to the session, not to a socket: only interrupt,
// close, reap and shutdown end it early.
func (s *Session) Submit(text string) (string, error) { return s.SubmitBy(text, "") }

// SubmitBy is Submit of a prompt by the credential named by: it is
// journaled with it (message.start's "by"; docs/PROTOCOL.md, "Who did
// what").
func (s *Session) SubmitBy(text, by string) (string, error) {
	return s.SubmitPrompt(agent.Message{Text: text}, by)
}

// SubmitPrompt is SubmitBy of a prompt with content blocks (prompt.Content,
// checked by the caller against what the agent takes; its Text is the text
// of its text blocks): the blocks are stored with the prompt, journaled in
// message.start's "content", and given to the agent as they are.
func (s *Session) SubmitPrompt(prompt agent.Message, by string) (string, error) {
	text := prompt.Text
	t := s.t
	if err := t.writable(); err != nil {
		return "", fmt.Errorf("submit to %s: %w", s.id, err)
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return "", fmt.Errorf("%s: %w", s.id, ErrUnknownSession)
	}
	if s.run != nil || s.submitting {
		s.mu.Unlock()
		return "", fmt.Errorf("%s: %w", s.id, ErrSessionBusy)
	}
	s.submitting = true
	// A session made with no title is named by its first prompt.
	title := ""
	if s.title == "" {
		title = TitleFrom(text)
	}
	s.mu.Unlock()

	now := t.now()
	runID := contract.RandomHex(8)
	prompt.Role = agent.RoleUser
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := t.store.StartTurn(ctx, s.key, prompt, store.Run{ID: runID, Status: statusRunning, StartedAt: now, By: by})
	if err == nil && title != "" {
		if terr := t.store.SetTitle(ctx, s.key, title); terr != nil {
			s.log.Warn().Err(terr).Msg("the title from the first prompt is not stored (the live session has it)")
		}
	}
	cancel()
	s.mu.Lock()
	s.submitting = false
	if err != nil {
		s.mu.Unlock()
		return "", storageErr("submit to "+s.id, err, ErrBuildFailed)
	}
	if s.closing {
		// Closed while the turn was stored: the stored run is finished
		// by the next host's (or rebuild's) recovery, as after a kill.
		s.mu.Unlock()
		return "", fmt.Errorf("%s: %w", s.id, ErrUnknownSession)
	}
	if s.title == "" {
		s.title = title
	}
	runCtx, cancelRun := context.WithCancel(context.Background())
	ru := &run{id: runID, started: now, cancel: cancelRun, done: make(chan struct{}), progress: now}
	history := make([]agent.Message, len(s.messages))
	copy(history, s.messages)
	s.messages = append(s.messages, prompt)
	s.run = ru
	s.runs = append(s.runs, RunInfo{RunID: ru.id, Status: statusRunning, StartedAt: now.Unix(), By: by})
	s.lastActive = now
	// The run's start seq is stored with its message.start.
	start := map[string]any{"run_id": ru.id, "prompt": text}
	if by != "" {
		start["by"] = by
	}
	if len(prompt.Content) > 0 {
		start["content"] = prompt.Content
	}
	s.emitOpsLocked(wire.EventMessageStart, start, ops{runSeqs: []store.RunSeq{{Key: s.key, RunID: ru.id, StartSeq: s.seq + 1}}})
	ru.startSeq = s.seq
	t.wg.Add(1)
	s.mu.Unlock()

	go s.runAgent(runCtx, ru, history, prompt)
	return ru.id, nil
}

// maxAutoTitle bounds a title made from a prompt, in characters.
const maxAutoTitle = 60

// TitleFrom is the title of a session named by its first prompt: the
// prompt's first line that is not blank, spaces folded, cut at a word
// to at most maxAutoTitle characters (with "…" when cut).
func TitleFrom(prompt string) string {
	line := ""
	for l := range strings.SplitSeq(prompt, "\n") {
		if l = strings.Join(strings.Fields(l), " "); l != "" {
			line = l
			break
		}
	}
	r := []rune(line)
	if len(r) <= maxAutoTitle {
		return line
	}
	cut := string(r[:maxAutoTitle-1])
	if i := strings.LastIndexByte(cut, ' '); i > maxAutoTitle/2 {
		cut = cut[:i]
	}
	return strings.TrimRight(cut, " ,.;:") + "…"
}

// runAgent runs the agent for one prompt and records its end: the answer,
// the run's status and the cursor are stored with its message.complete,
// so a client told the run ended finds the answer stored.
func (s *Session) runAgent(ctx context.Context, ru *run, history []agent.Message, prompt agent.Message) {
	t := s.t
	defer t.wg.Done()
	defer ru.cancel()
	var err error
	stopReason := ""
	if tu, ok := s.agent.(agent.Turner); ok {
		stopReason, err = tu.Turn(ctx, history, prompt, turnEvents{s: s, ru: ru})
	} else {
		err = s.agent.Run(ctx, history, prompt.Text, func(delta string) { s.delta(ru, delta) })
	}
	if st, ok := s.agent.(agent.Stateful); ok {
		s.keepAgentState(st)
	}

	s.mu.Lock()
	status := statusComplete
	switch {
	case ru.interrupted || errors.Is(err, context.Canceled) || err == nil && stopReason == "cancelled":
		status = statusInterrupted
	case err != nil:
		status = statusFailed
	}
	// Open permission requests end with the run.
	for _, p := range s.perms {
		s.resolveLocked(p, "", false, "cancelled", "")
	}
	if err != nil && status == statusFailed {
		s.log.Warn().Err(err).Str("run_id", ru.id).Msg("run failed")
	}
	answer := ru.text.String()
	now := t.now()
	ended := now.Unix()
	for i := range s.runs {
		if s.runs[i].RunID == ru.id {
			s.runs[i].Status = status
			s.runs[i].EndedAt = &ended
		}
	}
	s.messages = append(s.messages, agent.Message{Role: agent.RoleAssistant, Text: answer})
	s.run = nil
	s.lastActive = now
	complete := map[string]string{"text": answer, "status": status, "run_id": ru.id}
	if status == statusInterrupted && ru.stoppedBy != "" {
		complete["by"] = ru.stoppedBy // who cancelled it
	}
	if stopReason != "" {
		complete["stop_reason"] = stopReason
	}
	if err != nil && status == statusFailed {
		complete["reason"] = err.Error()
	}
	s.emitOpsLocked(wire.EventMessageComplete, complete, ops{
		messages: []store.Message{{Key: s.key, Message: agent.Message{Role: agent.RoleAssistant, Text: answer}}},
		runEnds:  []store.RunEnd{{Key: s.key, RunID: ru.id, Status: status, At: now}},
		cursor:   &store.Cursor{Key: s.key, Epoch: s.epoch, LastSeq: s.seq + 1},
	})
	var note *notify.Event
	switch status {
	case statusComplete:
		note = s.notifyLocked(notify.Event{Type: notify.TypeRunCompleted, RunID: ru.id})
	case statusFailed:
		note = s.notifyLocked(notify.Event{Type: notify.TypeRunFailed, RunID: ru.id, Reason: complete["reason"]})
	}
	gen := s.gen
	idle := len(s.viewers) == 0 && !s.closing
	s.mu.Unlock()
	close(ru.done)
	t.tell(note)

	if idle {
		t.release(releaseRef{s: s, gen: gen}, settled)
	}
}

// delta is one piece of the answer's text: message.delta.
func (s *Session) delta(ru *run, text string) {
	if text == "" {
		return
	}
	s.mu.Lock()
	ru.text.WriteString(text)
	ru.progress = s.t.now()
	s.lastActive = ru.progress
	s.emitLocked(wire.EventMessageDelta, map[string]string{"text": text})
	s.mu.Unlock()
}

// keepAgentState stores the agent's state when a turn changed it (an ACP
// agent that had to start a new agent session, say).
func (s *Session) keepAgentState(st agent.Stateful) {
	now := string(st.State())
	s.mu.Lock()
	changed := now != s.agentState
	s.agentState = now
	if st.ContextReset() {
		s.agentReset = true
	}
	s.mu.Unlock()
	if !changed {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.t.store.SetAgentState(ctx, s.key, now); err != nil {
		s.log.Error().Err(err).Msg("storing the agent's state")
	}
}

// Interrupt cancels the run in flight, reporting whether there was one.
func (s *Session) Interrupt() bool { return s.InterruptBy("") }

// InterruptBy is Interrupt by the credential named by: the run's
// message.complete says who cancelled it.
func (s *Session) InterruptBy(by string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.run == nil {
		return false
	}
	if !s.run.interrupted {
		s.run.interrupted = true
		s.run.stoppedBy = by
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
