package e2e_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/wsclient"
)

// TestClusterACPAcrossHosts: an ACP client on h2 drives a session live on
// h1, where a native client keeps it: session/load on h2 replays its
// history (relayed to h1, no 5000), a prompt from h2 streams its updates
// and answers, the native viewer on h1 sees the same turn, a cancel from
// h2 stops a turn, and h2's client is relayed (a leg out of h2, into h1).
func TestClusterACPAcrossHosts(t *testing.T) {
	hosts := startCluster3(t, "--echo-delay", "20ms", "--orphan-grace", "0", "--admin-listen", "127.0.0.1:0")
	a := hosts[0].Dial(t)
	var created snapshot
	call(t, a, "session.create", map[string]any{"title": "acp across"}, &created)
	call(t, a, "prompt.submit", map[string]any{"session_id": created.SessionID, "text": "first turn here"}, nil)
	waitComplete(t, a, created.SessionID)

	url := "ws://" + hosts[1].Addr + "/acp"
	res := runACPClient(t, url, hosts[1].Token, "prompt", "--session", created.SessionKey, "--text", "one two three")
	if res.Bind == nil || res.Bind.Error != nil || res.Prompt == nil || res.Prompt.Error != nil || res.Prompt.StopReason != "end_turn" {
		t.Fatalf("load and prompt on h2 of a session live on h1: %s", res.raw)
	}
	replay := shorts(res.updatesIn("replay"))
	if want := []string{"user_message_chunk:first turn here", "agent_message_chunk:first ", "agent_message_chunk:turn ", "agent_message_chunk:here"}; !slices.Equal(replay, want) {
		t.Errorf("load's replay on h2: %q, want the first turn %q", replay, want)
	}
	var live []string
	for _, u := range res.updatesIn("live") {
		if u.SessionUpdate == "agent_message_chunk" {
			live = append(live, u.text())
		}
	}
	if got := strings.Join(live, ""); got != "one two three" {
		t.Errorf("the prompt's streamed answer on h2: %q (%q), want \"one two three\"", got, live)
	}
	checkSeqs(t, "relayed", res.Updates)
	// The native viewer on h1 saw the turn h2 prompted.
	if text, _ := waitComplete(t, a, created.SessionID); text != "one two three" {
		t.Errorf("h1's viewer: message.complete %q, want the turn prompted on h2", text)
	}

	// A cancel from h2 stops a turn running on h1.
	long := strings.Repeat("word ", 200)
	res = runACPClient(t, url, hosts[1].Token, "cancel", "--session", created.SessionKey, "--text", long, "--cancel-after", "2")
	if res.Prompt == nil || res.Prompt.StopReason != "cancelled" {
		t.Fatalf("cancel on h2 of a turn on h1: %s", res.raw)
	}
	if got := hosts[0].Metric(t, "tether_live_sessions"); got != 1 {
		t.Errorf("h1 live sessions: %v, want 1 (the session stayed one, on h1)", got)
	}
	if got := hosts[1].Metric(t, "tether_live_sessions"); got != 0 {
		t.Errorf("h2 live sessions: %v, want 0 (relayed, not rebuilt)", got)
	}
}

// TestClusterACPPermissionFirstWins: the ACP test agent runs on every host
// of a cluster; a session lives on h1 (kept by a native viewer there), and
// ACP clients on h2 and h3 bind it through their hosts. A permission
// request of h1's agent reaches both, under ids of their own connections;
// the first answer (h2's) wins and is the only one to reach the agent,
// the other's request is withdrawn by $/cancel_request for the id it saw,
// and the native viewer on h1 sees permission.resolved by h2's client.
func TestClusterACPPermissionFirstWins(t *testing.T) {
	kit, node := acpKit(t)
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	hosts := startClusterOf(t, 3, clusterSecret(t), func(i int) []string {
		words := []string{node, filepath.Join(kit, "agent.mjs"), "--dir", dirs[i], "--log", filepath.Join(dirs[i], "agent.log")}
		for j, w := range words {
			words[j] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
		}
		return []string{"--agent", "acp", "--agent-command", strings.Join(words, " "), "--agent-cwd", dirs[i]}
	}, "--orphan-grace", "0")
	key := runACPClient(t, acpURL(hosts[0].Server), hosts[0].Token, "new").SessionID
	nv := hosts[0].Dial(t)
	_, sid := nativeResume(t, nv, key)

	b := startACPClient(t, acpURL(hosts[2].Server), hosts[2].Token, "permission", "--session", key, "--after-cancel", "answer:deny", "--wait-cancel-request", "--until-text", "chose:")
	b.waitPhase(t, "bound", nil)
	a := runACPClient(t, acpURL(hosts[1].Server), hosts[1].Token, "permission", "--session", key, "--text", "permission", "--permission", "allow")
	br := b.result(t)

	checkFirstWins(t, a, br, "winner on h2", "loser on h3")
	res, _ := waitPermissionEvent(t, nv, "permission.resolved")
	if res.OptionID == nil || *res.OptionID != "allow" || res.By == "" {
		t.Errorf("permission.resolved on h1: option %v by %q; want allow, by h2's client", res.OptionID, res.By)
	}
	err := nv.Call(ctxT(t, 10*time.Second), "permission.respond", map[string]any{"session_id": sid, "request_id": res.RequestID, "option_id": "deny"}, nil)
	if code := wsclient.ErrorCode(err); code != 4090 {
		t.Errorf("late native permission.respond on h1: got %v (code %d), want 4090", err, code)
	}
	// One more turn through h1's agent, so that anything forwarded late
	// would be in its log by now; the agents of h2 and h3 never saw it.
	wantPrompt(t, runACPClient(t, acpURL(hosts[1].Server), hosts[1].Token, "prompt", "--session", key, "--text", "chunks 1"), "end_turn")
	checkOneAnswer(t, readAgentLog(t, filepath.Join(dirs[0], "agent.log")), "allow")
}
