package agent

import "context"

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
type Factory interface {
	NewAgent(ctx context.Context, sessionKey string) (Agent, error)
}

// FactoryFunc adapts a function to Factory.
type FactoryFunc func(ctx context.Context, sessionKey string) (Agent, error)

// NewAgent calls f.
func (f FactoryFunc) NewAgent(ctx context.Context, sessionKey string) (Agent, error) {
	return f(ctx, sessionKey)
}
