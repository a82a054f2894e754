package e2e_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/wsclient"
)

// The ACP tests: `tether serve --agent acp` running the kit's test agent
// (testing/acp/agent.mjs), driven through `GET /acp` by the kit's SDK
// client (testing/acp/client.mjs) and through /api/ws by wsclient. They
// check the ACP part of the protocol (docs/PROTOCOL.md) end to end against
// the official TypeScript SDK.

// storedKeyRe is a stored session key, the ACP sessionId /acp clients see.
var storedKeyRe = regexp.MustCompile(`^\d{8}_\d{6}_[0-9a-f]{6}$`)

// acpHost is a `tether serve --agent acp` running the test agent.
type acpHost struct {
	*e2e.Server
	AgentDir string // the test agent's --dir (its sessions survive restarts)
	AgentLog string // the test agent's --log
}

// acpHostConfig configures startACPHost.
type acpHostConfig struct {
	StateDir  string   // "" for a new one; a previous host's to restart on its state
	AgentDir  string   // "" for a new one; a previous host's to keep the agent's sessions
	Args      []string // more tether flags
	AgentArgs []string // more agent flags (e.g. --no-load)
}

// startACPHost starts tether with the test agent as its ACP agent. The
// agent gets its directory and log on its command line: tether passes no
// TETHER_* variable to an agent.
func startACPHost(tb testing.TB, cfg acpHostConfig) acpHost {
	tb.Helper()
	kit, node := acpKit(tb)
	if cfg.AgentDir == "" {
		cfg.AgentDir = tb.TempDir()
	}
	log := filepath.Join(cfg.AgentDir, "agent.log")
	words := append([]string{node, filepath.Join(kit, "agent.mjs"), "--dir", cfg.AgentDir, "--log", log}, cfg.AgentArgs...)
	for i, w := range words {
		words[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	args := append([]string{"--agent", "acp", "--agent-command", strings.Join(words, " "), "--agent-cwd", cfg.AgentDir}, cfg.Args...)
	s := e2e.Start(tb, e2e.Config{StateDir: cfg.StateDir, Args: args})
	return acpHost{Server: s, AgentDir: cfg.AgentDir, AgentLog: log}
}

// acpURL is the host's /acp endpoint (the token goes in a header).
func acpURL(s *e2e.Server) string { return "ws://" + s.Addr + "/acp" }

// run runs one client.mjs scenario against the host's /acp.
func (h acpHost) run(tb testing.TB, scenario string, args ...string) acpResult {
	tb.Helper()
	return runACPClient(tb, acpURL(h.Server), h.Token, scenario, args...)
}

// start starts one client.mjs scenario against the host's /acp.
func (h acpHost) start(tb testing.TB, scenario string, args ...string) *acpClient {
	tb.Helper()
	return startACPClient(tb, acpURL(h.Server), h.Token, scenario, args...)
}

// log reads the test agent's log.
func (h acpHost) log(tb testing.TB) []agentLogEntry {
	tb.Helper()
	return readAgentLog(tb, h.AgentLog)
}

// agentStarts returns the pids of the agent processes started, in order.
func agentStarts(entries []agentLogEntry) []int {
	var pids []int
	for _, e := range entries {
		if e.Dir == "event" && e.Event == "start" {
			pids = append(pids, e.PID)
		}
	}
	return pids
}

// checkSeqs checks that every update carries _meta["tether/seq"], that the
// SDK handed it to the client unchanged, and that the seqs increase.
func checkSeqs(tb testing.TB, what string, us []acpSeen) {
	tb.Helper()
	var last int64
	for i, u := range us {
		switch {
		case u.Seq == nil:
			tb.Errorf("%s: update %d (%s) has no _meta[\"tether/seq\"] (params._meta %s)", what, i, u.Update.short(), u.Meta)
			continue
		case u.SDKSeq == nil || *u.SDKSeq != *u.Seq:
			tb.Errorf("%s: update %d: tether/seq %d on the wire, %v after the SDK's parsing", what, i, *u.Seq, u.SDKSeq)
		case *u.Seq <= last:
			tb.Errorf("%s: update %d (%s): tether/seq %d after %d, want increasing", what, i, u.Update.short(), *u.Seq, last)
		}
		last = *u.Seq
	}
}

// seqOf returns the tether/seq of the first update of us whose short form
// is want; it fails the test when there is none.
func seqOf(tb testing.TB, us []acpSeen, want string) int64 {
	tb.Helper()
	for _, u := range us {
		if u.Update.short() == want && u.Seq != nil {
			return *u.Seq
		}
	}
	tb.Fatalf("no update %q with a tether/seq among %q", want, shortsSeen(us))
	return 0
}

func shortsSeen(us []acpSeen) []string {
	out := make([]string, len(us))
	for i, u := range us {
		out[i] = u.Update.short()
	}
	return out
}

// chunkTexts are the texts of the agent_message_chunk updates of us.
func chunkTexts(us []acpSeen) []string {
	var out []string
	for _, u := range us {
		if u.Update.SessionUpdate == "agent_message_chunk" {
			out = append(out, u.Update.text())
		}
	}
	return out
}

// wantPrompt fails the test unless r's prompt ended with stopReason.
func wantPrompt(tb testing.TB, r acpResult, stopReason string) {
	tb.Helper()
	if r.Prompt == nil || r.Prompt.Error != nil || r.Prompt.StopReason != stopReason {
		tb.Fatalf("session/prompt: got %+v (error %+v), want stopReason %s\nresult: %.2000s", r.Prompt, promptErr(r), stopReason, r.raw)
	}
}

func promptErr(r acpResult) *rpcErr {
	if r.Prompt == nil {
		return nil
	}
	return r.Prompt.Error
}

// wantBound fails the test unless r bound its session.
func wantBound(tb testing.TB, r acpResult) {
	tb.Helper()
	if r.Bind == nil || r.Bind.Error != nil {
		tb.Fatalf("bind: got %+v, want success\nresult: %.2000s", r.Bind, r.raw)
	}
}

// nativeResume resumes the stored session key on c and returns the
// snapshot's raw JSON and its runtime id.
func nativeResume(tb testing.TB, c *wsclient.Client, key string) (json.RawMessage, string) {
	tb.Helper()
	var raw json.RawMessage
	call(tb, c, "session.resume", map[string]any{"session_id": key}, &raw)
	var snap snapshot
	if err := json.Unmarshal(raw, &snap); err != nil {
		tb.Fatalf("session.resume snapshot %s: %v", raw, err)
	}
	return raw, snap.SessionID
}

// waitIdle waits, as a native viewer on c, until the session with stored
// key has no turn in flight, and returns how the turn in flight ended ("" if
// there was none).
func waitIdle(tb testing.TB, c *wsclient.Client, key string) string {
	tb.Helper()
	raw, sid := nativeResume(tb, c, key)
	var snap struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(raw, &snap); err != nil {
		tb.Fatal(err)
	}
	if snap.Status != "working" {
		return ""
	}
	_, status := waitComplete(tb, c, sid)
	return status
}

// TestACPInitialize: tether answers initialize on /acp itself — protocol
// version 1, loadSession, sessionCapabilities.resume, the agent's prompt
// capabilities — with the token as a bearer header or ?token=, and refuses
// a wrong token with 4401.
func TestACPInitialize(t *testing.T) {
	h := startACPHost(t, acpHostConfig{})
	for _, tc := range []struct {
		name string
		args []string
	}{{"bearer header", nil}, {"token in query", []string{"--token-in-query"}}} {
		t.Run(tc.name, func(t *testing.T) {
			res := h.run(t, "initialize", tc.args...)
			if res.Initialize.Error != nil {
				t.Fatalf("initialize: %+v\n%s", res.Initialize.Error, res.raw)
			}
			var init struct {
				ProtocolVersion   int `json:"protocolVersion"`
				AgentCapabilities struct {
					LoadSession         bool `json:"loadSession"`
					PromptCapabilities  map[string]bool
					SessionCapabilities struct {
						Resume json.RawMessage `json:"resume"`
					} `json:"sessionCapabilities"`
				} `json:"agentCapabilities"`
			}
			if err := json.Unmarshal(res.Initialize.Result, &init); err != nil {
				t.Fatalf("initialize result %s: %v", res.Initialize.Result, err)
			}
			caps := init.AgentCapabilities
			if init.ProtocolVersion != 1 || !caps.LoadSession || !strings.HasPrefix(strings.TrimSpace(string(caps.SessionCapabilities.Resume)), "{") {
				t.Errorf("initialize: got %s; want protocolVersion 1, loadSession true, sessionCapabilities.resume {…}", res.Initialize.Result)
			}
			// The agent behind (the test agent, with no --prompt-caps)
			// takes text only, and so does tether (TestACPWholePrompts
			// has one that takes more).
			for _, k := range []string{"image", "audio", "embeddedContext"} {
				if caps.PromptCapabilities[k] {
					t.Errorf("promptCapabilities.%s: got true, want false (the agent's)", k)
				}
			}
		})
	}
	t.Run("wrong token", func(t *testing.T) {
		res := runACPClient(t, acpURL(h.Server), "wrong", "initialize")
		if res.Initialize.Error == nil || res.Close == nil || res.Close.Code != 4401 {
			t.Errorf("wrong token: initialize %s / %+v, close %+v; want an error and close 4401", res.Initialize.Result, res.Initialize.Error, res.Close)
		}
	})
}

// TestACPPromptStreamsWithSeq: session/new gives a stored key; a prompt
// streams the agent's updates, each with _meta["tether/seq"] (increasing,
// intact through the SDK), and ends with stopReason end_turn; the client
// does not get its own prompt back. Tool calls pass unchanged.
func TestACPPromptStreamsWithSeq(t *testing.T) {
	h := startACPHost(t, acpHostConfig{})
	res := h.run(t, "prompt", "--text", "chunks 5 delay 10")
	wantBound(t, res)
	wantPrompt(t, res, "end_turn")
	if !storedKeyRe.MatchString(res.SessionID) {
		t.Errorf("sessionId %q: want the tether stored key (YYYYMMDD_HHMMSS_xxxxxx)", res.SessionID)
	}
	want := []string{"agent_message_chunk:c1 ", "agent_message_chunk:c2 ", "agent_message_chunk:c3 ", "agent_message_chunk:c4 ", "agent_message_chunk:c5 "}
	if got := shortsSeen(res.Updates); !slices.Equal(got, want) {
		t.Errorf("updates: got %q, want %q (and not the client's own prompt)", got, want)
	}
	checkSeqs(t, "prompt", res.Updates)

	tool := h.run(t, "prompt", "--session", res.SessionID, "--text", "tool")
	wantPrompt(t, tool, "end_turn")
	wantTool := []string{"tool_call:tool-2:pending", "tool_call_update:tool-2:completed", "agent_message_chunk:tool done"}
	if got := shorts(tool.updatesIn("live")); !slices.Equal(got, wantTool) {
		t.Errorf("tool turn, live updates: got %q, want %q", got, wantTool)
	}
	checkSeqs(t, "tool turn", tool.Updates)

	log := h.log(t)
	if n := len(received(log, "session/new")); n != 1 {
		t.Errorf("agent log: %d session/new, want 1", n)
	}
	prompts := received(log, "session/prompt")
	if len(prompts) != 2 || !strings.Contains(string(prompts[0].Params), `"chunks 5 delay 10"`) {
		t.Errorf("agent log: session/prompt %+v, want 2, the first with the text", prompts)
	}
	if init := received(log, "initialize"); len(init) != 1 || strings.Contains(string(init[0].Params), `"fs":{"readTextFile":true`) {
		t.Errorf("agent log: initialize %+v, want one, with no fs capability", init)
	}
}

// TestACPLoadAfterDrop: a client drops mid-turn; the turn goes on; a
// session/load from a new connection replays the whole history once, in
// order — the prompt as user_message_chunk first — before its response,
// then the live updates follow with no gap and no repeat. A turn that ends
// while nobody is connected is stored whole.
func TestACPLoadAfterDrop(t *testing.T) {
	h := startACPHost(t, acpHostConfig{})
	a := h.run(t, "prompt", "--text", "slow 50", "--drop-after", "2")
	if !a.Dropped || len(a.Updates) != 2 {
		t.Fatalf("first client: dropped %v with %q, want a drop after 2 updates", a.Dropped, shortsSeen(a.Updates))
	}
	key := a.SessionID

	nv := h.Dial(t)
	b := h.run(t, "load", "--session", key, "--live", "3", "--send-cancel")
	if st := waitIdle(t, nv, key); st != "" && st != "interrupted" {
		t.Errorf("the slow turn, cancelled by the second client, ended %q", st)
	}
	wantBound(t, b)
	checkSeqs(t, "load", b.Updates)
	if len(b.Updates) == 0 || b.Updates[0].Update.short() != "user_message_chunk:slow 50" || b.Updates[0].Phase != "replay" {
		t.Fatalf("load: first update %q, want the prompt as user_message_chunk, replayed\n%q", shortsSeen(b.Updates[:min(1, len(b.Updates))]), shortsSeen(b.Updates))
	}
	replay := b.updatesIn("replay")
	if b.Bind.Replayed != len(replay) {
		t.Errorf("load: %d updates before the response by the tap, %d by the SDK's ordering", len(replay), b.Bind.Replayed)
	}
	for i := 1; i < len(b.Updates); i++ {
		if b.Updates[i-1].Phase == "live" && b.Updates[i].Phase == "replay" {
			t.Errorf("load: a replayed update after a live one at %d", i)
		}
	}
	if live := len(b.updatesIn("live")); live < 3 {
		t.Errorf("load: %d live updates after the replay, want at least 3 (the turn kept running)", live)
	}
	// s1, s2, … once each, in order, across the replay and the live part.
	texts := chunkTexts(b.Updates)
	for i, tx := range texts {
		if want := "s" + strconv.Itoa(i+1) + " "; tx != want {
			t.Fatalf("load: chunk %d is %q, want %q: a gap or a repeat\n%q", i, tx, want, texts)
		}
	}
	for _, u := range a.Updates {
		if got, want := seqOf(t, b.Updates, u.Update.short()), *u.Seq; got != want {
			t.Errorf("%s: seq %d on load, %d when first delivered", u.Update.short(), got, want)
		}
	}

	// A turn that completes with no client: stored whole.
	a2 := h.run(t, "prompt", "--session", key, "--text", "chunks 4 delay 20", "--drop-after", "1")
	if !a2.Dropped {
		t.Fatalf("second drop: %.1000s", a2.raw)
	}
	if st := waitIdle(t, nv, key); st != "" && st != "complete" {
		t.Errorf("the turn nobody watched ended %q, want complete", st)
	}
	b2 := h.run(t, "load", "--session", key)
	wantBound(t, b2)
	checkSeqs(t, "second load", b2.Updates)
	all := shortsSeen(b2.Updates)
	wantTail := []string{"user_message_chunk:chunks 4 delay 20", "agent_message_chunk:c1 ", "agent_message_chunk:c2 ", "agent_message_chunk:c3 ", "agent_message_chunk:c4 "}
	if len(all) < len(wantTail) || !slices.Equal(all[len(all)-len(wantTail):], wantTail) {
		t.Errorf("second load: history ends %q, want %q", all, wantTail)
	}
	if first := shortsSeen(b.Updates); len(all) < len(first) || !slices.Equal(all[:len(first)], first) {
		t.Errorf("second load: history %q does not start with what the first load saw %q", all, first)
	}
	var users []string
	for _, u := range b2.Updates {
		if u.Update.SessionUpdate == "user_message_chunk" {
			users = append(users, u.Update.text())
		}
	}
	if !slices.Equal(users, []string{"slow 50", "chunks 4 delay 20"}) {
		t.Errorf("second load: prompts %q, want each once", users)
	}
}

// TestACPResumeAfter: session/resume with _meta["tether/after"] N sends
// exactly the updates with seq > N, then live ones; without it, none; with
// 0, everything. Also in the middle of a running turn.
func TestACPResumeAfter(t *testing.T) {
	h := startACPHost(t, acpHostConfig{})
	a := h.run(t, "prompt", "--text", "chunks 6")
	wantPrompt(t, a, "end_turn")
	key := a.SessionID
	n := seqOf(t, a.Updates, "agent_message_chunk:c3 ")

	t.Run("after N", func(t *testing.T) {
		r := h.run(t, "resume", "--session", key, "--after", strconv.FormatInt(n, 10), "--text", "chunks 1")
		wantBound(t, r)
		wantPrompt(t, r, "end_turn")
		want := []string{"agent_message_chunk:c4 ", "agent_message_chunk:c5 ", "agent_message_chunk:c6 ", "agent_message_chunk:c1 "}
		if got := shortsSeen(r.Updates); !slices.Equal(got, want) {
			t.Errorf("resume after %d, then a prompt: got %q, want %q", n, got, want)
		}
		checkSeqs(t, "resume", r.Updates)
		for _, u := range r.Updates[:min(3, len(r.Updates))] {
			if got, want := *u.Seq, seqOf(t, a.Updates, u.Update.short()); got != want {
				t.Errorf("%s: seq %d on resume, %d when delivered", u.Update.short(), got, want)
			}
		}
	})
	t.Run("without after", func(t *testing.T) {
		r := h.run(t, "resume", "--session", key, "--text", "chunks 1")
		wantBound(t, r)
		wantPrompt(t, r, "end_turn")
		if got := shortsSeen(r.Updates); !slices.Equal(got, []string{"agent_message_chunk:c1 "}) {
			t.Errorf("resume without tether/after, then a prompt: got %q, want only the new turn's c1", got)
		}
	})
	t.Run("after 0", func(t *testing.T) {
		l := h.run(t, "load", "--session", key)
		wantBound(t, l)
		r := h.run(t, "resume", "--session", key, "--after", "0", "--updates", strconv.Itoa(len(l.Updates)))
		wantBound(t, r)
		if got, want := shortsSeen(r.Updates), shortsSeen(l.Updates); !slices.Equal(got, want) {
			t.Errorf("resume after 0: got %q, want the whole history as load gives it %q", got, want)
		}
	})
	t.Run("mid-turn", func(t *testing.T) {
		d := h.run(t, "prompt", "--session", key, "--text", "slow 50", "--drop-after", "2")
		if !d.Dropped || len(d.updatesIn("live")) != 2 {
			t.Fatalf("drop: %.1000s", d.raw)
		}
		last := d.updatesIn("live")[1]
		after := seqOf(t, d.Updates, last.short())
		r := h.run(t, "resume", "--session", key, "--after", strconv.FormatInt(after, 10), "--updates", "3", "--send-cancel")
		wantBound(t, r)
		checkSeqs(t, "resume mid-turn", r.Updates)
		if got := chunkTexts(r.Updates); len(got) < 3 || !slices.Equal(got[:3], []string{"s3 ", "s4 ", "s5 "}) {
			t.Errorf("resume after s2's seq %d: got %q, want s3 s4 s5 first (none missing, none twice)", after, got)
		}
	})
}

// TestACPTwoClients: two /acp clients on one session see the same updates
// with the same seqs; the prompt reaches the other client live as a
// user_message_chunk, and not the client that sent it.
func TestACPTwoClients(t *testing.T) {
	h := startACPHost(t, acpHostConfig{})
	key := h.run(t, "new").SessionID
	b := h.start(t, "load", "--session", key, "--until-text", "c4 ")
	b.waitPhase(t, "bound", nil)
	a := h.run(t, "prompt", "--session", key, "--text", "chunks 4")
	wantPrompt(t, a, "end_turn")
	br := b.result(t)
	chunks := []string{"agent_message_chunk:c1 ", "agent_message_chunk:c2 ", "agent_message_chunk:c3 ", "agent_message_chunk:c4 "}
	if got := shorts(a.updatesIn("live")); !slices.Equal(got, chunks) {
		t.Errorf("prompting client: got %q, want %q", got, chunks)
	}
	if got, want := shorts(br.updatesIn("live")), append([]string{"user_message_chunk:chunks 4"}, chunks...); !slices.Equal(got, want) {
		t.Errorf("other client: got %q, want %q", got, want)
	}
	checkSeqs(t, "other client", br.Updates)
	for _, c := range chunks {
		if sa, sb := seqOf(t, a.Updates, c), seqOf(t, br.Updates, c); sa != sb {
			t.Errorf("%s: seq %d at the prompting client, %d at the other", c, sa, sb)
		}
	}
	if seqOf(t, br.Updates, "user_message_chunk:chunks 4") >= seqOf(t, br.Updates, chunks[0]) {
		t.Error("the prompt's user_message_chunk is not before the answer")
	}
}

// permissionEvent is the payload of permission.request / permission.resolved.
type permissionEvent struct {
	RequestID json.RawMessage `json:"request_id"`
	ToolCall  json.RawMessage `json:"tool_call"`
	Options   json.RawMessage `json:"options"`
	OptionID  *string         `json:"option_id"`
	By        string          `json:"by"`
}

func waitPermissionEvent(tb testing.TB, c *wsclient.Client, typ string) (permissionEvent, wsclient.Event) {
	tb.Helper()
	ev, err := c.WaitEvent(ctxT(tb, acpClientWait), func(e wsclient.Event) bool { return e.Type == typ })
	if err != nil {
		tb.Fatalf("waiting for %s: %v", typ, err)
	}
	var p permissionEvent
	if err := ev.Decode(&p); err != nil {
		tb.Fatalf("%s payload %s: %v", typ, ev.Payload, err)
	}
	return p, ev
}

// checkOneAnswer checks in the agent log that the agent sent one
// permission request and got exactly one answer, selecting option.
func checkOneAnswer(tb testing.TB, log []agentLogEntry, option string) {
	tb.Helper()
	reqs := sentRequests(log, "session/request_permission")
	if len(reqs) != 1 {
		tb.Fatalf("agent log: %d session/request_permission sent, want 1", len(reqs))
	}
	answers := responsesTo(log, reqs[0].ID)
	if len(answers) != 1 {
		tb.Fatalf("agent log: %d answers to the permission request reached the agent, want exactly 1: %+v", len(answers), answers)
	}
	want := fmt.Sprintf(`{"outcome":{"outcome":"selected","optionId":%q}}`, option)
	if !jsonEqual(answers[0].Result, want) {
		tb.Errorf("agent log: the answer was %s (error %s), want %s", answers[0].Result, answers[0].Error, want)
	}
}

// TestACPPermissionFirstWins: a permission request goes to both /acp
// clients and to native viewers; the first answer wins and is the only one
// that reaches the agent; the other client's request is withdrawn with
// $/cancel_request for the id it saw, and its late answer is dropped;
// native viewers see permission.request and permission.resolved, and a
// late permission.respond gets 4090.
func TestACPPermissionFirstWins(t *testing.T) {
	h := startACPHost(t, acpHostConfig{})
	key := h.run(t, "new").SessionID
	nv := h.Dial(t)
	_, sid := nativeResume(t, nv, key)

	b := h.start(t, "permission", "--session", key, "--after-cancel", "answer:deny", "--wait-cancel-request", "--until-text", "chose:")
	b.waitPhase(t, "bound", nil)
	a := h.run(t, "permission", "--session", key, "--text", "permission", "--permission", "allow")
	br := b.result(t)

	checkFirstWins(t, a, br, "winner", "loser")

	pr, _ := waitPermissionEvent(t, nv, "permission.request")
	if len(pr.RequestID) == 0 || !strings.Contains(string(pr.Options), `"allow"`) || !strings.Contains(string(pr.ToolCall), "tool-") {
		t.Errorf("permission.request: got %+v, want request_id, tool_call, options", pr)
	}
	res, _ := waitPermissionEvent(t, nv, "permission.resolved")
	if string(res.RequestID) != string(pr.RequestID) || res.OptionID == nil || *res.OptionID != "allow" || res.By == "" {
		t.Errorf("permission.resolved: got request %s option %v by %q; want %s, allow, the winner's transport", res.RequestID, res.OptionID, res.By, pr.RequestID)
	}
	err := nv.Call(ctxT(t, 10*time.Second), "permission.respond", map[string]any{"session_id": sid, "request_id": pr.RequestID, "option_id": "deny"}, nil)
	if code := wsclient.ErrorCode(err); code != 4090 {
		t.Errorf("late native permission.respond: got %v (code %d), want 4090", err, code)
	}

	// One more round trip through the agent, so that anything forwarded
	// late would be in its log by now.
	wantPrompt(t, h.run(t, "prompt", "--session", key, "--text", "chunks 1"), "end_turn")
	checkOneAnswer(t, h.log(t), "allow")
}

// TestACPPermissionNativeWins: a permission request open at an /acp client
// is in every snapshot (pending_permissions); a native permission.respond
// wins, the /acp client's request is withdrawn ($/cancel_request) and its
// -32800 answer is dropped; a second answer gets 4090.
func TestACPPermissionNativeWins(t *testing.T) {
	h := startACPHost(t, acpHostConfig{})
	a := h.start(t, "permission", "--text", "permission", "--wait-cancel-request", "--until-text", "chose:")
	key := a.waitPhase(t, "bound", nil).SessionID
	a.waitPhase(t, "permission", nil)

	nv := h.Dial(t)
	raw, sid := nativeResume(t, nv, key)
	var snap struct {
		PendingPermissions []permissionEvent `json:"pending_permissions"`
	}
	if err := json.Unmarshal(raw, &snap); err != nil || len(snap.PendingPermissions) != 1 {
		t.Fatalf("snapshot while the request is open: pending_permissions %s (%v), want one\n%s", raw, err, raw)
	}
	reqID := snap.PendingPermissions[0].RequestID
	call(t, nv, "permission.respond", map[string]any{"session_id": sid, "request_id": reqID, "option_id": "allow"}, nil)

	ar := a.result(t)
	wantPrompt(t, ar, "end_turn")
	if len(ar.PermissionRequests) != 1 || !ar.PermissionRequests[0].CancelRequested || !ar.PermissionRequests[0].AnswerSent {
		t.Errorf("/acp client: %+v, want its request withdrawn and answered (-32800)", ar.PermissionRequests)
	}
	if got := shorts(ar.all()); !slices.Contains(got, "agent_message_chunk:chose:allow") {
		t.Errorf("/acp client: updates %q, want chose:allow", got)
	}
	res, _ := waitPermissionEvent(t, nv, "permission.resolved")
	if string(res.RequestID) != string(reqID) || res.OptionID == nil || *res.OptionID != "allow" || res.By == "" {
		t.Errorf("permission.resolved: %+v, want %s, allow, by the native viewer's transport", res, reqID)
	}
	nv2 := h.Dial(t)
	_, sid2 := nativeResume(t, nv2, key)
	err := nv2.Call(ctxT(t, 10*time.Second), "permission.respond", map[string]any{"session_id": sid2, "request_id": reqID, "option_id": "deny"}, nil)
	if code := wsclient.ErrorCode(err); code != 4090 {
		t.Errorf("second permission.respond: got %v (code %d), want 4090", err, code)
	}
	wantPrompt(t, h.run(t, "prompt", "--session", key, "--text", "chunks 1"), "end_turn")
	checkOneAnswer(t, h.log(t), "allow")
}

// TestACPAgentCrash: the agent dies mid-turn; session/prompt answers 5001
// with data.reason; the host restarts the agent and the next prompt works,
// the session reattached with session/load; a load shows the history once
// (the agent's own replay is not delivered again).
func TestACPAgentCrash(t *testing.T) {
	h := startACPHost(t, acpHostConfig{})
	a := h.run(t, "prompt", "--text", "crash")
	if a.Prompt == nil || !a.Prompt.Error.codeIs(5001) {
		t.Fatalf("prompt of a crashing agent: got %+v, want error 5001\n%.2000s", a.Prompt, a.raw)
	}
	var data struct {
		Reason string `json:"reason"`
	}
	if json.Unmarshal(a.Prompt.Error.Data, &data) != nil || data.Reason == "" {
		t.Errorf("5001 data: %s, want a reason", a.Prompt.Error.Data)
	}
	key := a.SessionID

	b := h.run(t, "prompt", "--session", key, "--text", "chunks 2")
	wantPrompt(t, b, "end_turn")
	if got, want := shorts(b.updatesIn("replay")), []string{"user_message_chunk:crash", "agent_message_chunk:c1 "}; !slices.Equal(got, want) {
		t.Errorf("load after the crash: replay %q, want %q once", got, want)
	}
	if got, want := shorts(b.updatesIn("live")), []string{"agent_message_chunk:c1 ", "agent_message_chunk:c2 "}; !slices.Equal(got, want) {
		t.Errorf("prompt after the crash: %q, want %q", got, want)
	}
	checkSeqs(t, "after the crash", b.Updates)

	log := h.log(t)
	pids := agentStarts(log)
	if len(pids) != 2 {
		t.Fatalf("agent log: %d agent starts, want 2 (a restart after the crash)", len(pids))
	}
	var loadedBySecond, promptBeforeLoad bool
	for _, e := range log {
		if e.PID == pids[1] && e.Dir == "in" && e.Method == "session/load" {
			loadedBySecond = true
		}
		if e.PID == pids[1] && e.Dir == "in" && e.Method == "session/prompt" && !loadedBySecond {
			promptBeforeLoad = true
		}
	}
	if !loadedBySecond || promptBeforeLoad {
		t.Errorf("agent log: restarted agent got session/load %v (a prompt before it: %v); want session/load before the prompt", loadedBySecond, promptBeforeLoad)
	}

	nv := h.Dial(t)
	_, sid := nativeResume(t, nv, key)
	var runs struct {
		Runs []struct{ Status string } `json:"runs"`
	}
	call(t, nv, "session.runs", map[string]any{"session_id": sid}, &runs)
	if len(runs.Runs) != 2 || runs.Runs[0].Status != "failed" || runs.Runs[1].Status != "complete" {
		t.Errorf("session.runs: %+v, want failed then complete", runs.Runs)
	}
}

// TestACPAgentCrashNoLoad: an agent without loadSession gets a new agent
// session after it crashed; the next prompt works and the snapshot says
// agent_context "reset".
func TestACPAgentCrashNoLoad(t *testing.T) {
	h := startACPHost(t, acpHostConfig{AgentArgs: []string{"--no-load"}})
	a := h.run(t, "prompt", "--text", "crash")
	if a.Prompt == nil || !a.Prompt.Error.codeIs(5001) {
		t.Fatalf("prompt of a crashing agent: got %+v, want error 5001", a.Prompt)
	}
	b := h.run(t, "prompt", "--session", a.SessionID, "--text", "chunks 1")
	wantPrompt(t, b, "end_turn")
	log := h.log(t)
	if n, l := len(received(log, "session/new")), len(received(log, "session/load")); n != 2 || l != 0 {
		t.Errorf("agent log: %d session/new and %d session/load, want 2 and 0", n, l)
	}
	nv := h.Dial(t)
	raw, _ := nativeResume(t, nv, a.SessionID)
	var snap struct {
		AgentContext string `json:"agent_context"`
	}
	if json.Unmarshal(raw, &snap) != nil || snap.AgentContext != "reset" {
		t.Errorf("snapshot: %s, want agent_context \"reset\"", raw)
	}
}

// TestACPHostKill9: the host is killed with SIGKILL mid-turn; after a
// restart on the same state, session/load gives everything that was
// delivered before the kill, with the same seqs, once; the session works
// again (the new agent process loaded it).
func TestACPHostKill9(t *testing.T) {
	state, agentDir := t.TempDir(), t.TempDir()
	h1 := startACPHost(t, acpHostConfig{StateDir: state, AgentDir: agentDir})
	a := h1.start(t, "prompt", "--text", "slow 50")
	a.waitPhase(t, "update", func(p acpPhase) bool { return p.N >= 3 })
	if err := h1.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	h1.Wait(10 * time.Second)
	ar := a.result(t)
	if len(ar.Updates) < 3 {
		t.Fatalf("before the kill: %d updates, want at least 3", len(ar.Updates))
	}
	key := ar.SessionID

	h2 := startACPHost(t, acpHostConfig{StateDir: state, AgentDir: agentDir})
	b := h2.run(t, "load", "--session", key)
	wantBound(t, b)
	checkSeqs(t, "load after the kill", b.Updates)
	if len(b.Updates) == 0 || b.Updates[0].Update.short() != "user_message_chunk:slow 50" {
		t.Fatalf("load after the kill: %q, want the prompt first", shortsSeen(b.Updates))
	}
	texts := chunkTexts(b.Updates)
	delivered := chunkTexts(ar.Updates)
	if len(texts) < len(delivered) || !slices.Equal(texts[:len(delivered)], delivered) {
		t.Errorf("load after the kill: chunks %q, want %q first (everything delivered before the kill)", texts, delivered)
	}
	for i, tx := range texts {
		if want := "s" + strconv.Itoa(i+1) + " "; tx != want {
			t.Errorf("load after the kill: chunk %d %q, want %q (no repeat)", i, tx, want)
		}
	}
	for _, u := range ar.Updates {
		if got := seqOf(t, b.Updates, u.Update.short()); got != *u.Seq {
			t.Errorf("%s: seq %d after the restart, %d before", u.Update.short(), got, *u.Seq)
		}
	}
	c := h2.run(t, "prompt", "--session", key, "--text", "chunks 1")
	wantPrompt(t, c, "end_turn")
	log := readAgentLog(t, h2.AgentLog)
	pids := agentStarts(log)
	loaded := false
	for _, e := range received(log, "session/load") {
		if len(pids) > 0 && e.PID == pids[len(pids)-1] {
			loaded = true
		}
	}
	if len(pids) < 2 || !loaded {
		t.Errorf("agent log: starts %v, session/load by the last one %v; want a new agent that loaded the session", pids, loaded)
	}
}

// TestACPNativeAndACPSameTurn: a native viewer and an /acp client on one
// session see the same turns: acp.update events carry the ACP update
// unchanged with the seq the /acp client sees as tether/seq, text chunks
// are message.delta, the turn ends with message.complete {text, status,
// stop_reason}; a native prompt reaches the /acp client as
// user_message_chunk then the answer.
func TestACPNativeAndACPSameTurn(t *testing.T) {
	h := startACPHost(t, acpHostConfig{})
	nv := h.Dial(t)
	var snap snapshot
	call(t, nv, "session.create", map[string]any{}, &snap)

	a := h.run(t, "prompt", "--session", snap.SessionKey, "--text", "chunks 3")
	wantPrompt(t, a, "end_turn")
	var deltas []string
	acpSeqs := map[string]uint64{}
	for {
		ev, err := nv.NextEvent(ctxT(t, acpClientWait))
		if err != nil {
			t.Fatalf("native events: %v", err)
		}
		switch ev.Type {
		case "message.delta":
			var p struct{ Text string }
			ev.Decode(&p)
			deltas = append(deltas, p.Text)
		case "acp.update":
			var u acpUpdate
			ev.Decode(&u)
			acpSeqs[u.short()] = ev.Seq
		}
		if ev.Type == "message.complete" {
			var p struct {
				Text       string `json:"text"`
				Status     string `json:"status"`
				StopReason string `json:"stop_reason"`
			}
			ev.Decode(&p)
			if p.Text != "c1 c2 c3 " || p.Status != "complete" || p.StopReason != "end_turn" {
				t.Errorf("message.complete: %s, want text \"c1 c2 c3 \", complete, end_turn", ev.Payload)
			}
			break
		}
	}
	if !slices.Equal(deltas, []string{"c1 ", "c2 ", "c3 "}) {
		t.Errorf("native message.delta: %q, want c1 c2 c3", deltas)
	}
	for _, u := range a.Updates {
		if got, ok := acpSeqs[u.Update.short()]; !ok || int64(got) != *u.Seq {
			t.Errorf("%s: native acp.update seq %d (seen %v), /acp tether/seq %d", u.Update.short(), got, ok, *u.Seq)
		}
	}

	b := h.start(t, "load", "--session", snap.SessionKey, "--until-text", "tool done")
	b.waitPhase(t, "bound", nil)
	call(t, nv, "prompt.submit", map[string]any{"session_id": snap.SessionID, "text": "tool"}, nil)
	if _, status := waitComplete(t, nv, snap.SessionID); status != "complete" {
		t.Errorf("native prompt: %s, want complete", status)
	}
	br := b.result(t)
	want := []string{"user_message_chunk:tool", "tool_call:tool-2:pending", "tool_call_update:tool-2:completed", "agent_message_chunk:tool done"}
	if got := shorts(br.updatesIn("live")); !slices.Equal(got, want) {
		t.Errorf("/acp client during a native prompt: %q, want %q", got, want)
	}
	checkSeqs(t, "native prompt at /acp", br.Updates)
}

// TestACPInterrupt: native session.interrupt reaches the agent as
// session/cancel and the /acp prompt answers stopReason cancelled (native:
// message.complete interrupted, stop_reason cancelled); an /acp
// session/cancel does the same.
func TestACPInterrupt(t *testing.T) {
	h := startACPHost(t, acpHostConfig{})
	a := h.start(t, "prompt", "--text", "slow 50")
	key := a.waitPhase(t, "bound", nil).SessionID
	a.waitPhase(t, "update", func(p acpPhase) bool { return p.N >= 2 })
	nv := h.Dial(t)
	_, sid := nativeResume(t, nv, key)
	var res struct{ Status string }
	call(t, nv, "session.interrupt", map[string]any{"session_id": sid}, &res)
	if res.Status != "interrupted" {
		t.Errorf("session.interrupt: %q, want interrupted", res.Status)
	}
	wantPrompt(t, a.result(t), "cancelled")
	ev, err := nv.WaitEvent(ctxT(t, acpClientWait), func(e wsclient.Event) bool { return e.Type == "message.complete" })
	if err != nil {
		t.Fatalf("message.complete: %v", err)
	}
	var p struct {
		Status     string `json:"status"`
		StopReason string `json:"stop_reason"`
	}
	if ev.Decode(&p); p.Status != "interrupted" || p.StopReason != "cancelled" {
		t.Errorf("message.complete: %s, want interrupted, cancelled", ev.Payload)
	}
	if n := len(received(h.log(t), "session/cancel")); n != 1 {
		t.Errorf("agent log: %d session/cancel after session.interrupt, want 1", n)
	}

	c := h.run(t, "cancel", "--session", key, "--cancel-after", "2")
	if !c.CancelSent {
		t.Fatalf("cancel scenario sent no session/cancel: %.1000s", c.raw)
	}
	wantPrompt(t, c, "cancelled")
	if n := len(received(h.log(t), "session/cancel")); n != 2 {
		t.Errorf("agent log: %d session/cancel after the /acp one, want 2", n)
	}
}

// TestACPListAndCwd: session/list reports the stored sessions with the cwd
// each was created with; a cwd in session/load is accepted and changes
// nothing.
func TestACPListAndCwd(t *testing.T) {
	h := startACPHost(t, acpHostConfig{})
	d1, d2 := t.TempDir(), t.TempDir()
	k1 := h.run(t, "new", "--cwd", d1).SessionID
	k2 := h.run(t, "new", "--cwd", d2).SessionID
	wantBound(t, h.run(t, "load", "--session", k1, "--cwd", d2))
	res := h.run(t, "list")
	var l struct {
		Sessions []struct {
			SessionID string `json:"sessionId"`
			Cwd       string `json:"cwd"`
		} `json:"sessions"`
	}
	if res.List == nil || res.List.Error != nil || json.Unmarshal(res.List.Result, &l) != nil {
		t.Fatalf("session/list: %+v", res.List)
	}
	got := map[string]string{}
	for _, s := range l.Sessions {
		got[s.SessionID] = s.Cwd
	}
	if got[k1] != d1 || got[k2] != d2 {
		t.Errorf("session/list: %v, want %s→%s and %s→%s", got, k1, d1, k2, d2)
	}
	if n := len(received(h.log(t), "session/new")); n != 2 {
		t.Errorf("agent log: %d session/new, want 2", n)
	}
}

// TestACPEchoAndExecAgents: sessions of the echo and exec agents are
// reachable through /acp, their deltas as agent_message_chunk updates.
func TestACPEchoAndExecAgents(t *testing.T) {
	t.Run("echo", func(t *testing.T) {
		s := e2e.Start(t, e2e.Config{Args: []string{"--agent", "echo"}})
		a := runACPClient(t, acpURL(s), s.Token, "prompt", "--text", "hello big world")
		wantPrompt(t, a, "end_turn")
		want := []string{"agent_message_chunk:hello ", "agent_message_chunk:big ", "agent_message_chunk:world"}
		if got := shortsSeen(a.Updates); !slices.Equal(got, want) {
			t.Errorf("echo through /acp: %q, want %q", got, want)
		}
		checkSeqs(t, "echo", a.Updates)
		l := runACPClient(t, acpURL(s), s.Token, "load", "--session", a.SessionID)
		wantBound(t, l)
		if got := shorts(l.updatesIn("replay")); !slices.Equal(got, append([]string{"user_message_chunk:hello big world"}, want...)) {
			t.Errorf("echo load: %q", got)
		}
	})
	t.Run("exec", func(t *testing.T) {
		s := e2e.Start(t, e2e.Config{Args: []string{"--agent", "exec", "--agent-command", "cat"}})
		a := runACPClient(t, acpURL(s), s.Token, "prompt", "--text", "hello exec")
		wantPrompt(t, a, "end_turn")
		if got := strings.Join(chunkTexts(a.Updates), ""); !strings.Contains(got, "hello exec") {
			t.Errorf("exec through /acp: chunks %q, want the command's output \"hello exec\"", got)
		}
		checkSeqs(t, "exec", a.Updates)
	})
}
