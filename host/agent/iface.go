package agent

import (
	"context"
	"encoding/json"
)

// Role is the author of a display message.
type Role string

// Message roles as they appear on the wire.
const (
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
)

// Message is one display row of a session's history.
type Message struct {
	Role Role   `json:"role"`
	Text string `json:"text"`
	// Content is a prompt's content blocks as its client sent them, a
	// JSON array of ACP content blocks (docs/PROTOCOL.md, "Prompts carry
	// the whole content"); empty when the prompt was text only. Text is
	// then the text of its text blocks.
	Content json.RawMessage `json:"content,omitempty"`
}

// Agent answers prompts for one live session. The host builds one per live
// session with a Factory and closes it when the session is released.
type Agent interface {
	// Run answers prompt, given the session's display history before it.
	// It calls emit once per streamed delta, in order, from the calling
	// goroutine or any single goroutine, and returns when the answer is
	// complete. Cancelling ctx interrupts the run: Run must stop promptly
	// and return an error that wraps ctx.Err(). Any other error means the
	// run failed.
	Run(ctx context.Context, history []Message, prompt string, emit func(delta string)) error
	// Close releases the agent. It is called exactly once, never while a
	// Run is in flight.
	Close() error
}

// Factory builds an Agent for the session with the given stored key.
// state is what the session's previous agent kept (Stateful.State; nil
// for a new session or an agent that keeps nothing).
type Factory interface {
	NewAgent(ctx context.Context, sessionKey string, state json.RawMessage) (Agent, error)
}

// FactoryFunc adapts a function to Factory.
type FactoryFunc func(ctx context.Context, sessionKey string, state json.RawMessage) (Agent, error)

// NewAgent calls f.
func (f FactoryFunc) NewAgent(ctx context.Context, sessionKey string, state json.RawMessage) (Agent, error) {
	return f(ctx, sessionKey, state)
}

// PermissionRequest is an agent asking the session's viewers to decide
// before it goes on (an ACP session/request_permission): the tool call it
// is about and the options to choose from, as the agent sent them.
type PermissionRequest struct {
	ToolCall json.RawMessage `json:"tool_call"`
	Options  json.RawMessage `json:"options"`
}

// Events is what a Turner's turn reports through. Its methods may be
// called from any one goroutine at a time.
type Events interface {
	// Delta reports a piece of the answer's text (message.delta).
	Delta(text string)
	// Update reports an update of the agent's protocol, journaled and
	// sent as it is (acp.update: an ACP session/update's update object).
	Update(update json.RawMessage)
	// Permission asks the session's viewers and waits for the first
	// answer: the chosen option id, or ok false when it was cancelled
	// (a viewer answered with no option, or ctx ended).
	Permission(ctx context.Context, req PermissionRequest) (optionID string, ok bool, err error)
}

// Turner is an Agent whose turns report protocol updates and permission
// requests and end with a stop reason (an ACP agent); the table runs
// Turn instead of Run for it.
type Turner interface {
	Agent
	// Turn answers prompt (its Content blocks when it has them, else its
	// Text), reporting through ev, and returns the agent's stop reason
	// ("end_turn", "cancelled", …). Cancelling ctx asks the agent to
	// stop; Turn then returns its stop reason or ctx's error.
	Turn(ctx context.Context, history []Message, prompt Message, ev Events) (stopReason string, err error)
}

// Stateful is an Agent that keeps something across the session's lives
// (an ACP agent's session id): the table stores State with the session
// and gives it back to the Factory when the session is rebuilt.
type Stateful interface {
	// State is what to keep, as JSON.
	State() json.RawMessage
	// ContextReset reports that the agent could not carry the session's
	// earlier context over (it started a new agent session).
	ContextReset() bool
}
