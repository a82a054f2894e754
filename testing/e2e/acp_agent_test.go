package e2e_test

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// directStep is how one prompt went in testing/acp/direct.mjs.
type directStep struct {
	Updates    []acpUpdate `json:"updates"`
	StopReason string      `json:"stopReason"`
	Error      *rpcErr     `json:"error"`
}

type directCall struct {
	Result json.RawMessage `json:"result"`
	Error  *rpcErr         `json:"error"`
}

type initResult struct {
	ProtocolVersion   int `json:"protocolVersion"`
	AgentCapabilities struct {
		LoadSession         bool                       `json:"loadSession"`
		SessionCapabilities map[string]json.RawMessage `json:"sessionCapabilities"`
	} `json:"agentCapabilities"`
}

type exitStatus struct {
	Code   *int    `json:"code"`
	Signal *string `json:"signal"`
}

// TestACPTestAgentDirect runs the kit's test agent under the official SDK
// client over stdio, with no tether in between (testing/acp/direct.mjs),
// through every command of its prompt mini-language, a restart on the same
// session directory and a start without load support. It proves the agent
// the other ACP tests put behind `tether serve --agent acp` does what they
// rely on.
func TestACPTestAgentDirect(t *testing.T) {
	dir := t.TempDir()
	var out struct {
		Initialize          initResult `json:"initialize"`
		SessionID           string     `json:"sessionId"`
		Chunks              directStep `json:"chunks"`
		Tool                directStep `json:"tool"`
		PermissionAllow     directStep `json:"permissionAllow"`
		PermissionCancelled directStep `json:"permissionCancelled"`
		PermissionRequests  []struct {
			SessionID string `json:"sessionId"`
			ToolCall  struct {
				ToolCallID string `json:"toolCallId"`
			} `json:"toolCall"`
			Options []struct {
				OptionID string `json:"optionId"`
				Kind     string `json:"kind"`
			} `json:"options"`
		} `json:"permissionRequests"`
		Slow           directStep `json:"slow"`
		Echo           directStep `json:"echo"`
		Fail           directStep `json:"fail"`
		UnknownSession directStep `json:"unknownSession"`
		Crash          directStep `json:"crash"`
		CrashExit      exitStatus `json:"crashExit"`
		Restart        struct {
			Initialize       initResult  `json:"initialize"`
			PromptBeforeLoad directStep  `json:"promptBeforeLoad"`
			Load             directCall  `json:"load"`
			Replayed         []acpUpdate `json:"replayed"`
			LoadUnknown      directCall  `json:"loadUnknown"`
			After            directStep  `json:"after"`
			List             directCall  `json:"list"`
			Exit             exitStatus  `json:"exit"`
		} `json:"restart"`
		NoLoad struct {
			Initialize initResult `json:"initialize"`
			Load       directCall `json:"load"`
			Exit       exitStatus `json:"exit"`
		} `json:"noLoad"`
	}
	raw := runNode(t, nil, "direct.mjs", dir)
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("direct.mjs output: %v\n%s", err, raw)
	}

	if out.Initialize.ProtocolVersion != 1 || !out.Initialize.AgentCapabilities.LoadSession {
		t.Errorf("initialize: got %+v, want protocolVersion 1 and loadSession true", out.Initialize)
	}
	if !strings.HasPrefix(out.SessionID, "sess-") {
		t.Errorf("session/new: sessionId %q, want sess-…", out.SessionID)
	}

	steps := []struct {
		name string
		got  directStep
		want []string
		stop string
	}{
		{"chunks 3 delay 10", out.Chunks, []string{"agent_message_chunk:c1 ", "agent_message_chunk:c2 ", "agent_message_chunk:c3 "}, "end_turn"},
		{"tool", out.Tool, []string{"tool_call:tool-2:pending", "tool_call_update:tool-2:completed", "agent_message_chunk:tool done"}, "end_turn"},
		{"permission (allow)", out.PermissionAllow, []string{"tool_call:tool-3:pending", "agent_message_chunk:chose:allow"}, "end_turn"},
		{"permission (cancelled outcome)", out.PermissionCancelled, []string{"tool_call:tool-4:pending", "agent_message_chunk:chose:cancelled"}, "end_turn"},
		{"echo", out.Echo, []string{"agent_message_chunk:  hello   world "}, "end_turn"},
	}
	for _, s := range steps {
		if got := shorts(s.got.Updates); !slices.Equal(got, s.want) || s.got.StopReason != s.stop || s.got.Error != nil {
			t.Errorf("%s: got updates %q, stopReason %q, error %+v; want %q, %q", s.name, got, s.got.StopReason, s.got.Error, s.want, s.stop)
		}
	}
	if len(out.PermissionRequests) != 2 {
		t.Errorf("permission requests seen by the client: %d, want 2", len(out.PermissionRequests))
	} else {
		pr := out.PermissionRequests[0]
		var opts []string
		for _, o := range pr.Options {
			opts = append(opts, o.OptionID+"/"+o.Kind)
		}
		if pr.SessionID != out.SessionID || pr.ToolCall.ToolCallID != "tool-3" || !slices.Equal(opts, []string{"allow/allow_once", "deny/reject_once"}) {
			t.Errorf("permission request: got %+v, want session %s, tool-3, options allow/allow_once deny/reject_once", pr, out.SessionID)
		}
	}

	// slow: cancelled after the third chunk; the agent may have sent one
	// more before the cancel reached it, never fewer.
	if n := len(out.Slow.Updates); n < 3 || out.Slow.StopReason != "cancelled" {
		t.Errorf("slow + session/cancel: got %d updates, stopReason %q; want at least 3 and cancelled", n, out.Slow.StopReason)
	}
	for i, u := range out.Slow.Updates {
		if want := "agent_message_chunk:s" + strconv.Itoa(i+1) + " "; u.short() != want {
			t.Errorf("slow update %d: got %q, want %q", i, u.short(), want)
		}
	}

	if !out.Fail.Error.codeIs(-32603) || !strings.Contains(string(out.Fail.Error.Data), "fail requested") || !slices.Equal(shorts(out.Fail.Updates), []string{"agent_message_chunk:c1 "}) {
		t.Errorf("fail: got %+v (data %s), updates %q; want -32603 with data.reason, after c1", out.Fail.Error, errData(out.Fail.Error), shorts(out.Fail.Updates))
	}
	if !out.UnknownSession.Error.codeIs(-32002) {
		t.Errorf("prompt on an unknown session: got %+v, want -32002", out.UnknownSession.Error)
	}
	if out.Crash.Error == nil || !slices.Equal(shorts(out.Crash.Updates), []string{"agent_message_chunk:c1 "}) {
		t.Errorf("crash: got updates %q, error %+v; want c1 and the prompt failing with the connection", shorts(out.Crash.Updates), out.Crash.Error)
	}
	if out.CrashExit.Code == nil || *out.CrashExit.Code != 3 {
		t.Errorf("crash: the agent exited with %+v, want code 3", out.CrashExit)
	}

	// The restarted agent knows the session only after session/load, which
	// replays the whole history, prompts included, in order.
	r := out.Restart
	if !r.PromptBeforeLoad.Error.codeIs(-32002) {
		t.Errorf("after a restart, a prompt before session/load: got %+v, want -32002", r.PromptBeforeLoad.Error)
	}
	if r.Load.Error != nil {
		t.Errorf("session/load after a restart: %+v", r.Load.Error)
	}
	var wantReplay []string
	for _, s := range []struct {
		prompt string
		got    directStep
	}{
		{"chunks 3 delay 10", out.Chunks}, {"tool", out.Tool}, {"permission", out.PermissionAllow},
		{"permission", out.PermissionCancelled}, {"slow 10", out.Slow}, {"  hello   world ", out.Echo},
		{"fail", out.Fail}, {"crash", out.Crash},
	} {
		wantReplay = append(wantReplay, "user_message_chunk:"+s.prompt)
		wantReplay = append(wantReplay, shorts(s.got.Updates)...)
	}
	if got := shorts(r.Replayed); !slices.Equal(got, wantReplay) {
		t.Errorf("session/load replay:\n got %q\nwant %q", got, wantReplay)
	}
	if !r.LoadUnknown.Error.codeIs(-32002) {
		t.Errorf("session/load of an unknown session: got %+v, want -32002", r.LoadUnknown.Error)
	}
	if got := shorts(r.After.Updates); !slices.Equal(got, []string{"agent_message_chunk:c1 ", "agent_message_chunk:c2 "}) || r.After.StopReason != "end_turn" {
		t.Errorf("prompt after session/load: got %q %q, want c1 c2 end_turn", got, r.After.StopReason)
	}
	var list struct {
		Sessions []struct {
			SessionID string `json:"sessionId"`
			Cwd       string `json:"cwd"`
		} `json:"sessions"`
	}
	if err := json.Unmarshal(r.List.Result, &list); err != nil || len(list.Sessions) != 1 || list.Sessions[0].SessionID != out.SessionID || list.Sessions[0].Cwd != dir {
		t.Errorf("session/list: got %s (%v), want the one session with cwd %s", r.List.Result, err, dir)
	}
	if r.Exit.Code == nil || *r.Exit.Code != 0 {
		t.Errorf("agent exit on stdin EOF: %+v, want 0", r.Exit)
	}

	if out.NoLoad.Initialize.AgentCapabilities.LoadSession || !out.NoLoad.Load.Error.codeIs(-32601) {
		t.Errorf("--no-load: got loadSession %v, session/load %+v; want false and -32601", out.NoLoad.Initialize.AgentCapabilities.LoadSession, out.NoLoad.Load.Error)
	}

	// The log: what each process received, one answer per permission
	// request, the cancel and the loads.
	log := readAgentLog(t, filepath.Join(dir, "agent.log"))
	var starts []int
	for _, e := range log {
		if e.Dir == "event" && e.Event == "start" {
			starts = append(starts, e.PID)
		}
	}
	if len(starts) != 3 {
		t.Errorf("agent log: %d starts, want 3", len(starts))
	}
	perms := sentRequests(log, "session/request_permission")
	if len(perms) != 2 {
		t.Fatalf("agent log: %d session/request_permission sent, want 2", len(perms))
	}
	wantOutcomes := []string{`{"outcome":"selected","optionId":"allow"}`, `{"outcome":"cancelled"}`}
	for i, p := range perms {
		answers := responsesTo(log, p.ID)
		if len(answers) != 1 {
			t.Errorf("permission request %s: %d answers in the log, want exactly 1", p.ID, len(answers))
			continue
		}
		var res struct {
			Outcome json.RawMessage `json:"outcome"`
		}
		if err := json.Unmarshal(answers[0].Result, &res); err != nil || !jsonEqual(res.Outcome, wantOutcomes[i]) {
			t.Errorf("permission request %s: answer %s, want outcome %s", p.ID, answers[0].Result, wantOutcomes[i])
		}
	}
	if c := received(log, "session/cancel"); len(c) != 1 || !strings.Contains(string(c[0].Params), out.SessionID) {
		t.Errorf("agent log: session/cancel received %d times (%+v), want once for %s", len(c), c, out.SessionID)
	}
	if l := received(log, "session/load"); len(l) != 3 {
		t.Errorf("agent log: session/load received %d times, want 3 (known, unknown, --no-load)", len(l))
	}
	for _, e := range log {
		if e.Dir == "event" && e.Event == "exit" && e.Reason == "crash requested" && e.PID != starts[0] {
			t.Errorf("crash logged by pid %d, want the first agent %d", e.PID, starts[0])
		}
	}
}

func errData(e *rpcErr) string {
	if e == nil {
		return ""
	}
	return string(e.Data)
}

// jsonEqual reports whether a and b hold equal JSON values.
func jsonEqual(a json.RawMessage, b string) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}
