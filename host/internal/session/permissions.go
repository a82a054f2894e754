package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/notify"
	"github.com/tether-agent/tether/wire"
)

// Permission errors.
var (
	// ErrAlreadyResolved: the permission request was answered already
	// (the first answer wins).
	ErrAlreadyResolved = errors.New("already resolved")
	// ErrUnknownPermission: no permission request of the session has that
	// id.
	ErrUnknownPermission = errors.New("unknown permission request")
	// ErrUnknownOption: the answer names an option the request did not
	// offer.
	ErrUnknownOption = errors.New("unknown permission option")
)

// keepResolved is how many answered request ids a session remembers, so
// that a late answer gets ErrAlreadyResolved rather than
// ErrUnknownPermission.
const keepResolved = 64

// permission is an open permission request of the run in flight.
type permission struct {
	id      string
	req     agent.PermissionRequest
	options []string // the option ids offered
	seq     uint64   // of its permission.request event: the order of the snapshot's list
	answer  chan permissionAnswer
}

type permissionAnswer struct {
	option string
	ok     bool // false: cancelled
}

// PermissionInfo is an open permission request, as snapshots list it.
type PermissionInfo struct {
	RequestID string          `json:"request_id"`
	ToolCall  json.RawMessage `json:"tool_call"`
	Options   json.RawMessage `json:"options"`
}

// pendingLocked lists the open requests in the order they were asked.
func (s *Session) pendingLocked() []PermissionInfo {
	if len(s.perms) == 0 {
		return nil
	}
	ps := make([]*permission, 0, len(s.perms))
	for _, p := range s.perms {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].seq < ps[j].seq })
	out := make([]PermissionInfo, len(ps))
	for i, p := range ps {
		out[i] = PermissionInfo{RequestID: p.id, ToolCall: p.req.ToolCall, Options: p.req.Options}
	}
	return out
}

// optionIDs are the ids of an ACP permission request's options.
func optionIDs(options json.RawMessage) []string {
	var opts []struct {
		OptionID string `json:"optionId"`
	}
	_ = json.Unmarshal(options, &opts)
	ids := make([]string, 0, len(opts))
	for _, o := range opts {
		ids = append(ids, o.OptionID)
	}
	return ids
}

// askPermission is Events.Permission: it opens the request (a
// permission.request event to every viewer, and an entry in snapshots),
// then waits for the first answer or ctx. With no viewer the request
// simply waits.
func (s *Session) askPermission(ctx context.Context, req agent.PermissionRequest) (string, bool, error) {
	p := &permission{id: contract.RandomHex(8), req: req, options: optionIDs(req.Options), answer: make(chan permissionAnswer, 1)}
	s.mu.Lock()
	s.emitLocked(wire.EventPermissionRequest, map[string]any{"request_id": p.id, "tool_call": req.ToolCall, "options": req.Options})
	p.seq = s.seq
	s.perms[p.id] = p
	var runID string
	if s.run != nil {
		runID = s.run.id
	}
	note := s.notifyLocked(notify.Event{Type: notify.TypePermissionRequested, RunID: runID, RequestID: p.id, Tool: toolTitle(req.ToolCall)})
	s.mu.Unlock()
	s.t.tell(note)
	select {
	case a := <-p.answer:
		return a.option, a.ok, nil
	case <-ctx.Done():
		// The turn ends first: the request is withdrawn.
		s.mu.Lock()
		if s.perms[p.id] == p {
			s.resolveLocked(p, "", false, "cancelled", "")
		}
		s.mu.Unlock()
		return "", false, ctx.Err()
	}
}

// RespondPermission answers the permission request requestID with
// optionID, or cancels it when optionID is nil; by names who answered
// (a credential's name) and transport the transport it came through.
// The first answer wins: a later one gets ErrAlreadyResolved. Every
// viewer is sent permission.resolved {request_id, option_id, by,
// transport}.
func (s *Session) RespondPermission(requestID string, optionID *string, by, transport string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.perms[requestID]
	if p == nil {
		if slices.Contains(s.resolved, requestID) {
			return fmt.Errorf("permission %s: %w", requestID, ErrAlreadyResolved)
		}
		return fmt.Errorf("permission %s of %s: %w", requestID, s.id, ErrUnknownPermission)
	}
	if optionID != nil && !slices.Contains(p.options, *optionID) {
		return fmt.Errorf("option %q of permission %s (offered %v): %w", *optionID, requestID, p.options, ErrUnknownOption)
	}
	option, ok := "", optionID != nil
	if ok {
		option = *optionID
	}
	s.resolveLocked(p, option, ok, by, transport)
	return nil
}

// resolveLocked closes p with its answer and tells every viewer.
func (s *Session) resolveLocked(p *permission, option string, ok bool, by, transport string) {
	delete(s.perms, p.id)
	s.resolved = append(s.resolved, p.id)
	if len(s.resolved) > keepResolved {
		s.resolved = s.resolved[len(s.resolved)-keepResolved:]
	}
	var opt any // null when cancelled
	if ok {
		opt = option
	}
	s.emitLocked(wire.EventPermissionResolved, map[string]any{"request_id": p.id, "option_id": opt, "by": by, "transport": transport})
	p.answer <- permissionAnswer{option: option, ok: ok}
}

// turnEvents is the agent.Events of one run.
type turnEvents struct {
	s  *Session
	ru *run
}

var _ agent.Events = turnEvents{}

func (e turnEvents) Delta(text string) { e.s.delta(e.ru, text) }

func (e turnEvents) Update(update json.RawMessage) {
	e.s.mu.Lock()
	e.ru.progress = e.s.t.now()
	e.s.lastActive = e.ru.progress
	e.s.emitLocked(wire.EventACPUpdate, update)
	e.s.mu.Unlock()
}

func (e turnEvents) Permission(ctx context.Context, req agent.PermissionRequest) (string, bool, error) {
	return e.s.askPermission(ctx, req)
}
