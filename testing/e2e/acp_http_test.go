package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-agent/tether/testing/e2e"
	"github.com/tether-agent/tether/testing/wsclient"
)

// The tests of /acp over Streamable HTTP (docs/PROTOCOL.md, "ACP over
// Streamable HTTP"): the official SDK's createHttpStream client
// (testing/acp/client.mjs with an http:// URL), and a Go client where a
// test needs what the SDK does not do (drop a stream, Last-Event-ID).

func acpHTTPURL(s *e2e.Server) string { return "http://" + s.Addr + "/acp" }

// httpTrace is what client.mjs records of the SDK's requests over HTTP.
type httpTrace struct {
	HTTP []struct {
		Method  string `json:"method"`
		Session string `json:"session"`
		Accept  string `json:"accept"`
		Status  int    `json:"status"`
		Error   string `json:"error"`
	} `json:"http"`
}

func traceOf(tb testing.TB, r acpResult) httpTrace {
	tb.Helper()
	var tr httpTrace
	if err := json.Unmarshal(r.raw, &tr); err != nil {
		tb.Fatalf("the client's result: %v", err)
	}
	return tr
}

// TestACPHTTPSDK: the official SDK's Streamable HTTP client uses tether as
// its agent: initialize, session/new, a prompt with streamed updates (each
// with its tether seq), then session/load on a second connection with the
// whole history before the response; the statuses are the RFD's.
func TestACPHTTPSDK(t *testing.T) {
	h := startACPHost(t, acpHostConfig{})
	res := runACPClient(t, acpHTTPURL(h.Server), h.Token, "prompt", "--text", "chunks 5 delay 10")
	wantBound(t, res)
	wantPrompt(t, res, "end_turn")
	want := []string{"agent_message_chunk:c1 ", "agent_message_chunk:c2 ", "agent_message_chunk:c3 ", "agent_message_chunk:c4 ", "agent_message_chunk:c5 "}
	if got := shortsSeen(res.Updates); !slices.Equal(got, want) {
		t.Errorf("updates: got %q, want %q", got, want)
	}
	checkSeqs(t, "prompt over HTTP", res.Updates)
	tr := traceOf(t, res)
	var got []string
	for _, r := range tr.HTTP {
		kind := r.Method
		if r.Method == http.MethodGet && r.Session != "" {
			kind = "GET session"
		}
		got = append(got, kind+" "+strconv.Itoa(r.Status))
	}
	// initialize 200; the connection's stream; session/new 202; the
	// session's stream; the prompt 202; the SDK's DELETE 202.
	for _, w := range []string{"POST 200", "GET 200", "POST 202", "GET session 200", "DELETE 202"} {
		if !slices.Contains(got, w) {
			t.Errorf("the SDK's requests: got %q, want %q among them", got, w)
		}
	}
	if got[0] != "POST 200" {
		t.Errorf("the SDK's first request: got %q, want the initialize POST answered 200", got[0])
	}

	b := runACPClient(t, acpHTTPURL(h.Server), h.Token, "load", "--session", res.SessionID)
	wantBound(t, b)
	checkSeqs(t, "load over HTTP", b.Updates)
	wantAll := append([]string{"user_message_chunk:chunks 5 delay 10"}, want...)
	if got := shortsSeen(b.Updates); !slices.Equal(got, wantAll) {
		t.Errorf("load: got %q, want the whole history %q", got, wantAll)
	}
	if r := b.updatesIn("replay"); len(r) != len(wantAll) {
		t.Errorf("load: %d updates before the response, want all %d", len(r), len(wantAll))
	}
	for _, u := range res.Updates {
		if got, want := seqOf(t, b.Updates, u.Update.short()), *u.Seq; got != want {
			t.Errorf("%s: seq %d on load, %d when first delivered", u.Update.short(), got, want)
		}
	}
	// And the WebSocket client sees the same session.
	ws := h.run(t, "load", "--session", res.SessionID)
	if got := shortsSeen(ws.Updates); !slices.Equal(got, wantAll) {
		t.Errorf("load over WebSocket: got %q, want %q", got, wantAll)
	}
}

// acpHTTP is a Go client of /acp over HTTP.
type acpHTTP struct {
	tb   testing.TB
	url  string
	cred string // the Authorization header
	key  string // Acp-Connection-Id
	cl   *http.Client
}

func newACPHTTP(tb testing.TB, s *e2e.Server, token string) *acpHTTP {
	tr := &http.Transport{}
	tb.Cleanup(tr.CloseIdleConnections)
	return &acpHTTP{tb: tb, url: acpHTTPURL(s), cred: "Bearer " + token, cl: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

// post sends one message (with the session header sid) and returns the
// status and body.
func (c *acpHTTP) post(sid, msg string, hdr ...string) (int, string, http.Header) {
	c.tb.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.url, strings.NewReader(msg))
	req.Header.Set("Content-Type", "application/json")
	if c.cred != "" {
		req.Header.Set("Authorization", c.cred)
	}
	if c.key != "" {
		req.Header.Set("Acp-Connection-Id", c.key)
	}
	if sid != "" {
		req.Header.Set("Acp-Session-Id", sid)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.cl.Do(req)
	if err != nil {
		c.tb.Fatalf("POST /acp: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func (c *acpHTTP) initialize() {
	c.tb.Helper()
	st, body, hdr := c.post("", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}`)
	if st != http.StatusOK || !strings.Contains(body, `"protocolVersion":1`) {
		c.tb.Fatalf("initialize: got %d %q, want 200 and the result", st, body)
	}
	if c.key = hdr.Get("Acp-Connection-Id"); c.key == "" {
		c.tb.Fatal("initialize: no Acp-Connection-Id")
	}
}

// sseEv is one SSE event.
type sseEv struct {
	ID   string
	Data string
}

// stream is an open SSE stream; its events arrive on evs until it ends.
type stream struct {
	cancel context.CancelFunc
	evs    chan sseEv
	end    chan struct{}
}

// open opens the connection's stream, or sid's, with Last-Event-ID
// lastID when not "". Unbuffered, the stream stops reading its socket
// while the test is not waiting in next.
func (c *acpHTTP) open(sid, lastID string, unbuffered ...bool) *stream {
	c.tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Authorization", c.cred)
	req.Header.Set("Acp-Connection-Id", c.key)
	if sid != "" {
		req.Header.Set("Acp-Session-Id", sid)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	cl := &http.Client{Transport: c.cl.Transport}
	resp, err := cl.Do(req)
	if err != nil {
		cancel()
		c.tb.Fatalf("GET /acp: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel()
		c.tb.Fatalf("GET /acp: got %d, want 200", resp.StatusCode)
	}
	n := 1000
	if len(unbuffered) > 0 && unbuffered[0] {
		n = 0
	}
	s := &stream{cancel: cancel, evs: make(chan sseEv, n), end: make(chan struct{})}
	go func() {
		defer close(s.end)
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		var ev sseEv
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimRight(line, "\n")
			switch {
			case line == "":
				if ev.Data != "" {
					select {
					case s.evs <- ev:
					case <-ctx.Done():
						return
					}
				}
				ev = sseEv{}
			case strings.HasPrefix(line, "id: "):
				ev.ID = line[4:]
			case strings.HasPrefix(line, "data: "):
				ev.Data += line[6:]
			}
		}
	}()
	c.tb.Cleanup(s.drop)
	return s
}

// drop ends the stream from the client's side.
func (s *stream) drop() {
	s.cancel()
	<-s.end
}

// next returns the next event, failing after 30 s or at the stream's end.
func (s *stream) next(tb testing.TB) sseEv {
	tb.Helper()
	select {
	case ev := <-s.evs:
		return ev
	case <-s.end:
		select {
		case ev := <-s.evs:
			return ev
		default:
		}
		tb.Fatal("the SSE stream ended")
	case <-time.After(30 * time.Second):
		tb.Fatal("no SSE event in 30 s")
	}
	return sseEv{}
}

// ended waits for the stream's end.
func (s *stream) ended(tb testing.TB) {
	tb.Helper()
	select {
	case <-s.end:
	case <-time.After(30 * time.Second):
		tb.Fatal("the SSE stream did not end")
	}
}

// chunkOf returns the text of an agent_message_chunk event ("" for
// anything else).
func chunkOf(ev sseEv) string {
	var m struct {
		Method string `json:"method"`
		Params struct {
			Update struct {
				SessionUpdate string `json:"sessionUpdate"`
				Content       struct {
					Text string `json:"text"`
				} `json:"content"`
			} `json:"update"`
		} `json:"params"`
	}
	if json.Unmarshal([]byte(ev.Data), &m) != nil || m.Params.Update.SessionUpdate != "agent_message_chunk" {
		return ""
	}
	return m.Params.Update.Content.Text
}

// TestACPHTTPLastEventIDResume: a session stream that stops being read
// in the middle of a turn (what tether wrote to it meanwhile sits in
// socket buffers) and is dropped, then opened again with Last-Event-ID:
// N, gets every update after N exactly once, in order — none lost with
// the dropped stream — and the turn's answer.
func TestACPHTTPLastEventIDResume(t *testing.T) {
	h := startACPHost(t, acpHostConfig{})
	c := newACPHTTP(t, h.Server, h.Token)
	c.initialize()
	cs := c.open("", "")
	if st, body, _ := c.post("", fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":%q,"mcpServers":[]}}`, h.AgentDir)); st != http.StatusAccepted {
		t.Fatalf("session/new: got %d %q, want 202", st, body)
	}
	var created struct {
		Result struct {
			SessionID string `json:"sessionId"`
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(cs.next(t).Data), &created); err != nil || created.Result.SessionID == "" {
		t.Fatalf("session/new's answer on the connection stream: %v %+v", err, created)
	}
	sid := created.Result.SessionID
	ss := c.open(sid, "", true)
	prompt := fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":%q,"prompt":[{"type":"text","text":"slow 20"}]}}`, sid)
	if st, _, _ := c.post(sid, prompt); st != http.StatusAccepted {
		t.Fatalf("session/prompt: got %d, want 202", st)
	}
	var texts []string
	var last string
	for len(texts) < 3 {
		ev := ss.next(t)
		if tx := chunkOf(ev); tx != "" {
			texts = append(texts, tx)
			last = ev.ID
		}
	}
	// The stream is not read now: let the turn go on to s8 (as a native
	// viewer sees it), then drop it with what tether wrote to it.
	nv := h.Dial(t)
	_, rid := nativeResume(t, nv, sid)
	if _, err := nv.WaitEvent(ctxT(t, 15*time.Second), func(e wsclient.Event) bool {
		var p struct{ Text string }
		return e.Type == "message.delta" && e.SessionID == rid && e.Decode(&p) == nil && p.Text == "s8 "
	}); err != nil {
		t.Fatalf("waiting for s8: %v", err)
	}
	ss.drop()
	again := c.open(sid, last)
	answered, cancelled := false, false
	for !answered {
		ev := again.next(t)
		if tx := chunkOf(ev); tx != "" {
			texts = append(texts, tx)
			if tx == "s12 " && !cancelled {
				cancelled = true
				if st, _, _ := c.post(sid, fmt.Sprintf(`{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":%q}}`, sid)); st != http.StatusAccepted {
					t.Fatalf("session/cancel: got %d, want 202", st)
				}
			}
			continue
		}
		answered = strings.Contains(ev.Data, `"id":2`) && strings.Contains(ev.Data, "cancelled")
		if strings.Contains(ev.Data, "tether-sse-resume") {
			t.Errorf("the transport's own session/resume answer reached the client: %s", ev.Data)
		}
	}
	for i, tx := range texts {
		if want := "s" + strconv.Itoa(i+1) + " "; tx != want {
			t.Fatalf("chunk %d is %q, want %q: a gap or a repeat across the dropped stream\n%q", i, tx, want, texts)
		}
	}
	if len(texts) < 12 {
		t.Errorf("got %d chunks, want at least 12", len(texts))
	}
}

// TestACPHTTPStatusesE2E: the RFD's error statuses from the real binary,
// a wrong token refused at initialize, a connection id with another
// credential refused, and a revoked credential ending the connection.
func TestACPHTTPStatusesE2E(t *testing.T) {
	h := startACPHost(t, acpHostConfig{})
	bad := newACPHTTP(t, h.Server, "wrong")
	if st, _, _ := bad.post("", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}`); st != http.StatusUnauthorized {
		t.Errorf("initialize with a wrong token: got %d, want 401", st)
	}
	cred := tokenCreate(t, h.Server, "hattie")
	c := newACPHTTP(t, h.Server, cred.Secret)
	c.initialize()
	cs := c.open("", "")
	newReq := `{"jsonrpc":"2.0","id":1,"method":"session/list","params":{}}`
	other := *c
	other.cred = "Bearer " + h.Token // a valid credential, but not this connection's
	for _, tc := range []struct {
		name string
		c    *acpHTTP
		hdr  []string
		body string
		want int
	}{
		{"another credential", &other, nil, newReq, 403},
		{"no connection id", &acpHTTP{tb: t, url: c.url, cred: c.cred, cl: c.cl}, nil, newReq, 400},
		{"an unknown connection id", &acpHTTP{tb: t, url: c.url, cred: c.cred, cl: c.cl, key: "0123456789abcdef0123456789abcdef"}, nil, newReq, 404},
		{"a batch", c, nil, "[" + newReq + "]", 501},
		{"not JSON", c, []string{"Content-Type", "text/plain"}, newReq, 415},
		{"a request", c, nil, newReq, 202},
	} {
		if st, body, _ := tc.c.post("", tc.body, tc.hdr...); st != tc.want {
			t.Errorf("%s: got %d %q, want %d", tc.name, st, body, tc.want)
		}
	}
	if ev := cs.next(t); !strings.Contains(ev.Data, `"sessions"`) {
		t.Errorf("session/list's answer: got %s", ev.Data)
	}
	tokenRevoke(t, h.Server, "hattie")
	cs.ended(t)
	if st, _, _ := c.post("", newReq); st != http.StatusNotFound {
		t.Errorf("a POST after the revocation: got %d, want 404", st)
	}
}

// TestClusterACPOverHTTP: the SDK's HTTP client on h2 of a three-host
// cluster loads and prompts a session live on h1: the HTTP framing is
// relayed like the WebSocket one (one gateway).
func TestClusterACPOverHTTP(t *testing.T) {
	hosts := startCluster3(t, "--echo-delay", "20ms", "--orphan-grace", "0", "--admin-listen", "127.0.0.1:0")
	a := hosts[0].Dial(t)
	var created snapshot
	call(t, a, "session.create", map[string]any{"title": "acp over http across"}, &created)
	call(t, a, "prompt.submit", map[string]any{"session_id": created.SessionID, "text": "first turn here"}, nil)
	waitComplete(t, a, created.SessionID)

	res := runACPClient(t, acpHTTPURL(hosts[1].Server), hosts[1].Token, "prompt", "--session", created.SessionKey, "--text", "one two three")
	if res.Bind == nil || res.Bind.Error != nil || res.Prompt == nil || res.Prompt.Error != nil || res.Prompt.StopReason != "end_turn" {
		t.Fatalf("load and prompt over HTTP on h2 of a session live on h1: %s", res.raw)
	}
	replay := shorts(res.updatesIn("replay"))
	if want := []string{"user_message_chunk:first turn here", "agent_message_chunk:first ", "agent_message_chunk:turn ", "agent_message_chunk:here"}; !slices.Equal(replay, want) {
		t.Errorf("load's replay on h2: %q, want the first turn %q", replay, want)
	}
	checkSeqs(t, "relayed over HTTP", res.Updates)
	if text, _ := waitComplete(t, a, created.SessionID); text != "one two three" {
		t.Errorf("h1's viewer: message.complete %q, want the turn prompted over HTTP on h2", text)
	}
	if got := hosts[1].Metric(t, "tether_live_sessions"); got != 0 {
		t.Errorf("h2 live sessions: %v, want 0 (relayed, not rebuilt)", got)
	}
}

// TestACPHTTPPermission: over HTTP, tether's session/request_permission
// reaches the SDK client on its session stream and the client's answer
// (a POST) reaches the agent; a second HTTP client's request is
// withdrawn with $/cancel_request (on its connection stream) and its
// late answer dropped: first answer wins, once.
func TestACPHTTPPermission(t *testing.T) {
	h := startACPHost(t, acpHostConfig{})
	url := acpHTTPURL(h.Server)
	key := runACPClient(t, url, h.Token, "new").SessionID
	b := startACPClient(t, url, h.Token, "permission", "--session", key, "--after-cancel", "answer:deny", "--wait-cancel-request", "--until-text", "chose:")
	b.waitPhase(t, "bound", nil)
	a := runACPClient(t, url, h.Token, "permission", "--session", key, "--text", "permission", "--permission", "allow")
	br := b.result(t)

	checkFirstWins(t, a, br, "winner", "loser")
	wantPrompt(t, runACPClient(t, url, h.Token, "prompt", "--session", key, "--text", "chunks 1"), "end_turn")
	checkOneAnswer(t, h.log(t), "allow")
}
