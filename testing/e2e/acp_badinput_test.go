package e2e_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	gobws "github.com/gobwas/ws"
)

// acpRaw is a raw WebSocket connection to /acp for input no SDK sends.
type acpRaw struct {
	*badWSConn
	tb testing.TB
}

// dialACPRaw connects to /acp (token in the query) with no ACP client.
func dialACPRaw(tb testing.TB, h acpHost) *acpRaw {
	tb.Helper()
	return &acpRaw{badWSConn: badDialWS(tb, h.Server, "/acp"), tb: tb}
}

// send writes one text frame.
func (c *acpRaw) send(p string) {
	c.tb.Helper()
	c.write(gobws.NewTextFrame([]byte(p)))()
}

// acpRawMsg is a JSON-RPC message read raw.
type acpRawMsg struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *rpcErr         `json:"error"`
}

// response reads messages until a response (a message with no method)
// and returns it with the notifications before it.
func (c *acpRaw) response() (acpRawMsg, []acpRawMsg) {
	c.tb.Helper()
	var notes []acpRawMsg
	_ = c.nc.SetReadDeadline(time.Now().Add(errsStep))
	for {
		f, err := badReadFrame(c.r)
		if err != nil {
			c.tb.Fatalf("/acp: reading a response: %v", err)
		}
		switch f.Header.OpCode {
		case gobws.OpClose:
			c.tb.Fatalf("/acp: the server closed the socket (%x) instead of answering", f.Payload)
		case gobws.OpText:
			var m acpRawMsg
			if err := json.Unmarshal(f.Payload, &m); err != nil {
				c.tb.Fatalf("/acp: frame %.200q is not JSON-RPC: %v", f.Payload, err)
			}
			if m.Method == "" {
				return m, notes
			}
			notes = append(notes, m)
		}
	}
}

// call sends a request with id and returns its response and the
// notifications before it.
func (c *acpRaw) call(id int, method string, params any) (acpRawMsg, []acpRawMsg) {
	c.tb.Helper()
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	c.send(string(b))
	r, notes := c.response()
	if string(r.ID) != fmt.Sprint(id) {
		c.tb.Fatalf("/acp: response id %s to request %d", r.ID, id)
	}
	return r, notes
}

var acpInitParams = map[string]any{
	"protocolVersion":    1,
	"clientCapabilities": map[string]any{"fs": map[string]any{"readTextFile": false, "writeTextFile": false}, "terminal": false},
}

// TestACPBadInput: malformed JSON-RPC, unknown methods, wrong params, a
// prompt or a load of an unknown session are answered with JSON-RPC errors
// and the socket and the agent keep working; a frame over 17 MiB closes the
// socket with 1009 and the next connection works.
func TestACPBadInput(t *testing.T) {
	h := startACPHost(t, acpHostConfig{})
	c := dialACPRaw(t, h)
	if r, _ := c.call(1, "initialize", acpInitParams); r.Error != nil || !bytes.Contains(r.Result, []byte(`"protocolVersion":1`)) {
		t.Fatalf("initialize: %+v %s", r.Error, r.Result)
	}
	const unknownKey = "20990101_000000_abcdef"
	cases := []struct {
		name   string
		frame  string
		id     string // the response's id; "null" for one the server cannot know
		code   int    // 0: any error
		anyIDs bool   // id may be the request's or null
	}{
		{"not JSON", `{"jsonrpc":"2.0","id":2,`, "null", -32700, false},
		{"batch", `[{"jsonrpc":"2.0","id":3,"method":"session/list","params":{}}]`, "null", -32600, false},
		{"method not a string", `{"jsonrpc":"2.0","id":4,"method":5}`, "4", -32600, true},
		{"unknown method", `{"jsonrpc":"2.0","id":5,"method":"session/nope","params":{}}`, "5", -32601, false},
		{"params not an object", `{"jsonrpc":"2.0","id":6,"method":"session/new","params":"x"}`, "6", -32602, false},
		{"sessionId of the wrong type", `{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"sessionId":5,"prompt":[{"type":"text","text":"hi"}]}}`, "7", -32602, false},
		{"prompt not a list", `{"jsonrpc":"2.0","id":8,"method":"session/prompt","params":{"sessionId":"` + unknownKey + `","prompt":"hi"}}`, "8", -32602, false},
		{"prompt on an unknown session", `{"jsonrpc":"2.0","id":9,"method":"session/prompt","params":{"sessionId":"` + unknownKey + `","prompt":[{"type":"text","text":"hi"}]}}`, "9", 0, false},
		{"load of an unknown session", `{"jsonrpc":"2.0","id":10,"method":"session/load","params":{"sessionId":"` + unknownKey + `","cwd":"/","mcpServers":[]}}`, "10", 0, false},
		{"resume of an unknown session", `{"jsonrpc":"2.0","id":11,"method":"session/resume","params":{"sessionId":"` + unknownKey + `","cwd":"/"}}`, "11", 0, false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c.tb = t
			c.send(tc.frame)
			r, _ := c.response()
			idOK := string(r.ID) == tc.id || (tc.anyIDs && string(r.ID) == "null")
			if r.Error == nil || !idOK || (tc.code != 0 && !r.Error.codeIs(tc.code)) {
				t.Errorf("%.80s: got id %s error %+v result %s; want id %s and error %d", tc.frame, r.ID, r.Error, r.Result, tc.id, tc.code)
			}
			if r, _ := c.call(100+i, "session/list", map[string]any{}); r.Error != nil {
				t.Errorf("session/list after it: %+v, want the socket to keep working", r.Error)
			}
		})
	}
	c.tb = t

	// The agent keeps working, on the same socket, unrestarted.
	nw, _ := c.call(200, "session/new", map[string]any{"cwd": h.AgentDir, "mcpServers": []any{}})
	var sess struct {
		SessionID string `json:"sessionId"`
	}
	if nw.Error != nil || json.Unmarshal(nw.Result, &sess) != nil || sess.SessionID == "" {
		t.Fatalf("session/new after bad input: %+v %s", nw.Error, nw.Result)
	}
	pr, notes := c.call(201, "session/prompt", map[string]any{"sessionId": sess.SessionID, "prompt": []any{map[string]any{"type": "text", "text": "still here"}}})
	if pr.Error != nil || !bytes.Contains(pr.Result, []byte(`"end_turn"`)) {
		t.Errorf("prompt after bad input: %+v %s", pr.Error, pr.Result)
	}
	var chunk bool
	for _, n := range notes {
		if n.Method == "session/update" && bytes.Contains(n.Params, []byte(`"still here"`)) && bytes.Contains(n.Params, []byte(`"tether/seq"`)) {
			chunk = true
		}
	}
	if !chunk {
		t.Errorf("prompt after bad input: notifications %+v, want the echo chunk with tether/seq", notes)
	}
	if starts := agentStarts(h.log(t)); len(starts) != 1 {
		t.Errorf("agent starts: %v, want one (bad input never restarts the agent)", starts)
	}

	// Over 17 MiB (/acp's bound, a prompt's 16 MiB of blocks and the
	// JSON around them): 1009, and the endpoint still serves.
	big := dialACPRaw(t, h)
	pad := strings.Repeat("x", 17<<20)
	wait := big.write(gobws.NewTextFrame([]byte(`{"jsonrpc":"2.0","id":1,"method":"session/list","params":{"pad":"` + pad + `"}}`)))
	code, _ := big.closeCode(t)
	wait()
	if code != 1009 {
		t.Errorf("a frame over 17 MiB: close %d, want 1009", code)
	}
	if res := h.run(t, "initialize"); res.Initialize.Error != nil {
		t.Errorf("initialize after an oversize frame: %+v", res.Initialize.Error)
	}
	if r, _ := c.call(300, "session/list", map[string]any{}); r.Error != nil {
		t.Errorf("the first socket after another's oversize frame: %+v", r.Error)
	}
}
