package acpgw

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/coder/acp-go-sdk"

	"github.com/tether-agent/tether/host/agent"
)

// blockTaker is a Turner that keeps the content blocks of each prompt it
// is given (one text block for a text prompt) and answers "ok".
type blockTaker struct {
	mu  sync.Mutex
	got []json.RawMessage
}

var _ agent.Turner = (*blockTaker)(nil)

func (b *blockTaker) factory() agent.Factory {
	return agent.FactoryFunc(func(context.Context, string, json.RawMessage) (agent.Agent, error) { return b, nil })
}

func (*blockTaker) Run(context.Context, []agent.Message, string, func(string)) error {
	return errors.New("a Turner's Run is never called")
}

func (*blockTaker) Close() error { return nil }

func (b *blockTaker) Turn(_ context.Context, _ []agent.Message, p agent.Message, ev agent.Events) (string, error) {
	got := p.Content
	if len(got) == 0 {
		got, _ = json.Marshal([]acp.ContentBlock{acp.TextBlock(p.Text)})
	}
	b.mu.Lock()
	b.got = append(b.got, got)
	b.mu.Unlock()
	u, _ := json.Marshal(acp.UpdateAgentMessageText("ok"))
	ev.Update(u)
	return "end_turn", nil
}

func (b *blockTaker) prompts() []json.RawMessage {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]json.RawMessage(nil), b.got...)
}

// sameJSON reports whether a and b encode the same value.
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	if err := json.Unmarshal(a, &va); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal(b, &vb); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	ja, _ := json.Marshal(va)
	jb, _ := json.Marshal(vb)
	return string(ja) == string(jb)
}

// TestWholePrompts: initialize passes on the agent's prompt capabilities;
// a prompt's blocks reach the agent as sent, are stored with the prompt
// and replayed by session/load one user_message_chunk per block; a block
// the agent does not take (audio here) is refused with -32602 and the
// agent never sees the prompt.
func TestWholePrompts(t *testing.T) {
	bt := &blockTaker{}
	e := newEnv(t, bt.factory())
	e.gw.cfg.PromptCaps = func() acp.PromptCapabilities { return acp.PromptCapabilities{Image: true, EmbeddedContext: true} }
	a := e.connect()
	init := a.initialize(t)
	if pc := init.AgentCapabilities.PromptCapabilities; !pc.Image || pc.Audio || !pc.EmbeddedContext {
		t.Errorf("promptCapabilities = %+v, want image and embeddedContext (the agent's)", pc)
	}
	sid := a.newSession(t, "/w")
	uri := "file:///shot.png"
	sent := []acp.ContentBlock{
		acp.TextBlock("what is in "),
		{Image: &acp.ContentBlockImage{Type: "image", Data: "iVBORw0KGgo=", MimeType: "image/png", Uri: &uri}},
		acp.ResourceBlock(acp.EmbeddedResourceResource{TextResourceContents: &acp.TextResourceContents{Uri: "file:///a.go", Text: "package a\n"}}),
		acp.ResourceLinkBlock("b.go", "file:///b.go"),
		acp.TextBlock("?"),
	}
	want, _ := json.Marshal(sent)
	if resp, err := a.cs.Prompt(ctx(t), acp.PromptRequest{SessionId: acp.SessionId(sid), Prompt: sent}); err != nil || resp.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("prompt with blocks: %+v, %v", resp, err)
	}
	if got := bt.prompts(); len(got) != 1 || !sameJSON(t, got[0], want) {
		t.Fatalf("the agent got %s, want %s", got, want)
	}
	msgs, err := e.st.Messages(context.Background(), sid)
	if err != nil || len(msgs) == 0 || msgs[0].Text != "what is in ?" || !sameJSON(t, msgs[0].Content, want) {
		t.Fatalf("stored prompt = %+v, %v; want text %q and the blocks", msgs, err, "what is in ?")
	}
	// A text prompt still reaches it as one text block.
	if _, err := a.prompt(t, sid, "plain"); err != nil {
		t.Fatal(err)
	}

	b := e.connect()
	b.initialize(t)
	if _, err := b.cs.LoadSession(ctx(t), acp.LoadSessionRequest{SessionId: acp.SessionId(sid), Cwd: "/", McpServers: []acp.McpServer{}}); err != nil {
		t.Fatalf("session/load: %v", err)
	}
	var replayed []acp.ContentBlock
	b.mu.Lock()
	for _, n := range b.updates {
		if u := n.Update.UserMessageChunk; u != nil {
			replayed = append(replayed, u.Content)
		}
	}
	b.mu.Unlock()
	wantReplay, _ := json.Marshal(append(sent, acp.TextBlock("plain")))
	gotReplay, _ := json.Marshal(replayed)
	if !sameJSON(t, gotReplay, wantReplay) {
		t.Errorf("session/load replayed the prompts as\n%s\nwant\n%s", gotReplay, wantReplay)
	}

	audio := acp.ContentBlock{Audio: &acp.ContentBlockAudio{Type: "audio", Data: "AAAA", MimeType: "audio/wav"}}
	if _, err := a.cs.Prompt(ctx(t), acp.PromptRequest{SessionId: acp.SessionId(sid), Prompt: []acp.ContentBlock{acp.TextBlock("hear"), audio}}); requestCode(err) != -32602 {
		t.Errorf("prompt with audio to an agent without it: %v, want -32602", err)
	}
	if _, err := a.cs.Prompt(ctx(t), acp.PromptRequest{SessionId: acp.SessionId(sid), Prompt: []acp.ContentBlock{}}); requestCode(err) != -32602 {
		t.Errorf("prompt of no block: %v, want -32602", err)
	}
	if n := len(bt.prompts()); n != 2 {
		t.Errorf("the agent got %d prompts, want 2 (the refused ones never reach it)", n)
	}
}

// TestEchoAnswersTheTextBlocks: echo (text and resource links only)
// answers with the text of the text blocks, and refuses an embedded
// resource with -32602.
func TestEchoAnswersTheTextBlocks(t *testing.T) {
	e := newEnv(t, agent.NewEchoFactory(0))
	a := e.connect()
	a.initialize(t)
	sid := a.newSession(t, "/w")
	blocks := []acp.ContentBlock{acp.TextBlock("read "), acp.ResourceLinkBlock("b.go", "file:///b.go"), acp.TextBlock("now")}
	if _, err := a.cs.Prompt(ctx(t), acp.PromptRequest{SessionId: acp.SessionId(sid), Prompt: blocks}); err != nil {
		t.Fatal(err)
	}
	a.waitUpdates(t, func(us []update) bool { return agentText(us) == "read now" })
	res := acp.ResourceBlock(acp.EmbeddedResourceResource{TextResourceContents: &acp.TextResourceContents{Uri: "file:///a.go", Text: "x"}})
	if _, err := a.cs.Prompt(ctx(t), acp.PromptRequest{SessionId: acp.SessionId(sid), Prompt: []acp.ContentBlock{acp.TextBlock("see"), res}}); requestCode(err) != -32602 {
		t.Errorf("embedded resource to echo: %v, want -32602", err)
	}
}

// TestMessageOverTheLibrarysLineRefused: a session/prompt too long for the
// ACP library's line reader is -32602, and the connection goes on (the
// reader would otherwise stop, ending it).
func TestMessageOverTheLibrarysLineRefused(t *testing.T) {
	e := newEnv(t, agent.NewEchoFactory(0))
	cl := e.connect()
	cl.initialize(t)
	sid := cl.newSession(t, "/w")
	big := acp.TextBlock(strings.Repeat("a", maxLine))
	if _, err := cl.cs.Prompt(ctx(t), acp.PromptRequest{SessionId: acp.SessionId(sid), Prompt: []acp.ContentBlock{big}}); requestCode(err) != -32602 {
		t.Fatalf("a prompt over the library's line: %v, want -32602", err)
	}
	if resp, err := cl.prompt(t, sid, "still here"); err != nil || resp.StopReason != acp.StopReasonEndTurn {
		t.Fatalf("the next prompt: %+v, %v; want end_turn", resp, err)
	}
}
