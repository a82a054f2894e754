package acpgw

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/coder/acp-go-sdk"

	"github.com/tether-agent/tether/host/agent"
)

// closeRounds is how many times each close race is run.
const closeRounds = 200

// reporter is an agent that tells the test how each turn went: a prompt
// "wait" runs until interrupted, "ask" asks for permission; each turn
// reports its start, then its outcome, on the channels.
type reporter struct {
	started chan string // the prompt of each turn, when it starts
	ended   chan string // "interrupted", or the option chosen ("none" when cancelled)
}

func newReporter() *reporter {
	return &reporter{started: make(chan string, closeRounds), ended: make(chan string, closeRounds)}
}

func (r *reporter) factory() agent.Factory {
	return agent.FactoryFunc(func(context.Context, string, json.RawMessage) (agent.Agent, error) { return r, nil })
}

func (*reporter) Run(context.Context, []agent.Message, string, func(string)) error {
	return errors.New("a Turner's Run is never called")
}

func (*reporter) Close() error { return nil }

func (r *reporter) Turn(ctx context.Context, _ []agent.Message, p agent.Message, ev agent.Events) (string, error) {
	prompt := p.Text
	r.started <- prompt
	switch prompt {
	case "ask":
		opt, ok, err := ev.Permission(ctx, agent.PermissionRequest{
			ToolCall: json.RawMessage(`{"toolCallId":"t1","title":"write file"}`),
			Options:  json.RawMessage(`[{"optionId":"allow","name":"Allow","kind":"allow_once"}]`),
		})
		if err != nil {
			return "", err
		}
		if !ok {
			opt = "none"
		}
		r.ended <- opt
		return "end_turn", nil
	default:
		<-ctx.Done()
		r.ended <- "interrupted"
		return "cancelled", nil
	}
}

// wait receives from ch, failing after 10 s.
func wait(t *testing.T, ch <-chan string, what string) string {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: nothing in 10s", what)
		return ""
	}
}

// closeAfter makes cl's socket close right after it sends a message
// that contains marker, as a client that sends it and closes at once.
func (cl *client) closeAfter(marker string) {
	w := cl.lw
	w.mu.Lock()
	w.after = func(line []byte) {
		if bytes.Contains(line, []byte(marker)) {
			cl.conn.OnClosed()
		}
	}
	w.mu.Unlock()
}

// TestCancelThenCloseInterrupts: a client that sends session/cancel and
// closes its socket at once has its cancel handled: the turn ends
// interrupted, every time.
func TestCancelThenCloseInterrupts(t *testing.T) {
	r := newReporter()
	e := newEnv(t, r.factory())
	for i := range closeRounds {
		cl := e.connect()
		cl.initialize(t)
		sid := cl.newSession(t, "/w")
		go func() {
			_, _ = cl.cs.Prompt(context.Background(), acp.PromptRequest{SessionId: acp.SessionId(sid), Prompt: []acp.ContentBlock{acp.TextBlock("wait")}})
		}()
		wait(t, r.started, fmt.Sprintf("round %d: turn start", i))
		if err := cl.cs.Cancel(ctx(t), acp.CancelNotification{SessionId: acp.SessionId(sid)}); err != nil {
			t.Fatal(err)
		}
		cl.conn.OnClosed() // the cancel frame was delivered: close at once
		if got := wait(t, r.ended, fmt.Sprintf("round %d: turn end", i)); got != "interrupted" {
			t.Fatalf("round %d: turn ended %q, want interrupted", i, got)
		}
		cl.close()
	}
}

// TestPermissionAnswerThenCloseReachesAgent: a client that answers a
// permission request and closes its socket at once has its answer
// reach the agent, every time.
func TestPermissionAnswerThenCloseReachesAgent(t *testing.T) {
	r := newReporter()
	e := newEnv(t, r.factory())
	for i := range closeRounds {
		cl := e.connect()
		cl.answer = func(_ context.Context, req acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
			if id, _ := req.Meta[MetaRequestID].(string); id == "" {
				t.Errorf("round %d: request _meta = %v, want %s", i, req.Meta, MetaRequestID)
			}
			return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeSelected("allow")}, nil
		}
		cl.closeAfter(`"outcome"`)
		cl.initialize(t)
		sid := cl.newSession(t, "/w")
		go func() {
			_, _ = cl.cs.Prompt(context.Background(), acp.PromptRequest{SessionId: acp.SessionId(sid), Prompt: []acp.ContentBlock{acp.TextBlock("ask")}})
		}()
		wait(t, r.started, fmt.Sprintf("round %d: turn start", i))
		if got := wait(t, r.ended, fmt.Sprintf("round %d: permission answer", i)); got != "allow" {
			t.Fatalf("round %d: the agent got %q, want allow", i, got)
		}
		cl.close()
	}
}

// TestPromptThenCloseStartsTurn: a client that sends session/prompt and
// closes its socket at once has its prompt submitted.
func TestPromptThenCloseStartsTurn(t *testing.T) {
	r := newReporter()
	e := newEnv(t, r.factory())
	for i := range closeRounds / 4 {
		cl := e.connect()
		cl.initialize(t)
		sid := cl.newSession(t, "/w")
		cl.closeAfter(`"session/prompt"`)
		go func() {
			_, _ = cl.cs.Prompt(context.Background(), acp.PromptRequest{SessionId: acp.SessionId(sid), Prompt: []acp.ContentBlock{acp.TextBlock("wait")}})
		}()
		if got := wait(t, r.started, fmt.Sprintf("round %d: turn start", i)); got != "wait" {
			t.Fatalf("round %d: turn of %q, want the prompt", i, got)
		}
		// Nobody is left to cancel it: interrupt it as a native client
		// would, through a new binding.
		other := e.connect()
		other.initialize(t)
		if _, err := other.cs.ResumeSession(ctx(t), acp.ResumeSessionRequest{SessionId: acp.SessionId(sid), Cwd: "/w"}); err != nil {
			t.Fatal(err)
		}
		if err := other.cs.Cancel(ctx(t), acp.CancelNotification{SessionId: acp.SessionId(sid)}); err != nil {
			t.Fatal(err)
		}
		wait(t, r.ended, fmt.Sprintf("round %d: turn end", i))
		other.close()
		cl.close()
	}
}
