package e2e_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/tether-agent/tether/testing/e2e"
)

// TestACPStdioBridge: an editor-like SDK client that starts `tether acp`
// as its agent command (testing/acp/stdio.mjs) talks to the host through
// it: initialize, session/new, a streamed prompt with tether/seq on every
// update, and, from a second bridge process, session/load replaying the
// turn. The token travels in TETHER_TOKEN, never on the command line; a
// bridge whose stdin ends closes the socket and exits 0.
func TestACPStdioBridge(t *testing.T) {
	h := startACPHost(t, acpHostConfig{})
	bin := e2e.Build(t)
	raw := runNode(t, []string{"TETHER_TOKEN=" + h.Token}, "stdio.mjs", "chunks 3", bin, "acp", "--url", "http://"+h.Addr)
	var out struct {
		Initialize initResult `json:"initialize"`
		SessionID  string     `json:"sessionId"`
		Prompt     struct {
			StopReason string `json:"stopReason"`
			Updates    []struct {
				Update acpUpdate `json:"update"`
				Seq    *int64    `json:"seq"`
			} `json:"updates"`
		} `json:"prompt"`
		Exit exitStatus `json:"exit"`
		Load struct {
			Updates []struct {
				Update acpUpdate `json:"update"`
			} `json:"updates"`
		} `json:"load"`
		LoadExit exitStatus `json:"loadExit"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("stdio.mjs output: %v\n%s", err, raw)
	}
	if out.Initialize.ProtocolVersion != 1 || !out.Initialize.AgentCapabilities.LoadSession {
		t.Errorf("initialize through the bridge: %+v, want tether's (protocol 1, loadSession)", out.Initialize)
	}
	if !storedKeyRe.MatchString(out.SessionID) {
		t.Errorf("sessionId %q: want a tether stored key", out.SessionID)
	}
	if out.Prompt.StopReason != "end_turn" {
		t.Errorf("prompt stopReason %q, want end_turn", out.Prompt.StopReason)
	}
	var live []string
	for _, u := range out.Prompt.Updates {
		live = append(live, u.Update.short())
		if u.Seq == nil {
			t.Errorf("update %s without tether/seq", u.Update.short())
		}
	}
	want := []string{"agent_message_chunk:c1 ", "agent_message_chunk:c2 ", "agent_message_chunk:c3 "}
	if !slices.Equal(live, want) {
		t.Errorf("prompt updates %q, want %q", live, want)
	}
	var loaded []string
	for _, u := range out.Load.Updates {
		loaded = append(loaded, u.Update.short())
	}
	if wantLoad := append([]string{"user_message_chunk:chunks 3"}, want...); !slices.Equal(loaded, wantLoad) {
		t.Errorf("load replay %q, want %q", loaded, wantLoad)
	}
	for _, ex := range []exitStatus{out.Exit, out.LoadExit} {
		if ex.Code == nil || *ex.Code != 0 {
			t.Errorf("bridge exit %+v after its stdin ended, want code 0", ex)
		}
	}
}

// TestACPBridgeStdinEndsFirst: an editor (or a shell pipe) that writes
// its requests and closes stdin at once still gets every answer: `tether
// acp` keeps the connection until each forwarded request is answered,
// then exits 0. A refused credential is exit 1 with the reason, also
// when stdin ended first or was empty; a credential on the command line
// or in the URL is refused before anything is sent (exit 2), and never
// printed.
func TestACPBridgeStdinEndsFirst(t *testing.T) {
	s := e2e.Start(t, e2e.Config{})
	base := "http://" + s.Addr
	const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}`
	const newSession = `{"jsonrpc":"2.0","id":"two","method":"session/new","params":{"cwd":"/","mcpServers":[]}}`

	out, errOut, code := runCLIEnv(t, []string{"TETHER_TOKEN=" + s.Token}, initialize+"\n"+newSession+"\n", "acp", "--url", base)
	var answers []struct {
		ID     any             `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  json.RawMessage `json:"error"`
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var a struct {
			ID     any             `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  json.RawMessage `json:"error"`
		}
		if line != "" && json.Unmarshal([]byte(line), &a) == nil && a.ID != nil {
			answers = append(answers, a)
		}
	}
	if code != 0 || errOut != "" || len(answers) != 2 || answers[0].ID != float64(1) || answers[1].ID != "two" ||
		len(answers[0].Result) == 0 || !strings.Contains(string(answers[1].Result), "sessionId") {
		t.Errorf("tether acp with stdin closed after two requests: exit %d\nstdout:\n%s\nstderr:\n%s\nwant 0 and both answers (initialize, session/new)", code, out, errOut)
	}

	for _, stdin := range []string{initialize + "\n", ""} {
		out, errOut, code = runCLIEnv(t, []string{"TETHER_TOKEN=wrong"}, stdin, "acp", "--url", base)
		if code != 1 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "4401") {
			t.Errorf("tether acp with a wrong credential, stdin %q: exit %d, stdout %q, stderr %q; want 1, nothing, one line naming 4401", stdin, code, out, errOut)
		}
	}

	for name, args := range map[string][]string{
		"--token":     {"acp", "--url", base, "--token", s.Token},
		"URL ?token=": {"acp", "--url", base + "/?token=" + s.Token},
	} {
		out, errOut, code = runCLIEnv(t, []string{"TETHER_TOKEN=" + s.Token}, initialize+"\n", args...)
		if code != 2 || out != "" || strings.Count(errOut, "\n") != 1 || strings.Contains(errOut, s.Token) || !strings.Contains(errOut, "TETHER_TOKEN") {
			t.Errorf("tether acp with a credential in %s: exit %d, stdout %q, stderr %q; want 2, nothing, one line pointing at TETHER_TOKEN without the token", name, code, out, errOut)
		}
	}
}
