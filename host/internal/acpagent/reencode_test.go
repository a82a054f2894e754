package acpagent

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/coder/acp-go-sdk"
)

// TestUpdatesAreTheSDKsReencoding pins what an acp.update holds: not the
// agent's bytes but the Go SDK's re-encoding of them, the SDK having
// decoded the session/update (SessionUpdate journals
// json.Marshal(n.Update)). docs/PROTOCOL.md 14.12 lists these changes;
// when an SDK upgrade makes this fail, update that list.
func TestUpdatesAreTheSDKsReencoding(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"known kind, keys in order: unchanged",
			`{"content":{"text":"hi","type":"text"},"sessionUpdate":"agent_message_chunk"}`,
			`{"content":{"text":"hi","type":"text"},"sessionUpdate":"agent_message_chunk"}`},
		{"keys sorted",
			`{"sessionUpdate":"tool_call","toolCallId":"c1","title":"Read","status":"pending"}`,
			`{"sessionUpdate":"tool_call","status":"pending","title":"Read","toolCallId":"c1"}`},
		{"unknown fields dropped, the update's _meta kept, a content block's _meta dropped",
			`{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi","_meta":{"x":1}},"_meta":{"a":1},"future":true}`,
			`{"_meta":{"a":1},"content":{"text":"hi","type":"text"},"sessionUpdate":"agent_message_chunk"}`},
		{"unknown fields dropped at any depth",
			`{"sessionUpdate":"plan","entries":[{"content":"a","priority":"high","status":"pending","extra":1}]}`,
			`{"entries":[{"content":"a","priority":"high","status":"pending"}],"sessionUpdate":"plan"}`},
		{"unknown kind with content becomes user_message_chunk",
			`{"sessionUpdate":"future_kind","content":{"type":"text","text":"x"}}`,
			`{"content":{"text":"x","type":"text"},"sessionUpdate":"user_message_chunk"}`},
		{"unknown kind without content becomes session_info_update",
			`{"sessionUpdate":"future_kind","foo":1}`,
			`{"sessionUpdate":"session_info_update"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n acp.SessionNotification
			if err := json.Unmarshal([]byte(`{"sessionId":"s","update":`+tc.in+`}`), &n); err != nil {
				t.Fatal(err)
			}
			got, err := json.Marshal(n.Update)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("journaled %s, want %s", got, tc.want)
			}
		})
	}
}

// TestEncodeUpdateIsTheLibrarys: the update an ACP agent's session/update
// carries is journaled as json.Marshal of the library's decoding of it;
// encodeUpdate writes text chunks itself and must give the same bytes for
// every update, text chunk or not (escapes, invalid UTF-8, _meta,
// messageId, other kinds and content blocks).
func TestEncodeUpdateIsTheLibrarys(t *testing.T) {
	texts := []string{"", "hi", `<a href="x">&amp;</a>`, "\u2028\u2029 \t\n\r\\ \x00\x1f", "é ü 日本 😀", "\xff\xfe bad \xc3", strings.Repeat("long ", 1000)}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		b := make([]byte, rng.IntN(40))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		texts = append(texts, string(b))
	}
	var updates []acp.SessionUpdate
	for _, s := range texts {
		updates = append(updates, acp.UpdateAgentMessageText(s), acp.UpdateUserMessageText(s), acp.UpdateAgentThoughtText(s))
		enc, _ := json.Marshal(s)
		for _, in := range []string{
			`{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":` + string(enc) + `}}`,
			`{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":` + string(enc) + `,"annotations":{"priority":1},"_meta":{"x":1}}}`,
			`{"sessionUpdate":"agent_message_chunk","messageId":"m1","content":{"type":"text","text":` + string(enc) + `}}`,
			`{"sessionUpdate":"agent_message_chunk","_meta":{"a":` + string(enc) + `},"content":{"type":"text","text":"x"}}`,
			`{"sessionUpdate":"agent_message_chunk","_meta":{"agent/t":12345.678901,"z":[1,2.5e30,-0.0,null,true,{"<k>":` + string(enc) + `}],"big":12345678901234567890,"e":{}},"content":{"type":"text","text":` + string(enc) + `}}`,
			`{"sessionUpdate":"agent_message_chunk","_meta":{},"content":{"type":"text","text":` + string(enc) + `}}`,
		} {
			var n acp.SessionNotification
			if err := json.Unmarshal([]byte(`{"sessionId":"s","update":`+in+`}`), &n); err != nil {
				t.Fatalf("%s: %v", in, err)
			}
			updates = append(updates, n.Update)
		}
	}
	updates = append(updates,
		acp.SessionUpdate{AgentMessageChunk: &acp.SessionUpdateAgentMessageChunk{Content: acp.ImageBlock("ZGF0YQ==", "image/png")}},
		acp.SessionUpdate{AgentMessageChunk: &acp.SessionUpdateAgentMessageChunk{Content: acp.ResourceLinkBlock("f", "file:///f")}},
		acp.StartToolCall("c1", "Read", acp.WithStartStatus(acp.ToolCallStatusPending)),
	)
	// _meta made in Go, not decoded: numbers the round trip through a
	// map changes, values it cannot encode.
	for _, m := range []map[string]any{
		{"u": uint64(12345678901234567890)}, {"i": 7}, {"f": float32(0.1)}, {"n": math.NaN()},
		{"bad": "\xff"}, {"\xff": 1}, {"s": []string{"a"}}, {"t": struct{ A int }{1}}, {"deep": map[string]any{"i": int64(1) << 60}},
	} {
		u := acp.UpdateAgentMessageText("x")
		u.AgentMessageChunk.Meta = m
		updates = append(updates, u)
	}
	for i, u := range updates {
		want, werr := json.Marshal(u)
		got, gerr := encodeUpdate(u)
		if !bytes.Equal(got, want) || (werr == nil) != (gerr == nil) {
			t.Errorf("update %d: encodeUpdate = %s, %v; json.Marshal = %s, %v", i, got, gerr, want, werr)
		}
	}
}
