package rpc

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/coder/acp-go-sdk"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/internal/session"
)

// TestSubmitContent: gateway.ready carries the agent's prompt
// capabilities; prompt.submit's content blocks follow its text as
// the prompt: stored with it and journaled in message.start's content;
// echo answers the text blocks' text; a block the agent does not take,
// or content that is not blocks, is -32602.
func TestSubmitContent(t *testing.T) {
	tbl, st, m := newTestTable(t)
	gw := New(tbl, st, "test", zerolog.Nop(), m)
	gw.SetPromptCaps(func() acp.PromptCapabilities { return acp.PromptCapabilities{Image: true} })
	t.Cleanup(gw.Close)
	out := &notifyingSender{sent: make(chan struct{}, 1)}
	c := gw.newConn(contract.TransportID{Instance: "t", Conn: 1}, "ws", out).as(adminWho)
	defer c.OnClosed()
	// gateway.ready says what a prompt's content may hold.
	c.ready()
	out.waitFrame(t, `"prompt_capabilities":{"image":true,"audio":false,"embeddedContext":false}`)
	c.OnFrame([]byte(`{"jsonrpc":"2.0","id":1,"method":"session.create"}`), false)
	var created struct {
		Result session.Snapshot `json:"result"`
	}
	if err := json.Unmarshal(out.waitFrame(t, `"id":1`), &created); err != nil {
		t.Fatalf("session.create answer: %v", err)
	}
	sid := created.Result.SessionID
	content := `[{"type":"image","mimeType":"image/png","data":"AA=="},{"type":"text","text":" too"}]`
	c.OnFrame([]byte(`{"jsonrpc":"2.0","id":2,"method":"prompt.submit","params":{"session_id":"`+sid+`","text":"look","content":`+content+`}}`), false)
	start := out.waitFrame(t, `"message.start"`)
	complete := out.waitFrame(t, `"message.complete"`)
	var ev struct {
		Params struct {
			Payload struct {
				Prompt  string          `json:"prompt"`
				Content json.RawMessage `json:"content"`
				Text    string          `json:"text"`
			} `json:"payload"`
		} `json:"params"`
	}
	_ = json.Unmarshal(complete, &ev)
	if ev.Params.Payload.Text != "look too" {
		t.Errorf("echo answered %q, want the text blocks' %q", ev.Params.Payload.Text, "look too")
	}
	_ = json.Unmarshal(start, &ev)
	want := `[{"text":"look","type":"text"},{"data":"AA==","mimeType":"image/png","type":"image"},{"text":" too","type":"text"}]`
	if ev.Params.Payload.Prompt != "look too" || string(ev.Params.Payload.Content) != want {
		t.Errorf("message.start = %s, want prompt %q and content %s", start, "look too", want)
	}
	gw.wg.Wait()
	msgs, err := st.Messages(context.Background(), created.Result.SessionKey)
	if err != nil || len(msgs) == 0 || string(msgs[0].Content) != want {
		t.Errorf("stored prompt = %+v, %v; want content %s", msgs, err, want)
	}
	for i, tc := range []struct{ name, content string }{
		{"audio", `[{"type":"audio","mimeType":"audio/wav","data":"AA=="}]`},
		{"resource", `[{"type":"resource","resource":{"uri":"file:///a","text":"x"}}]`},
		{"not blocks", `"an image"`},
		{"unknown type", `[{"type":"video"}]`},
	} {
		id := `"bad-` + tc.name + `"`
		c.OnFrame([]byte(`{"jsonrpc":"2.0","id":`+id+`,"method":"prompt.submit","params":{"session_id":"`+sid+`","text":"x","content":`+tc.content+`}}`), false)
		if f := out.waitFrame(t, `"id":`+id); !strings.Contains(string(f), `"code":-32602`) {
			t.Errorf("%d %s: %s, want -32602", i, tc.name, f)
		}
	}
}
