package e2e_test

// End-to-end tests of every error a client can meet (docs/PROTOCOL.md, sections 2, 11, 12 and 15),
// against the real binary: each JSON-RPC error code with the exact code,
// the socket still open after every error response, and each close code of
// the access checks and frame limits. The host must not log at error level
// for any of it.
//
// Not here:
//   - -32603 (internal error) is the code of a host bug, which no client
//     input reaches on a correct host: host/gateway_test.go covers the
//     mapping (TestToRPCError) and fuzzes the gateway for it
//     (FuzzGatewayFrame).
//   - 4408 (non-loopback peer on a loopback listener) cannot be produced
//     from loopback on one machine: host/access_test.go (TestAccessCheck,
//     "non-loopback peer") covers it.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/wsclient"
	"github.com/tether-agent/tether/wire"
)

// errsStep bounds one step (a call, a dial, a close) of these tests.
const errsStep = 10 * time.Second

// errsCtx returns a context for one step.
func errsCtx(tb testing.TB) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), errsStep)
	tb.Cleanup(cancel)
	return ctx
}

// errsAlive checks that c is still open and answers a call: an error
// response never closes the socket (docs/PROTOCOL.md, section 11).
func errsAlive(tb testing.TB, c *wsclient.Client) {
	tb.Helper()
	select {
	case <-c.Closed():
		code, reason := c.CloseCode()
		tb.Fatalf("socket closed with %d %q, want it open", code, reason)
	default:
	}
	var out struct {
		Sessions []json.RawMessage `json:"sessions"`
	}
	if err := c.Call(errsCtx(tb), "session.active_list", nil, &out); err != nil {
		tb.Fatalf("session.active_list after an error: got %v, want a result", err)
	}
}

// errsWantCode calls method with params and checks the error code, then
// that the socket is still open.
func errsWantCode(tb testing.TB, c *wsclient.Client, method string, params any, want int) {
	tb.Helper()
	err := c.Call(errsCtx(tb), method, params, nil)
	if got := wsclient.ErrorCode(err); got != want {
		tb.Errorf("%s %s: got %v (code %d), want code %d", method, errsShow(params), err, got, want)
	}
	errsAlive(tb, c)
}

func errsShow(params any) string {
	if raw, ok := params.(json.RawMessage); ok {
		return string(raw)
	}
	b, _ := json.Marshal(params)
	return string(b)
}

// errsResponse is a JSON-RPC response read with NextRaw.
type errsResponse struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// errsNextResponse reads the next raw frame as a response.
func errsNextResponse(tb testing.TB, c *wsclient.Client) (errsResponse, json.RawMessage) {
	tb.Helper()
	raw, err := c.NextRaw(errsCtx(tb))
	if err != nil {
		tb.Fatalf("waiting for a response: %v", err)
	}
	var r errsResponse
	if err := json.Unmarshal(raw, &r); err != nil {
		tb.Fatalf("response %q: not a JSON object: %v", raw, err)
	}
	return r, raw
}

// errsCreate creates a session on c and returns its runtime id and key.
func errsCreate(tb testing.TB, c *wsclient.Client, params map[string]any) (id, key string) {
	tb.Helper()
	var snap struct {
		SessionID  string `json:"session_id"`
		SessionKey string `json:"session_key"`
	}
	if err := c.Call(errsCtx(tb), "session.create", params, &snap); err != nil {
		tb.Fatalf("session.create: %v", err)
	}
	if snap.SessionID == "" || snap.SessionKey == "" {
		tb.Fatalf("session.create: got session_id %q, session_key %q; want both", snap.SessionID, snap.SessionKey)
	}
	return snap.SessionID, snap.SessionKey
}

// errsNoErrorLogs checks that the host logged nothing at error level (or
// worse): refused input is expected, not an error of the host (docs/PROTOCOL.md, section 15;
// STYLE: expected disconnects are Debug).
func errsNoErrorLogs(tb testing.TB, s *e2e.Server) {
	tb.Helper()
	sc := bufio.NewScanner(strings.NewReader(s.Stderr.String()))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		var line struct {
			Level string `json:"level"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}
		switch line.Level {
		case "error", "fatal", "panic":
			tb.Errorf("host logged at %s level for client input: %s", line.Level, sc.Text())
		}
	}
}

// TestErrorsJSONRPC reaches the protocol-level codes: -32700, -32600,
// -32601 and -32602.
func TestErrorsJSONRPC(t *testing.T) {
	s := e2e.Start(t, e2e.Config{})
	c := s.Dial(t)
	sid, _ := errsCreate(t, c, map[string]any{"title": "jsonrpc errors"})

	// Frames whose response must be read raw: a null id, or an id no
	// Call waits for (the client's own ids count up from 1).
	rawTests := []struct {
		name   string
		frame  string
		wantID string
		code   int
	}{
		{"not JSON", "not json", "null", wire.CodeParseError},
		{"empty frame", "", "null", wire.CodeParseError},
		{"truncated object", `{"jsonrpc":"2.0","id":900001,`, "null", wire.CodeParseError},
		{"two values", `{"jsonrpc":"2.0","id":900002,"method":"session.list"} {}`, "null", wire.CodeParseError},
		{"array [1]", `[1]`, "null", wire.CodeInvalidRequest},
		{"batch", `[{"jsonrpc":"2.0","id":900003,"method":"session.list"}]`, "null", wire.CodeInvalidRequest},
		{"number", `42`, "null", wire.CodeInvalidRequest},
		{"no method", `{"id":900004}`, "900004", wire.CodeInvalidRequest},
		{"method as a number", `{"jsonrpc":"2.0","id":900005,"method":5}`, "900005", wire.CodeInvalidRequest},
		{"method null", `{"jsonrpc":"2.0","id":900006,"method":null}`, "900006", wire.CodeInvalidRequest},
		{"jsonrpc 1.0", `{"jsonrpc":"1.0","id":900007,"method":"session.list"}`, "900007", wire.CodeInvalidRequest},
		{"object id", `{"jsonrpc":"2.0","id":{"a":1},"method":"session.list"}`, "null", wire.CodeInvalidRequest},
		{"string id kept", `{"jsonrpc":"2.0","id":"abc","method":"no.such.method"}`, `"abc"`, wire.CodeMethodNotFound},
	}
	for _, tt := range rawTests {
		t.Run("raw/"+tt.name, func(t *testing.T) {
			if err := c.SendRaw([]byte(tt.frame)); err != nil {
				t.Fatalf("SendRaw: %v", err)
			}
			r, raw := errsNextResponse(t, c)
			if string(r.ID) != tt.wantID {
				t.Errorf("response %s: got id %s, want %s", raw, r.ID, tt.wantID)
			}
			if r.Error == nil || r.Error.Code != tt.code {
				t.Errorf("response %s: want error code %d", raw, tt.code)
			}
			if r.Result != nil {
				t.Errorf("response %s: got a result with the error", raw)
			}
			errsAlive(t, c)
		})
	}

	t.Run("raw/binary frame", func(t *testing.T) {
		if err := c.SendBinary([]byte(`{"jsonrpc":"2.0","id":900010,"method":"session.list"}`)); err != nil {
			t.Fatalf("SendBinary: %v", err)
		}
		r, raw := errsNextResponse(t, c)
		if string(r.ID) != "null" || r.Error == nil || r.Error.Code != wire.CodeInvalidRequest {
			t.Errorf("response %s: want id null and code %d", raw, wire.CodeInvalidRequest)
		}
		errsAlive(t, c)
	})

	t.Run("raw/notification gets no response", func(t *testing.T) {
		if err := c.SendRaw([]byte(`{"jsonrpc":"2.0","method":"no.such.method"}`)); err != nil {
			t.Fatalf("SendRaw: %v", err)
		}
		// Requests are answered in order: once this call has its answer,
		// an answer to the notification would have come already.
		errsAlive(t, c)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if raw, err := c.NextRaw(ctx); err == nil {
			t.Errorf("notification: got %s, want no response", raw)
		}
	})

	callTests := []struct {
		name   string
		method string
		params any
		code   int
	}{
		{"unknown method", "no.such.method", nil, wire.CodeMethodNotFound},
		{"unknown method with params", "session.nope", map[string]any{"session_id": sid}, wire.CodeMethodNotFound},
		{"params an array", "session.list", json.RawMessage(`[1]`), wire.CodeInvalidParams},
		{"params a string", "session.active_list", json.RawMessage(`"x"`), wire.CodeInvalidParams},
		{"params a number", "session.create", json.RawMessage(`7`), wire.CodeInvalidParams},
		{"params checked before the method", "no.such.method", json.RawMessage(`[1]`), wire.CodeInvalidParams},
		{"resume session_id a number", "session.resume", map[string]any{"session_id": 5}, wire.CodeInvalidParams},
		{"activate session_id an object", "session.activate", map[string]any{"session_id": map[string]any{}}, wire.CodeInvalidParams},
		{"close session_id a bool", "session.close", map[string]any{"session_id": true}, wire.CodeInvalidParams},
		{"last_seen a string, unknown session", "session.events.since", map[string]any{"session_id": "deadbeef", "last_seen": "x"}, wire.CodeInvalidParams},
		{"last_seen a numeric string", "session.events.since", map[string]any{"session_id": sid, "last_seen": "5"}, wire.CodeInvalidParams},
		{"last_seen negative", "session.events.since", map[string]any{"session_id": sid, "last_seen": -1}, wire.CodeInvalidParams},
		{"last_seen negative, unknown session", "session.events.since", map[string]any{"session_id": "deadbeef", "last_seen": -1}, wire.CodeInvalidParams},
		{"last_seen a fraction", "session.events.since", map[string]any{"session_id": sid, "last_seen": 1.5}, wire.CodeInvalidParams},
		{"last_seen missing", "session.events.since", map[string]any{"session_id": sid}, wire.CodeInvalidParams},
		{"last_seen above int64", "session.events.since", json.RawMessage(fmt.Sprintf(`{"session_id":%q,"last_seen":9223372036854775808}`, sid)), wire.CodeInvalidParams},
		{"create title a number", "session.create", map[string]any{"title": 5}, wire.CodeInvalidParams},
		{"create close_on_disconnect a string", "session.create", map[string]any{"close_on_disconnect": "yes"}, wire.CodeInvalidParams},
		{"create cols negative", "session.create", map[string]any{"cols": -1}, wire.CodeInvalidParams},
		{"create parent a number", "session.create", map[string]any{"parent_session_id": 1}, wire.CodeInvalidParams},
		{"submit text a number", "prompt.submit", map[string]any{"session_id": sid, "text": 5}, wire.CodeInvalidParams},
		{"submit text missing", "prompt.submit", map[string]any{"session_id": sid}, wire.CodeInvalidParams},
		{"list limit a string", "session.list", map[string]any{"limit": "10"}, wire.CodeInvalidParams},
		{"list limit a fraction", "session.list", map[string]any{"limit": 0.5}, wire.CodeInvalidParams},
		{"resume cols a string", "session.resume", map[string]any{"session_id": "20200101_000000_abcdef", "cols": "80"}, wire.CodeInvalidParams},
	}
	for _, tt := range callTests {
		t.Run("call/"+tt.name, func(t *testing.T) {
			errsWantCode(t, c, tt.method, tt.params, tt.code)
		})
	}

	// The session the errors were about is intact.
	var ev struct {
		LatestSeq *uint64 `json:"latest_seq"`
	}
	if err := c.Call(errsCtx(t), "session.events.since", map[string]any{"session_id": sid, "last_seen": 0}, &ev); err != nil || ev.LatestSeq == nil {
		t.Errorf("session.events.since after the errors: got %v, %v; want a result", ev.LatestSeq, err)
	}
	errsNoErrorLogs(t, s)
}

// TestErrorsDomain reaches the domain codes 4001, 4006, 4007 and 4009.
func TestErrorsDomain(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--echo-delay", "200ms"}})
	c := s.Dial(t)

	t.Run("4001 unknown runtime id", func(t *testing.T) {
		const unknown = "deadbeef"
		tests := []struct {
			method string
			params map[string]any
		}{
			{"session.activate", map[string]any{"session_id": unknown}},
			{"prompt.submit", map[string]any{"session_id": unknown, "text": "hello"}},
			{"session.events.since", map[string]any{"session_id": unknown, "last_seen": 0}},
			{"session.runs", map[string]any{"session_id": unknown}},
			{"session.interrupt", map[string]any{"session_id": unknown}},
			{"session.branch", map[string]any{"session_id": unknown}},
		}
		for _, tt := range tests {
			t.Run(tt.method, func(t *testing.T) {
				errsWantCode(t, c, tt.method, tt.params, wire.CodeUnknownSession)
			})
		}
	})

	t.Run("4006 session_id required", func(t *testing.T) {
		// Every method that takes a session_id, with its other params
		// valid, so that only the session_id is wrong.
		methods := []struct {
			method string
			others map[string]any
		}{
			{"session.branch", nil},
			{"session.resume", map[string]any{"cols": 80}},
			{"session.activate", nil},
			{"session.close", nil},
			{"session.events.since", map[string]any{"last_seen": 0}},
			{"prompt.submit", map[string]any{"text": "hello"}},
			{"session.runs", nil},
			{"session.interrupt", nil},
		}
		for _, m := range methods {
			for _, variant := range []string{"missing", "empty", "null"} {
				t.Run(m.method+"/"+variant, func(t *testing.T) {
					params := map[string]any{}
					for k, v := range m.others {
						params[k] = v
					}
					switch variant {
					case "empty":
						params["session_id"] = ""
					case "null":
						params["session_id"] = nil
					}
					errsWantCode(t, c, m.method, params, wire.CodeSessionRequired)
				})
			}
			if len(m.others) == 0 {
				t.Run(m.method+"/no params", func(t *testing.T) {
					errsWantCode(t, c, m.method, nil, wire.CodeSessionRequired)
				})
			}
		}
	})

	t.Run("4007 stored session not found", func(t *testing.T) {
		tests := []struct {
			name   string
			method string
			params map[string]any
		}{
			{"resume of a well-formed key", "session.resume", map[string]any{"session_id": "20200101_000000_abcdef"}},
			{"resume of an unknown title", "session.resume", map[string]any{"session_id": "no session has this title"}},
			{"branch of a well-formed key", "session.branch", map[string]any{"session_id": "20200101_000000_abcdef"}},
			{"create under a missing parent", "session.create", map[string]any{"parent_session_id": "20200101_000000_abcdef"}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				errsWantCode(t, c, tt.method, tt.params, wire.CodeStoredNotFound)
			})
		}
	})

	t.Run("4009 session busy", func(t *testing.T) {
		sid, _ := errsCreate(t, c, nil)
		// 60 words at 200 ms each: the run streams for 12 s unless
		// interrupted.
		long := strings.Repeat("word ", 60)
		var started struct {
			Status string `json:"status"`
			RunID  string `json:"run_id"`
		}
		if err := c.Call(errsCtx(t), "prompt.submit", map[string]any{"session_id": sid, "text": long}, &started); err != nil {
			t.Fatalf("first prompt.submit: %v", err)
		}
		if started.Status != "streaming" || started.RunID == "" {
			t.Fatalf("first prompt.submit: got %+v, want streaming with a run_id", started)
		}
		errsWantCode(t, c, "prompt.submit", map[string]any{"session_id": sid, "text": "second"}, wire.CodeSessionBusy)
		errsWantCode(t, c, "prompt.submit", map[string]any{"session_id": sid, "text": long}, wire.CodeSessionBusy)

		// The run in flight is unharmed: interrupt it and see it end.
		var intr struct {
			Status string `json:"status"`
		}
		if err := c.Call(errsCtx(t), "session.interrupt", map[string]any{"session_id": sid}, &intr); err != nil || intr.Status != "interrupted" {
			t.Fatalf("session.interrupt: got %+v, %v; want interrupted", intr, err)
		}
		e, err := c.WaitEvent(errsCtx(t), func(e wsclient.Event) bool {
			return e.SessionID == sid && e.Type == "message.complete"
		})
		if err != nil {
			t.Fatalf("waiting for message.complete: %v", err)
		}
		var done struct {
			Status string `json:"status"`
		}
		if err := e.Decode(&done); err != nil || done.Status != "interrupted" {
			t.Errorf("message.complete: got %s, want status interrupted", e.Payload)
		}
		// Idle again: a new prompt is accepted.
		if err := c.Call(errsCtx(t), "prompt.submit", map[string]any{"session_id": sid, "text": "again"}, nil); err != nil {
			t.Errorf("prompt.submit once idle: got %v, want a result", err)
		}
	})

	errsNoErrorLogs(t, s)
}

// TestErrorsBusy floods one socket with requests written back to back: the
// host answers every one, each with a result or -32000 "busy" (at most 256
// wait per socket, docs/PROTOCOL.md, section 15), and the socket stays open.
func TestErrorsBusy(t *testing.T) {
	s := e2e.Start(t, e2e.Config{})
	c := s.Dial(t)
	const n = 1000
	const firstID = 1_000_000
	var batch []byte
	for i := 0; i < n; i++ {
		batch = fmt.Appendf(batch[:0], `{"jsonrpc":"2.0","id":%d,"method":"session.list"}`, firstID+i)
		if err := c.SendRaw(batch); err != nil {
			t.Fatalf("SendRaw request %d: %v", i, err)
		}
	}
	seen := make(map[int64]bool, n)
	busy, results := 0, 0
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(seen) < n {
		raw, err := c.NextRaw(ctx)
		if err != nil {
			t.Fatalf("after %d of %d responses (%d busy): %v", len(seen), n, busy, err)
		}
		var r errsResponse
		var id int64
		if err := json.Unmarshal(raw, &r); err != nil || json.Unmarshal(r.ID, &id) != nil {
			t.Fatalf("response %s: want a response with a numeric id", raw)
		}
		if id < firstID || id >= firstID+n || seen[id] {
			t.Fatalf("response %s: id unknown or answered twice", raw)
		}
		seen[id] = true
		switch {
		case r.Error == nil && r.Result != nil:
			results++
		case r.Error != nil && r.Error.Code == wire.CodeBusy && r.Result == nil:
			busy++
		default:
			t.Errorf("response %s: want a result or error %d", raw, wire.CodeBusy)
		}
	}
	t.Logf("%d requests: %d results, %d busy", n, results, busy)
	if busy == 0 {
		t.Errorf("got no -32000 among %d requests written back to back, want at least one", n)
	}
	if results == 0 {
		t.Errorf("got no result among %d requests, want the queued ones answered", n)
	}
	errsAlive(t, c)
	errsNoErrorLogs(t, s)
}

// TestErrorsAccess reaches the close codes of the access checks (docs/PROTOCOL.md, section 2)
// and checks the ways a client may be admitted.
func TestErrorsAccess(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--allow-origin", "https://ok.example"}})
	_, port, _ := strings.Cut(s.Addr, ":")

	t.Run("healthz", func(t *testing.T) {
		status, body := s.Get(t, "/healthz")
		if status != http.StatusOK || strings.TrimSpace(body) != "ok" {
			t.Errorf("GET /healthz: got %d %q, want 200 ok", status, body)
		}
	})

	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Add(kv[i], kv[i+1])
		}
		return h
	}
	tests := []struct {
		name string
		path string
		opts wsclient.Options
		want int // 0: admitted
	}{
		{name: "query token", path: "/api/ws", opts: wsclient.Options{Token: s.Token}},
		{name: "bearer token", path: "/api/ws", opts: wsclient.Options{Header: hdr("Authorization", "Bearer "+s.Token)}},
		{name: "cookie token", path: "/api/ws", opts: wsclient.Options{Header: hdr("Cookie", "theme=dark; tether_token="+s.Token)}},
		{name: "no token", path: "/api/ws", want: wire.CloseUnauthorized},
		{name: "wrong token", path: "/api/ws", opts: wsclient.Options{Token: "wrong"}, want: wire.CloseUnauthorized},
		{name: "token prefix", path: "/api/ws", opts: wsclient.Options{Token: s.Token[:len(s.Token)-1]}, want: wire.CloseUnauthorized},
		{name: "wrong bearer", path: "/api/ws", opts: wsclient.Options{Header: hdr("Authorization", "Bearer wrong")}, want: wire.CloseUnauthorized},
		{name: "wrong cookie", path: "/api/ws", opts: wsclient.Options{Header: hdr("Cookie", "tether_token=wrong")}, want: wire.CloseUnauthorized},
		{name: "basic auth is not a token", path: "/api/ws", opts: wsclient.Options{Header: hdr("Authorization", "Basic "+s.Token)}, want: wire.CloseUnauthorized},
		{name: "wrong token and bad origin", path: "/api/ws", opts: wsclient.Options{Token: "wrong", Origin: "http://evil.example"}, want: wire.CloseUnauthorized},
		{name: "no token and bad host", path: "/api/ws", opts: wsclient.Options{Header: hdr("Host", "evil.example:"+port)}, want: wire.CloseUnauthorized},
		{name: "foreign host", path: "/api/ws", opts: wsclient.Options{Token: s.Token, Header: hdr("Host", "evil.example:"+port)}, want: wire.CloseForbidden},
		{name: "wrong port", path: "/api/ws", opts: wsclient.Options{Token: s.Token, Header: hdr("Host", "127.0.0.1:1")}, want: wire.CloseForbidden},
		{name: "localhost alias", path: "/api/ws", opts: wsclient.Options{Token: s.Token, Header: hdr("Host", "localhost:"+port)}},
		{name: "foreign origin", path: "/api/ws", opts: wsclient.Options{Token: s.Token, Origin: "http://evil.example"}, want: wire.CloseForbidden},
		{name: "origin null", path: "/api/ws", opts: wsclient.Options{Token: s.Token, Origin: "null"}, want: wire.CloseForbidden},
		{name: "origin with another port", path: "/api/ws", opts: wsclient.Options{Token: s.Token, Origin: "http://127.0.0.1:1"}, want: wire.CloseForbidden},
		{name: "same origin", path: "/api/ws", opts: wsclient.Options{Token: s.Token, Origin: "http://" + s.Addr}},
		{name: "allowed origin", path: "/api/ws", opts: wsclient.Options{Token: s.Token, Origin: "https://ok.example"}},
		{name: "allowed origin over http is another origin", path: "/api/ws", opts: wsclient.Options{Token: s.Token, Origin: "http://ok.example"}, want: wire.CloseForbidden},
		// The access checks come first on the PTY endpoint too.
		{name: "pty endpoint without token", path: "/api/pty", want: wire.CloseUnauthorized},
		{name: "pty endpoint with a malformed attach", path: "/api/pty?attach=short", opts: wsclient.Options{Token: s.Token}, want: wire.CloseBadRequest},
		{name: "pty endpoint with foreign origin", path: "/api/pty", opts: wsclient.Options{Token: s.Token, Origin: "http://evil.example"}, want: wire.CloseForbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := errsCtx(t)
			c, err := s.DialRaw(ctx, tt.path, tt.opts)
			if err != nil {
				t.Fatalf("DialRaw %s: %v", tt.path, err)
			}
			defer c.Close()
			if tt.want == 0 {
				e, err := c.NextEvent(ctx)
				if err != nil || e.Type != "gateway.ready" {
					code, reason := c.CloseCode()
					t.Fatalf("admitted socket: got %+v, %v (close %d %q), want gateway.ready", e, err, code, reason)
				}
				errsAlive(t, c)
				return
			}
			select {
			case <-c.Closed():
			case <-ctx.Done():
				t.Fatalf("socket not closed within %v, want close %d", errsStep, tt.want)
			}
			if code, reason := c.CloseCode(); code != tt.want {
				t.Errorf("close: got %d %q, want %d", code, reason, tt.want)
			}
			// A refused socket gets no frame before its close.
			if e, err := c.NextEvent(ctx); err == nil {
				t.Errorf("refused socket: got event %s, want none", e.Raw)
			}
		})
	}

	// Refusals leave the host serving.
	errsAlive(t, s.Dial(t))
	errsNoErrorLogs(t, s)
}

// TestErrorsFrameLimits reaches the close codes of the frame limits
// (docs/PROTOCOL.md, section 15): 1009 for a frame over 1 MiB, 1007 for invalid UTF-8 in a text frame;
// a frame of exactly 1 MiB is served.
func TestErrorsFrameLimits(t *testing.T) {
	s := e2e.Start(t, e2e.Config{})

	// request returns a session.active_list request of exactly size bytes.
	request := func(id, size int) []byte {
		head := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"session.active_list","params":{"pad":"`, id)
		const tail = `"}}`
		return []byte(head + strings.Repeat("x", size-len(head)-len(tail)) + tail)
	}

	t.Run("1 MiB is served", func(t *testing.T) {
		c := s.Dial(t)
		if err := c.SendRaw(request(800001, 1<<20)); err != nil {
			t.Fatalf("SendRaw: %v", err)
		}
		r, raw := errsNextResponse(t, c)
		if string(r.ID) != "800001" || r.Error != nil || r.Result == nil {
			t.Errorf("response %.200s: want a result for id 800001", raw)
		}
		errsAlive(t, c)
	})

	tests := []struct {
		name  string
		frame []byte
		want  int
	}{
		{"1 MiB + 1", request(800002, 1<<20+1), wire.CloseTooBig},
		{"invalid UTF-8", []byte("\xff\xfe"), wire.CloseInvalidPayload},
		{"invalid UTF-8 in a request", []byte(`{"jsonrpc":"2.0","id":800003,"method":"session.list","params":{"title":"` + "\xc3\x28" + `"}}`), wire.CloseInvalidPayload},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := s.Dial(t)
			// The host may close while the frame is still being written;
			// the close code is what counts.
			_ = c.SendRaw(tt.frame)
			ctx := errsCtx(t)
			select {
			case <-c.Closed():
			case <-ctx.Done():
				t.Fatalf("socket not closed within %v, want close %d", errsStep, tt.want)
			}
			if code, reason := c.CloseCode(); code != tt.want {
				t.Errorf("close: got %d %q, want %d", code, reason, tt.want)
			}
			// No response to the refused frame was sent before the close.
			if raw, err := c.NextRaw(ctx); err == nil {
				t.Errorf("got %.200s before the close, want nothing", raw)
			}
		})
	}

	// The host keeps serving other sockets.
	errsAlive(t, s.Dial(t))
	errsNoErrorLogs(t, s)
}

// TestErrorsAgentBuild reaches 5000: a host whose agent command does not
// exist answers session.create, session.resume and session.branch with 5000
// and keeps serving; nothing already stored is lost.
func TestErrorsAgentBuild(t *testing.T) {
	// A first host, with the echo agent, stores a session.
	first := e2e.Start(t, e2e.Config{})
	c := first.Dial(t)
	sid, key := errsCreate(t, c, map[string]any{"title": "stored before"})
	if err := c.Call(errsCtx(t), "session.close", map[string]any{"session_id": sid}, nil); err != nil {
		t.Fatalf("session.close: %v", err)
	}
	c.Close()
	if err := first.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	if code, err := first.Wait(5 * time.Second); err != nil || code != 0 {
		t.Fatalf("first host: got exit %d, %v; want 0", code, err)
	}
	errsNoErrorLogs(t, first)

	// The same state under a host whose agent cannot be built.
	s := e2e.Start(t, e2e.Config{
		StateDir: first.StateDir,
		Args:     []string{"--agent", "exec", "--agent-command", "/nonexistent/agent-binary"},
	})
	c = s.Dial(t)
	tests := []struct {
		name   string
		method string
		params map[string]any
		code   int
	}{
		{"create", "session.create", nil, wire.CodeResumeFailed},
		{"create with a title", "session.create", map[string]any{"title": "new"}, wire.CodeResumeFailed},
		{"resume by key", "session.resume", map[string]any{"session_id": key}, wire.CodeResumeFailed},
		{"resume by title", "session.resume", map[string]any{"session_id": "stored before"}, wire.CodeResumeFailed},
		{"branch", "session.branch", map[string]any{"session_id": key}, wire.CodeResumeFailed},
		// Lookups fail as before: the build is never reached.
		{"resume of a missing key", "session.resume", map[string]any{"session_id": "20200101_000000_abcdef"}, wire.CodeStoredNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errsWantCode(t, c, tt.method, tt.params, tt.code)
		})
	}

	// The host still serves, and what was stored is still there.
	var list struct {
		Sessions []struct {
			ID    string `json:"id"`
			Title string `json:"title"`
		} `json:"sessions"`
	}
	if err := c.Call(errsCtx(t), "session.list", nil, &list); err != nil {
		t.Fatalf("session.list: %v", err)
	}
	found := false
	for _, st := range list.Sessions {
		found = found || st.ID == key && st.Title == "stored before"
	}
	if !found || len(list.Sessions) != 1 {
		t.Errorf("session.list: got %+v, want only %s (stored before): a failed create stores nothing", list.Sessions, key)
	}
	var active struct {
		Sessions []json.RawMessage `json:"sessions"`
	}
	if err := c.Call(errsCtx(t), "session.active_list", nil, &active); err != nil || len(active.Sessions) != 0 {
		t.Errorf("session.active_list: got %d sessions, %v; want none live", len(active.Sessions), err)
	}
	errsAlive(t, s.Dial(t))
	errsNoErrorLogs(t, s)
}

// TestErrorsPTYSwitchedOff: with an empty --pty-command the PTY endpoint is
// switched off: 4404 after the access checks.
func TestErrorsPTYSwitchedOff(t *testing.T) {
	s := e2e.Start(t, e2e.Config{Args: []string{"--pty-command", ""}})
	for _, tt := range []struct {
		path string
		opts wsclient.Options
		want int
	}{
		{"/api/pty", wsclient.Options{Token: s.Token}, wire.CloseNotFound},
		{"/api/pty?attach=abcdefghijklmnop", wsclient.Options{Token: s.Token}, wire.CloseNotFound},
		{"/api/pty", wsclient.Options{}, wire.CloseUnauthorized},
	} {
		c, err := s.DialRaw(errsCtx(t), tt.path, tt.opts)
		if err != nil {
			t.Fatalf("DialRaw %s: %v", tt.path, err)
		}
		<-c.Closed()
		if code, reason := c.CloseCode(); code != tt.want {
			t.Errorf("%s: close %d %q, want %d", tt.path, code, reason, tt.want)
		}
		c.Close()
	}
	s.Dial(t) // the gateway still serves
}
