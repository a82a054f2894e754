package e2e_test

import (
	"encoding/json"
	"slices"
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
