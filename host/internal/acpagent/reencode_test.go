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

// libraryDecode is what the library hands SessionUpdate for a line of the
// agent's (ok false: it hands over nothing): the envelope decoded as its
// anyMessage, a notification of session/update, its params decoded.
func libraryDecode(line []byte) (acp.SessionNotification, bool) {
	var msg struct {
		JSONRPC string            `json:"jsonrpc"`
		ID      *json.RawMessage  `json:"id,omitempty"`
		Method  string            `json:"method,omitempty"`
		Params  json.RawMessage   `json:"params,omitempty"`
		Result  json.RawMessage   `json:"result,omitempty"`
		Error   *acp.RequestError `json:"error,omitempty"`
	}
	var n acp.SessionNotification
	if json.Unmarshal(line, &msg) != nil || msg.ID != nil || msg.Method != acp.ClientMethodSessionUpdate {
		return n, false
	}
	if json.Unmarshal(msg.Params, &n) != nil {
		return n, false
	}
	return n, true
}

// TestDecodeTextChunkIsTheLibrarys: a line decodeTextChunk takes (order
// hands it to SessionUpdate without the library) is one the library
// hands over too, with the same session, the same journaled bytes and
// the same text; the agents' usual text chunks are taken.
func TestDecodeTextChunkIsTheLibrarys(t *testing.T) {
	const head = `{"jsonrpc":"2.0","method":"session/update","params":`
	for _, tc := range []struct {
		line string
		take bool
	}{
		// The TypeScript SDK's layout (the acp row's agent), and others.
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"b1 "},"_meta":{"agent/t":12345.678}},"_meta":{"agent/n":5}}}`, true},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"<\u2028\"é\ud83d\ude00"}}}}`, true},
		{`{"method":"session/update","jsonrpc":"2.0","params":{"update":{"content":{"text":"x","type":"text"},"sessionUpdate":"agent_message_chunk"},"sessionId":"s1"}}`, true},
		{`{"method":"session/update","params":{"sessionId":null,"update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":null},"_meta":null},"_meta":null}}`, true},
		{" \t" + `{ "jsonrpc" : "2.0" ,"method":"session/update", "params" :{"sessionId":"s\u0031" , "update":{ "sessionUpdate" : "agent_message_chunk", "content" : { "type" :"text","text" : "a\\b\n" } , "_meta" : { "k" : [ 1 , { "x" : "}" } ] } } } }` + "\r\n ", true},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"},"_meta":{"n":1e400}}}}`, false},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}},"_meta":{"n":1e400}}}`, false},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a"}}}}`, false},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a","text":"b"}}}}`, false},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"image","data":"x"},"content":{"type":"text","text":"b"}}}}`, false},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","_meta":{"a":1},"_meta":{"b":2},"content":{"type":"text","text":"b"}}}}`, false},
		{head + `{"sessionId":"s1","update":{"session\u0055pdate":"agent_message_chunk","content":{"type":"text","text":"b"}}}}`, false},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}}} trailing`, false},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"bad ` + "\xff" + ` utf8"}}}}`, true},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":null,"content":{"type":"text","text":"x"}}}}`, false},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":null,"text":"x"}}}}`, false},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text"}}}}`, false},
		// Left to the library.
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x","annotations":{}}}}}`, false},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","messageId":"m","content":{"type":"text","text":"x"}}}}`, false},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_thought_chunk","content":{"type":"text","text":"x"}}}}`, false},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"image","data":"x","mimeType":"image/png"}}}}`, false},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","Content":{"type":"text","text":"x"}}}}`, false},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","Text":"x"}}}}`, false},
		{head + `{"SessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}}}`, false},
		{`{"jsonrpc":"2.0","Method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}}}`, false},
		{`{"jsonrpc":2,"method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}}}`, false},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":1}}}}`, false},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"},"_meta":[1]}}}`, false},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}},"_meta":"m"}}`, false},
		{head + `{"sessionId":1,"update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}}}`, false},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":null}}}`, false},
		{head + `{"sessionId":"s1"}}`, false},
		{head + `null}`, false},
		{`null`, false},
		{head + `{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}}`, false},
	} {
		got, took := decodeTextChunk([]byte(tc.line))
		if took != tc.take {
			t.Errorf("decodeTextChunk(%q) took it: %v, want %v", tc.line, took, tc.take)
		}
		if !took {
			continue
		}
		want, ok := libraryDecode([]byte(tc.line))
		if !ok {
			t.Errorf("%q: taken, but the library hands nothing over", tc.line)
			continue
		}
		gb, gerr := encodeUpdate(got.Update)
		wb, werr := encodeUpdate(want.Update)
		if got.SessionId != want.SessionId || !bytes.Equal(gb, wb) || gerr != nil || werr != nil ||
			want.Update.AgentMessageChunk == nil || want.Update.AgentMessageChunk.Content.Text == nil ||
			got.Update.AgentMessageChunk.Content.Text.Text != want.Update.AgentMessageChunk.Content.Text.Text {
			t.Errorf("%q:\n decodeTextChunk %q %q\n the library     %q %q", tc.line, got.SessionId, gb, want.SessionId, wb)
		}
	}
}
