package e2e_test

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// wholePrompt is a prompt an editor sends after a pasted screenshot and an
// @-mentioned file: text, an image, an embedded resource, a link.
const wholePrompt = `[{"type":"text","text":"what is wrong here"},` +
	`{"type":"image","mimeType":"image/png","data":"iVBORw0KGgoAAAANSUhEUg==","uri":"file:///tmp/shot.png"},` +
	`{"type":"resource","resource":{"uri":"file:///src/a.go","mimeType":"text/x-go","text":"package a\n\nfunc A() {}\n"}},` +
	`{"type":"resource_link","uri":"file:///src/b.go","name":"b.go","mimeType":"text/x-go"}]`

// TestACPWholePrompts (docs/PROTOCOL.md, "Prompts carry the whole
// content"): behind a test agent that advertises image and embedded
// context, tether's initialize passes them on; a prompt of text + image +
// resource + resource link from the official SDK client reaches the agent
// as it was sent (the agent's log has its blocks); session/load on a
// second connection replays it one user_message_chunk per block; a block
// the agent does not advertise (audio) is refused with -32602 and never
// reaches it.
func TestACPWholePrompts(t *testing.T) {
	h := startACPHost(t, acpHostConfig{AgentArgs: []string{"--prompt-caps", "image,embeddedContext"}})
	r := h.run(t, "prompt", "--blocks", wholePrompt)
	var init struct {
		AgentCapabilities struct {
			PromptCapabilities map[string]bool `json:"promptCapabilities"`
		} `json:"agentCapabilities"`
	}
	_ = json.Unmarshal(r.Initialize.Result, &init)
	if pc := init.AgentCapabilities.PromptCapabilities; !pc["image"] || pc["audio"] || !pc["embeddedContext"] {
		t.Errorf("initialize promptCapabilities = %v, want the agent's: image and embeddedContext", pc)
	}
	if r.Prompt == nil || r.Prompt.StopReason != "end_turn" {
		t.Fatalf("session/prompt = %+v (errors %v), want end_turn", r.Prompt, r.Errors)
	}
	prompts := received(h.log(t), "session/prompt")
	if len(prompts) != 1 {
		t.Fatalf("the agent got %d session/prompt, want 1", len(prompts))
	}
	var got struct {
		Prompt json.RawMessage `json:"prompt"`
	}
	_ = json.Unmarshal(prompts[0].Params, &got)
	if !jsonEqual(got.Prompt, wholePrompt) {
		t.Errorf("the agent got the prompt\n%s\nwant it as sent\n%s", got.Prompt, wholePrompt)
	}
	if texts := chunkTexts(r.Updates); len(texts) != 1 || texts[0] != "what is wrong here" {
		t.Errorf("the agent answered %q, want the text of the text blocks", texts)
	}

	l := h.run(t, "load", "--session", r.SessionID)
	var blocks []json.RawMessage
	for _, u := range l.Updates {
		if u.Phase == "replay" && u.Update.SessionUpdate == "user_message_chunk" {
			blocks = append(blocks, u.Update.Content)
		}
	}
	replayed, _ := json.Marshal(blocks)
	if !jsonEqual(replayed, wholePrompt) {
		t.Errorf("session/load replayed the prompt as\n%s\nwant one user_message_chunk per block, as sent\n%s", replayed, wholePrompt)
	}

	a := h.run(t, "prompt", "--session", r.SessionID, "--text", "listen", "--blocks", `[{"type":"audio","mimeType":"audio/wav","data":"UklGRg=="}]`)
	if a.Prompt == nil || !a.Prompt.Error.codeIs(-32602) {
		t.Errorf("a prompt with audio, which the agent does not take: %+v, want -32602", a.Prompt)
	}
	if n := len(received(h.log(t), "session/prompt")); n != 1 {
		t.Errorf("the agent got %d session/prompt, want 1: the refused one never reaches it", n)
	}
}

// TestACPImageRefusedWhenNotAdvertised: behind an agent that advertises
// no prompt capability, initialize offers none and a prompt with an image
// is -32602, never passed on without it.
func TestACPImageRefusedWhenNotAdvertised(t *testing.T) {
	h := startACPHost(t, acpHostConfig{})
	r := h.run(t, "prompt", "--text", "see", "--blocks", `[{"type":"image","mimeType":"image/png","data":"iVBORw0KGgo="}]`)
	var init struct {
		AgentCapabilities struct {
			PromptCapabilities map[string]bool `json:"promptCapabilities"`
		} `json:"agentCapabilities"`
	}
	_ = json.Unmarshal(r.Initialize.Result, &init)
	if pc := init.AgentCapabilities.PromptCapabilities; pc["image"] || pc["audio"] || pc["embeddedContext"] {
		t.Errorf("initialize promptCapabilities = %v, want none", pc)
	}
	if r.Prompt == nil || !r.Prompt.Error.codeIs(-32602) {
		t.Errorf("a prompt with an image: %+v, want -32602", r.Prompt)
	}
	if n := len(received(h.log(t), "session/prompt")); n != 0 {
		t.Errorf("the agent got %d session/prompt, want none", n)
	}
}

// TestNativeSubmitContent: a native client (the Go client package) reads
// the agent's prompt capabilities from gateway.ready and submits a prompt
// with content blocks (prompt.submit's content): the ACP agent gets the
// text as a first block, then the blocks as sent; the snapshot's display
// row keeps them; a resource to an agent without embeddedContext is
// -32602.
func TestNativeSubmitContent(t *testing.T) {
	h := startACPHost(t, acpHostConfig{AgentArgs: []string{"--prompt-caps", "image"}})
	c, err := client.Dial(ctxT(t, 10*time.Second), "ws://"+h.Addr, client.Options{Token: h.Token})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var ready wire.Ready
	if err := json.Unmarshal(c.Ready().Payload, &ready); err != nil {
		t.Fatalf("gateway.ready %s: %v", c.Ready().Raw, err)
	}
	if pc := ready.PromptCapabilities; !pc.Image || pc.Audio || pc.EmbeddedContext {
		t.Errorf("gateway.ready prompt_capabilities = %+v, want image only (the agent's)", pc)
	}
	snap, err := c.Create(ctxT(t, 10*time.Second), wire.CreateParams{})
	if err != nil {
		t.Fatal(err)
	}
	image := `[{"type":"image","mimeType":"image/png","data":"iVBORw0KGgo="}]`
	if _, err := c.SubmitContent(ctxT(t, 10*time.Second), snap.SessionID, "see", json.RawMessage(image)); err != nil {
		t.Fatalf("prompt.submit with content: %v", err)
	}
	for e := range c.Events() {
		if e.Type == wire.EventMessageComplete {
			break
		}
	}
	prompts := received(h.log(t), "session/prompt")
	var got struct {
		Prompt json.RawMessage `json:"prompt"`
	}
	if len(prompts) == 1 {
		_ = json.Unmarshal(prompts[0].Params, &got)
	}
	want := `[{"type":"text","text":"see"},{"type":"image","mimeType":"image/png","data":"iVBORw0KGgo="}]`
	if !jsonEqual(got.Prompt, want) {
		t.Errorf("the agent got %d prompts, the last %s; want one, %s", len(prompts), got.Prompt, want)
	}
	other, err := client.Dial(ctxT(t, 10*time.Second), "ws://"+h.Addr, client.Options{Token: h.Token})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	res, err := other.Resume(ctxT(t, 10*time.Second), wire.ResumeParams{SessionID: snap.SessionKey})
	if err != nil || len(res.Messages) == 0 || !jsonEqual(res.Messages[0].Content, want) {
		t.Errorf("snapshot messages = %+v, %v; want the prompt's row with its blocks", res.Messages, err)
	}
	resource := `[{"type":"resource","resource":{"uri":"file:///a","text":"x"}}]`
	_, err = c.SubmitContent(ctxT(t, 10*time.Second), snap.SessionID, "", json.RawMessage(resource))
	if !client.IsCode(err, -32602) {
		t.Errorf("prompt.submit with a resource the agent does not take: %v, want -32602", err)
	}
}

// TestACPLargeImage: a pasted screenshot of megabytes fits through /acp
// (its socket takes more than /api/ws's 1 MiB): it reaches the agent as
// sent and session/load replays it whole; a prompt past what the ACP
// library reads (10 MiB) is answered -32602, not a socket closed with
// 1009.
func TestACPLargeImage(t *testing.T) {
	h := startACPHost(t, acpHostConfig{AgentArgs: []string{"--prompt-caps", "image"}})
	dir := t.TempDir()
	writeBlocks := func(name string, n int) string {
		img := make([]byte, n)
		for i := range img {
			img[i] = byte(i*7 + i/251)
		}
		b, err := json.Marshal([]map[string]string{{"type": "image", "mimeType": "image/png", "data": base64.StdEncoding.EncodeToString(img)}})
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	shot := writeBlocks("shot.json", 3<<20) // 4 MiB as base64
	want, err := os.ReadFile(shot)
	if err != nil {
		t.Fatal(err)
	}
	r := h.run(t, "prompt", "--text", "what is wrong here", "--blocks-file", shot)
	if r.Prompt == nil || r.Prompt.StopReason != "end_turn" {
		t.Fatalf("session/prompt with a 4 MiB image = %+v (errors %v), want end_turn", r.Prompt, r.Errors)
	}
	prompts := received(h.log(t), "session/prompt")
	if len(prompts) != 1 {
		t.Fatalf("the agent got %d session/prompt, want 1", len(prompts))
	}
	var got struct {
		Prompt []json.RawMessage `json:"prompt"`
	}
	_ = json.Unmarshal(prompts[0].Params, &got)
	if len(got.Prompt) != 2 || !jsonEqual(got.Prompt[1], string(want[1:len(want)-1])) {
		t.Errorf("the agent got %d blocks, want the text and the image as sent", len(got.Prompt))
	}

	l := h.run(t, "load", "--session", r.SessionID)
	var images int
	for _, u := range l.Updates {
		if u.Phase == "replay" && u.Update.SessionUpdate == "user_message_chunk" && jsonEqual(u.Update.Content, string(want[1:len(want)-1])) {
			images++
		}
	}
	if images != 1 {
		t.Errorf("session/load replayed the 4 MiB image %d times whole, want once (errors %v)", images, l.Errors)
	}

	huge := writeBlocks("huge.json", 9<<20) // 12 MiB as base64
	a := h.run(t, "prompt", "--session", r.SessionID, "--text", "and this", "--blocks-file", huge)
	if a.Prompt == nil || !a.Prompt.Error.codeIs(-32602) {
		t.Errorf("a prompt of 12 MiB: %+v (errors %v), want -32602", a.Prompt, a.Errors)
	}
	if n := len(received(h.log(t), "session/prompt")); n != 1 {
		t.Errorf("the agent got %d session/prompt, want 1: the refused one never reaches it", n)
	}
}
