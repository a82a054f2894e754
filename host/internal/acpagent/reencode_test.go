package acpagent

import (
	"encoding/json"
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
