package e2e_test

import (
	"encoding/json"
	"slices"
	"testing"
)

// TestACPClientKitThroughRelay runs the kit's ACP client scenarios
// (testing/acp/client.mjs, the SDK 2.4.0 client over its experimental
// WebSocket stream) against the test agent behind a bare WebSocket-to-stdio
// relay (testing/acp/relay.mjs): no tether. It proves the scenarios work,
// and pins the SDK behaviour the /acp endpoint has to live with: how the
// token reaches the server, that params._meta survives the SDK's parsing,
// and what an SDK client does with a $/cancel_request for a permission
// request it holds.
func TestACPClientKitThroughRelay(t *testing.T) {
	const token = "relay-token"
	r := startRelay(t, token)

	t.Run("token as bearer header", func(t *testing.T) {
		res := runACPClient(t, r.URL, token, "initialize")
		var init initResult
		if res.Initialize.Error != nil || json.Unmarshal(res.Initialize.Result, &init) != nil || init.ProtocolVersion != 1 {
			t.Errorf("initialize: got %s / %+v, want protocolVersion 1", res.Initialize.Result, res.Initialize.Error)
		}
		if a := r.auths(t); len(a) == 0 || a[len(a)-1] != "header" {
			t.Errorf("relay saw the token as %q, want the Authorization header (the ws-client passes headers to the ws constructor)", a)
		}
		if res.Close == nil || res.Close.Code != 1000 {
			t.Errorf("close: got %+v, want 1000 from the client's own close", res.Close)
		}
	})
	t.Run("token in query", func(t *testing.T) {
		res := runACPClient(t, r.URL, token, "initialize", "--token-in-query")
		if res.Initialize.Error != nil {
			t.Errorf("initialize: %+v", res.Initialize.Error)
		}
		if a := r.auths(t); len(a) == 0 || a[len(a)-1] != "query" {
			t.Errorf("relay saw the token as %q, want ?token=", a)
		}
	})
	t.Run("wrong token", func(t *testing.T) {
		res := runACPClient(t, r.URL, "wrong", "initialize")
		if res.Initialize.Error == nil || res.Close == nil || res.Close.Code != 4401 {
			t.Errorf("with a wrong token: initialize %s / %+v, close %+v; want an error and close 4401 visible to the client", res.Initialize.Result, res.Initialize.Error, res.Close)
		}
	})

	var sid string
	t.Run("new and prompt", func(t *testing.T) {
		res := runACPClient(t, r.URL, token, "prompt", "--text", "chunks 3")
		sid = res.SessionID
		if res.Prompt == nil || res.Prompt.StopReason != "end_turn" {
			t.Fatalf("prompt: got %+v, want end_turn", res.Prompt)
		}
		want := []string{"agent_message_chunk:c1 ", "agent_message_chunk:c2 ", "agent_message_chunk:c3 "}
		if got := shorts(res.updatesIn("live")); !slices.Equal(got, want) || len(res.Updates) != 3 {
			t.Errorf("updates: got %q (of %d), want %q live", got, len(res.Updates), want)
		}
		for i, u := range res.Updates {
			if u.Seq != nil {
				t.Errorf("update %d: tether/seq %d through a bare relay, want none", i, *u.Seq)
			}
			// The agent sets _meta {"agent/n": N}: the SDK hands the
			// client the params' _meta as it came.
			if len(u.Meta) == 0 || string(u.Meta) == "null" || !jsonEqual(u.SDKMeta, string(u.Meta)) {
				t.Errorf("update %d: _meta on the wire %s, after the SDK %s; want the same, not empty", i, u.Meta, u.SDKMeta)
			}
		}
	})
	t.Run("load from a new connection", func(t *testing.T) {
		res := runACPClient(t, r.URL, token, "load", "--session", sid)
		want := []string{"user_message_chunk:chunks 3", "agent_message_chunk:c1 ", "agent_message_chunk:c2 ", "agent_message_chunk:c3 "}
		if res.Bind == nil || res.Bind.Error != nil || res.Bind.Replayed != len(want) {
			t.Fatalf("session/load: got %+v, want success after %d replayed updates", res.Bind, len(want))
		}
		if got := shorts(res.updatesIn("replay")); !slices.Equal(got, want) || len(res.Updates) != len(want) {
			t.Errorf("replay: got %q, want %q", got, want)
		}
	})
	t.Run("drop mid-turn", func(t *testing.T) {
		res := runACPClient(t, r.URL, token, "prompt", "--session", sid, "--text", "chunks 5 delay 50", "--drop-after", "2")
		if !res.Dropped || res.Prompt != nil || len(res.updatesIn("live")) != 2 {
			t.Errorf("drop: got dropped %v, prompt %+v, %d live updates; want a drop after 2 with no answer", res.Dropped, res.Prompt, len(res.updatesIn("live")))
		}
	})
	t.Run("cancel", func(t *testing.T) {
		res := runACPClient(t, r.URL, token, "cancel", "--cancel-after", "2")
		if !res.CancelSent || res.Prompt == nil || res.Prompt.StopReason != "cancelled" {
			t.Errorf("cancel: got sent %v, prompt %+v; want stopReason cancelled", res.CancelSent, res.Prompt)
		}
		if c := received(readAgentLog(t, r.Log), "session/cancel"); len(c) == 0 {
			t.Error("the agent log has no session/cancel")
		}
	})
	t.Run("permission answered", func(t *testing.T) {
		res := runACPClient(t, r.URL, token, "permission", "--text", "permission", "--permission", "allow")
		if len(res.PermissionRequests) != 1 || !res.PermissionRequests[0].AnswerSent || res.Prompt == nil || res.Prompt.StopReason != "end_turn" {
			t.Fatalf("permission: got %+v, prompt %+v; want one request answered and end_turn", res.PermissionRequests, res.Prompt)
		}
		if got := shorts(res.all()); !slices.Contains(got, "agent_message_chunk:chose:allow") {
			t.Errorf("updates %q: want chose:allow", got)
		}
	})
	// The agent withdraws its request with $/cancel_request (as tether does
	// to the losers). The SDK aborts the handler's signal and sends
	// whatever the handler then does: -32800 when it rejects with the abort
	// reason, a late result when it answers anyway.
	for _, tc := range []struct {
		afterCancel, want string
	}{
		{"error", "agent_message_chunk:withdrawn:error:-32800"},
		{"answer:deny", "agent_message_chunk:withdrawn:deny"},
	} {
		t.Run("permission withdrawn, then "+tc.afterCancel, func(t *testing.T) {
			res := runACPClient(t, r.URL, token, "permission", "--text", "withdraw", "--after-cancel", tc.afterCancel, "--wait-cancel-request", "--until-text", "withdrawn:")
			if len(res.PermissionRequests) != 1 {
				t.Fatalf("permission requests: got %d, want 1", len(res.PermissionRequests))
			}
			p := res.PermissionRequests[0]
			if !p.CancelRequested || !p.AnswerSent || len(res.CancelRequests) != 1 || string(res.CancelRequests[0]) != string(p.RequestID) {
				t.Errorf("got request %s cancelRequested %v answerSent %v, $/cancel_request for %s; want the same id withdrawn, then answered", p.RequestID, p.CancelRequested, p.AnswerSent, res.CancelRequests)
			}
			if got := shorts(res.all()); !slices.Contains(got, tc.want) {
				t.Errorf("updates %q: want %q (what reached the agent)", got, tc.want)
			}
		})
	}
	t.Run("list", func(t *testing.T) {
		res := runACPClient(t, r.URL, token, "list")
		var l struct {
			Sessions []struct {
				SessionID string `json:"sessionId"`
			} `json:"sessions"`
		}
		if res.List == nil || res.List.Error != nil || json.Unmarshal(res.List.Result, &l) != nil || !slices.ContainsFunc(l.Sessions, func(s struct {
			SessionID string `json:"sessionId"`
		}) bool {
			return s.SessionID == sid
		}) {
			t.Errorf("session/list: got %+v, want %s among the sessions", res.List, sid)
		}
	})
	t.Run("resume unsupported by the agent", func(t *testing.T) {
		res := runACPClient(t, r.URL, token, "resume", "--session", sid, "--after", "1")
		if res.Bind == nil || !res.Bind.Error.codeIs(-32601) {
			t.Errorf("session/resume straight to the test agent: got %+v, want -32601 (only tether implements it)", res.Bind)
		}
	})
}
