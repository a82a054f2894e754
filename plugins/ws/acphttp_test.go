package ws_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/plugins/ws"
	"github.com/tether-agent/tether/wire"
)

// acpFix is a Server with a recorder, and the test as its host.
type acpFix struct {
	t    *testing.T
	s    *ws.Server
	rec  *recorder
	url  string
	addr string
	cl   *http.Client
}

func newACPFix(t *testing.T, req contract.StartRequest, setup ...func(*ws.Server)) *acpFix {
	t.Helper()
	s, addr := startServer(t, req, setup...)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &acpFix{t: t, s: s, rec: link(t, s), url: "http://" + addr + "/acp", addr: addr, cl: &http.Client{Transport: tr}}
}

// do sends one request to /acp and returns its status, headers and body.
func (f *acpFix) do(method string, hdr http.Header, body string) (int, http.Header, string) {
	f.t.Helper()
	req, err := http.NewRequest(method, f.url, strings.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := f.cl.Do(req)
	if err != nil {
		f.t.Fatalf("%s /acp: %v", method, err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") == "text/event-stream" {
		return resp.StatusCode, resp.Header, "" // a stream: not read to its end
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatalf("%s /acp: reading the body: %v", method, err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

func jsonHdr(key, sid string, cred ...string) http.Header {
	h := http.Header{"Content-Type": {"application/json"}}
	if key != "" {
		h.Set("Acp-Connection-Id", key)
	}
	if sid != "" {
		h.Set("Acp-Session-Id", sid)
	}
	if len(cred) > 0 {
		h.Set("Authorization", cred[0])
	}
	return h
}

const initMsg = `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}`

// initialize opens a connection with cred (an Authorization value, or
// ""), admits it as its host and answers its initialize; it returns the
// contract connection and the Acp-Connection-Id.
func (f *acpFix) initialize(cred string) (uint64, string) {
	f.t.Helper()
	h := jsonHdr("", "")
	if cred != "" {
		h.Set("Authorization", cred)
	}
	return f.initializeAs(h, nil)
}

// initializeAs is initialize with the request's headers h, admitted with
// the Admit's Header admitHeader.
func (f *acpFix) initializeAs(h http.Header, admitHeader map[string][]string) (uint64, string) {
	f.t.Helper()
	type result struct {
		status int
		hdr    http.Header
		body   string
	}
	done := make(chan result, 1)
	n := f.rec.count() // before the request: its Opened may come at once
	go func() {
		req, _ := http.NewRequest(http.MethodPost, f.url, strings.NewReader(initMsg))
		req.Header = h
		resp, err := f.cl.Do(req)
		if err != nil {
			done <- result{status: -1, body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- result{resp.StatusCode, resp.Header, string(b)}
	}()
	opened, _ := f.rec.waitIndex(f.t, "an Opened of /acp", n, func(e contract.Event) bool {
		return e.Kind == contract.EventOpened && e.Path == "/acp"
	})
	if got, cred := http.Header(opened.Header).Get("Authorization"), h.Get("Authorization"); got != cred {
		f.t.Errorf("Opened: got Authorization %q, want %q", got, cred)
	}
	exec(f.t, f.s, contract.Command{Kind: contract.CommandAdmit, Conn: opened.Conn, Header: admitHeader})
	fr := f.rec.wait(f.t, "the initialize frame", isFrame(opened.Conn))
	if string(fr.Data) != initMsg {
		f.t.Errorf("initialize frame: got %s, want %s", fr.Data, initMsg)
	}
	exec(f.t, f.s, sendText(opened.Conn, `{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1}}`))
	var r result
	select {
	case r = <-done:
	case <-time.After(waitTimeout):
		f.t.Fatal("initialize: no answer")
	}
	if r.status != http.StatusOK || r.body != `{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1}}` {
		f.t.Fatalf("initialize: got %d %q, want 200 and the host's answer", r.status, r.body)
	}
	key := r.hdr.Get("Acp-Connection-Id")
	if len(key) < 32 {
		f.t.Fatalf("initialize: got Acp-Connection-Id %q, want 128 random bits", key)
	}
	return opened.Conn, key
}

// sseEvent is one event read from an SSE stream ("" data: a comment).
type sseEvent struct {
	id, data, comment string
}

// sse is an open SSE stream.
type sse struct {
	t    testing.TB
	resp *http.Response
	evs  chan sseEvent
	end  chan struct{}
}

// open opens the SSE stream of key (and sid); hdr adds headers.
func (f *acpFix) open(key, sid, cred string, hdr http.Header) *sse {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, f.url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Acp-Connection-Id", key)
	if sid != "" {
		req.Header.Set("Acp-Session-Id", sid)
	}
	if cred != "" {
		req.Header.Set("Authorization", cred)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := f.cl.Do(req)
	if err != nil {
		f.t.Fatalf("GET /acp: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		f.t.Fatalf("GET /acp: got %d %q, want 200", resp.StatusCode, b)
	}
	for k, want := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"} {
		if got := resp.Header.Get(k); got != want {
			f.t.Errorf("GET /acp: got %s %q, want %q", k, got, want)
		}
	}
	st := &sse{t: f.t, resp: resp, evs: make(chan sseEvent, 100), end: make(chan struct{})}
	go func() {
		defer close(st.end)
		br := bufio.NewReader(resp.Body)
		var ev sseEvent
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimSuffix(line, "\n")
			switch {
			case line == "":
				st.evs <- ev
				ev = sseEvent{}
			case strings.HasPrefix(line, ":"):
				ev.comment = line
			case strings.HasPrefix(line, "id: "):
				ev.id = line[4:]
			case strings.HasPrefix(line, "data: "):
				ev.data += line[6:]
			}
		}
	}()
	f.t.Cleanup(st.close)
	return st
}

func (st *sse) close() {
	st.resp.Body.Close()
	<-st.end
}

// next returns the next event that is not a comment.
func (st *sse) next() sseEvent {
	st.t.Helper()
	for {
		select {
		case ev := <-st.evs:
			if ev.comment != "" && ev.data == "" {
				continue
			}
			return ev
		case <-st.end:
			st.t.Fatal("the SSE stream ended")
		case <-time.After(waitTimeout):
			st.t.Fatal("no SSE event")
		}
	}
}

// ended waits for the stream's end.
func (st *sse) ended() {
	st.t.Helper()
	for {
		select {
		case <-st.evs:
		case <-st.end:
			return
		case <-time.After(waitTimeout):
			st.t.Fatal("the SSE stream did not end")
		}
	}
}

// count returns how many events were received.
func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

func update(sid string, seq uint64, text string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":%q,"update":{"text":%q},"_meta":{"tether/seq":%d}}}`, sid, text, seq)
}

func TestACPHTTPStatuses(t *testing.T) {
	f := newACPFix(t, contract.StartRequest{})
	_, key := f.initialize("")
	for _, tc := range []struct {
		name   string
		method string
		hdr    http.Header
		body   string
		want   int
	}{
		{"a POST that is not JSON is 415", http.MethodPost, http.Header{"Content-Type": {"text/plain"}}, initMsg, 415},
		{"a batch is 501", http.MethodPost, jsonHdr(key, ""), "[" + initMsg + "]", 501},
		{"a POST without a connection id is 400", http.MethodPost, jsonHdr("", ""), `{"jsonrpc":"2.0","id":1,"method":"session/new","params":{}}`, 400},
		{"an unknown connection id is 404", http.MethodPost, jsonHdr("f00d", ""), `{"jsonrpc":"2.0","id":1,"method":"session/new","params":{}}`, 404},
		{"a session-scoped POST without a session id is 400", http.MethodPost, jsonHdr(key, ""), `{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s"}}`, 400},
		{"a body that is not JSON-RPC is 400", http.MethodPost, jsonHdr(key, ""), `{"jsonrpc"`, 400},
		{"a GET without text/event-stream is 406", http.MethodGet, http.Header{"Acp-Connection-Id": {key}, "Accept": {"application/json"}}, "", 406},
		{"a GET without a connection id is 400", http.MethodGet, http.Header{"Accept": {"text/event-stream"}}, "", 400},
		{"a GET with an unknown connection id is 404", http.MethodGet, http.Header{"Accept": {"text/event-stream"}, "Acp-Connection-Id": {"f00d"}}, "", 404},
		{"a DELETE without a connection id is 400", http.MethodDelete, nil, "", 400},
		{"a DELETE with an unknown connection id is 404", http.MethodDelete, http.Header{"Acp-Connection-Id": {"f00d"}}, "", 404},
		{"a PUT is 405", http.MethodPut, nil, "", 405},
		{"a posted notification is 202", http.MethodPost, jsonHdr(key, "s"), `{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}`, 202},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, body := f.do(tc.method, tc.hdr, tc.body)
			if got != tc.want {
				t.Errorf("got %d (%q), want %d", got, body, tc.want)
			}
		})
	}
}

// TestACPHTTPBodyBound: a body over 16 MiB is 413, announced by its
// Content-Length (answered before it is sent) or found while reading a
// chunked one.
func TestACPHTTPBodyBound(t *testing.T) {
	f := newACPFix(t, contract.StartRequest{})
	_, key := f.initialize("")
	t.Run("Content-Length", func(t *testing.T) {
		nc, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		_, _ = fmt.Fprintf(nc, "POST /acp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAcp-Connection-Id: %s\r\nContent-Length: %d\r\n\r\n{", key, 16<<20+1)
		resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("got %d, want 413", resp.StatusCode)
		}
	})
	t.Run("chunked", func(t *testing.T) {
		pr, pw := io.Pipe()
		go func() {
			chunk := bytes.Repeat([]byte("a"), 1<<20)
			_, _ = pw.Write([]byte(`{"x":"`))
			for i := 0; i < 17; i++ {
				if _, err := pw.Write(chunk); err != nil {
					return
				}
			}
			_ = pw.Close()
		}()
		req, _ := http.NewRequest(http.MethodPost, f.url, pr)
		req.Header = jsonHdr(key, "")
		resp, err := f.cl.Do(req)
		_ = pr.CloseWithError(io.ErrClosedPipe) // ends the writer whatever happened
		if err != nil {
			t.Skipf("the server cut the body before the client read its answer: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("got %d, want 413", resp.StatusCode)
		}
	})
}

func TestACPHTTPRouting(t *testing.T) {
	f := newACPFix(t, contract.StartRequest{})
	conn, key := f.initialize("")
	cs := f.open(key, "", "", nil)

	// session/new goes to the host and its answer comes on the
	// connection's stream.
	newReq := `{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/"}}`
	if got, _, body := f.do(http.MethodPost, jsonHdr(key, ""), newReq); got != http.StatusAccepted {
		t.Fatalf("POST session/new: got %d %q, want 202", got, body)
	}
	if fr := f.rec.wait(t, "the session/new frame", func(e contract.Event) bool {
		return isFrame(conn)(e) && bytes.Contains(e.Data, []byte("session/new"))
	}); string(fr.Data) != newReq {
		t.Errorf("frame: got %s, want %s", fr.Data, newReq)
	}
	exec(t, f.s, sendText(conn, `{"jsonrpc":"2.0","id":1,"result":{"sessionId":"S"}}`))
	if ev := cs.next(); ev.data != `{"jsonrpc":"2.0","id":1,"result":{"sessionId":"S"}}` || ev.id != "" {
		t.Errorf("connection stream: got %+v, want the session/new answer without an id", ev)
	}

	// An update before the session's GET waits for it, and carries its
	// seq as the event id.
	exec(t, f.s, sendText(conn, update("S", 7, "early")))
	ss := f.open(key, "S", "", nil)
	if ev := ss.next(); ev.id != "7" || ev.data != update("S", 7, "early") {
		t.Errorf("session stream: got %+v, want the queued update with id 7", ev)
	}

	// A prompt posted for S is answered on S's stream; a notification
	// without a session on the connection's.
	prompt := `{"jsonrpc":"2.0","id":"p","method":"session/prompt","params":{"sessionId":"S","prompt":[]}}`
	if got, _, _ := f.do(http.MethodPost, jsonHdr(key, "S"), prompt); got != http.StatusAccepted {
		t.Fatalf("POST session/prompt: got %d, want 202", got)
	}
	f.rec.wait(t, "the prompt frame", func(e contract.Event) bool {
		return isFrame(conn)(e) && bytes.Contains(e.Data, []byte("session/prompt"))
	})
	exec(t, f.s, sendText(conn, update("S", 8, "live")),
		sendText(conn, `{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":3}}`),
		sendText(conn, `{"jsonrpc":"2.0","id":"p","result":{"stopReason":"end_turn"}}`))
	if ev := ss.next(); ev.id != "8" {
		t.Errorf("session stream: got %+v, want the update with id 8", ev)
	}
	if ev := ss.next(); ev.data != `{"jsonrpc":"2.0","id":"p","result":{"stopReason":"end_turn"}}` {
		t.Errorf("session stream: got %+v, want the prompt's answer", ev)
	}
	if ev := cs.next(); !strings.Contains(ev.data, "$/cancel_request") {
		t.Errorf("connection stream: got %+v, want the $/cancel_request", ev)
	}

	// The host's requests with a session id go to that session; the
	// client's answer to it is a frame.
	exec(t, f.s, sendText(conn, `{"jsonrpc":"2.0","id":9,"method":"session/request_permission","params":{"sessionId":"S"}}`))
	if ev := ss.next(); !strings.Contains(ev.data, "request_permission") {
		t.Errorf("session stream: got %+v, want the permission request", ev)
	}
	if got, _, _ := f.do(http.MethodPost, jsonHdr(key, "S"), `{"jsonrpc":"2.0","id":9,"result":{"outcome":{"outcome":"cancelled"}}}`); got != http.StatusAccepted {
		t.Errorf("POST the answer: got %d, want 202", got)
	}
	f.rec.wait(t, "the answer's frame", func(e contract.Event) bool {
		return isFrame(conn)(e) && bytes.Contains(e.Data, []byte("cancelled"))
	})
}

func TestACPHTTPKeepAlive(t *testing.T) {
	f := newACPFix(t, contract.StartRequest{}, func(s *ws.Server) { s.SSEKeepAlive = 10 * time.Millisecond })
	_, key := f.initialize("")
	cs := f.open(key, "", "", nil)
	select {
	case ev := <-cs.evs:
		if ev.comment == "" || ev.data != "" {
			t.Errorf("got %+v, want a comment", ev)
		}
	case <-time.After(waitTimeout):
		t.Fatal("no keep-alive comment")
	}
}

// TestACPHTTPCredentialMismatch: an attacker who learnt a connection id
// but holds another credential (or none) can neither post, read a stream
// nor delete the connection.
func TestACPHTTPCredentialMismatch(t *testing.T) {
	f := newACPFix(t, contract.StartRequest{})
	conn, key := f.initialize("Bearer owner")
	frames := len(f.rec.forConn(conn))
	newReq := `{"jsonrpc":"2.0","id":1,"method":"session/new","params":{}}`
	for _, tc := range []struct {
		name, method, cred, body string
		want                     int
	}{
		{"a POST with another token", http.MethodPost, "Bearer attacker", newReq, 403},
		{"a POST without a token", http.MethodPost, "", newReq, 401},
		{"a GET with another token", http.MethodGet, "Bearer attacker", "", 403},
		{"a GET without a token", http.MethodGet, "", "", 401},
		{"a DELETE with another token", http.MethodDelete, "Bearer attacker", "", 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := jsonHdr(key, "")
			h.Set("Accept", "text/event-stream")
			if tc.cred != "" {
				h.Set("Authorization", tc.cred)
			}
			if got, _, body := f.do(tc.method, h, tc.body); got != tc.want {
				t.Errorf("got %d (%q), want %d", got, body, tc.want)
			}
		})
	}
	if got := len(f.rec.forConn(conn)); got != frames {
		t.Errorf("the host got %d events of the connection from the attacker, want none", got-frames)
	}
	// The owner's connection is untouched.
	cs := f.open(key, "", "Bearer owner", nil)
	if got, _, _ := f.do(http.MethodPost, jsonHdr(key, "", "Bearer owner"), newReq); got != http.StatusAccepted {
		t.Fatalf("the owner's POST: got %d, want 202", got)
	}
	exec(t, f.s, sendText(conn, `{"jsonrpc":"2.0","id":1,"result":{"sessionId":"S"}}`))
	if ev := cs.next(); !strings.Contains(ev.data, `"S"`) {
		t.Errorf("got %+v, want the answer", ev)
	}
}

func TestACPHTTPCookieCredential(t *testing.T) {
	f := newACPFix(t, contract.StartRequest{})
	h := jsonHdr("", "")
	h.Set("Cookie", "tether_8080=secret; other=1")
	done := make(chan http.Header, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, f.url, strings.NewReader(initMsg))
		req.Header = h
		resp, err := f.cl.Do(req)
		if err != nil {
			done <- nil
			return
		}
		resp.Body.Close()
		done <- resp.Header
	}()
	opened := f.rec.wait(t, "the Opened", func(e contract.Event) bool { return e.Kind == contract.EventOpened })
	exec(t, f.s, admit(opened.Conn))
	f.rec.wait(t, "the initialize", isFrame(opened.Conn))
	exec(t, f.s, sendText(opened.Conn, `{"jsonrpc":"2.0","id":0,"result":{}}`))
	key := (<-done).Get("Acp-Connection-Id")
	for _, tc := range []struct {
		name, cookie string
		want         int
	}{
		{"another cookie of the host changed", "other=2; tether_8080=secret", 202},
		{"tether's cookie differs", "tether_8080=guess; other=1", 403},
		{"no cookie", "", 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := jsonHdr(key, "")
			if tc.cookie != "" {
				h.Set("Cookie", tc.cookie)
			}
			if got, _, body := f.do(http.MethodPost, h, `{"jsonrpc":"2.0","method":"x"}`); got != tc.want {
				t.Errorf("got %d (%q), want %d", got, body, tc.want)
			}
		})
	}
}

func TestACPHTTPRefusedAtOpen(t *testing.T) {
	for _, tc := range []struct {
		code int
		want int
	}{{wire.CloseUnauthorized, 401}, {wire.CloseForbidden, 403}, {wire.CloseTryAgainLater, 503}} {
		t.Run(fmt.Sprint(tc.code), func(t *testing.T) {
			f := newACPFix(t, contract.StartRequest{})
			done := make(chan int, 1)
			go func() {
				req, _ := http.NewRequest(http.MethodPost, f.url, strings.NewReader(initMsg))
				req.Header.Set("Content-Type", "application/json")
				resp, err := f.cl.Do(req)
				if err != nil {
					done <- -1
					return
				}
				resp.Body.Close()
				done <- resp.StatusCode
			}()
			opened := f.rec.wait(t, "the Opened", func(e contract.Event) bool { return e.Kind == contract.EventOpened })
			exec(t, f.s, contract.Command{Kind: contract.CommandClose, Conn: opened.Conn, Code: tc.code, Reason: "no"})
			if got := <-done; got != tc.want {
				t.Errorf("got %d, want %d", got, tc.want)
			}
			if ev := f.rec.closed(t, opened.Conn); ev.Code != tc.code {
				t.Errorf("Closed: got code %d, want %d", ev.Code, tc.code)
			}
		})
	}
}

// TestACPHTTPHostCloses: the host closing the connection (a revoked
// credential: 4401) sends what was queued, ends its streams, and later
// requests get 404.
func TestACPHTTPHostCloses(t *testing.T) {
	f := newACPFix(t, contract.StartRequest{})
	conn, key := f.initialize("")
	cs := f.open(key, "", "", nil)
	ss := f.open(key, "S", "", nil)
	exec(t, f.s, sendText(conn, update("S", 1, "last")),
		contract.Command{Kind: contract.CommandClose, Conn: conn, Code: wire.CloseUnauthorized, Reason: "revoked"})
	if ev := ss.next(); ev.id != "1" {
		t.Errorf("got %+v, want the update queued before the close", ev)
	}
	ss.ended()
	cs.ended()
	if ev := f.rec.closed(t, conn); ev.Code != wire.CloseUnauthorized {
		t.Errorf("Closed: got %d, want 4401", ev.Code)
	}
	if got, _, _ := f.do(http.MethodPost, jsonHdr(key, ""), `{"jsonrpc":"2.0","method":"x"}`); got != http.StatusNotFound {
		t.Errorf("POST after the close: got %d, want 404", got)
	}
}

func TestACPHTTPDelete(t *testing.T) {
	f := newACPFix(t, contract.StartRequest{})
	conn, key := f.initialize("Bearer a")
	cs := f.open(key, "", "Bearer a", nil)
	if got, _, _ := f.do(http.MethodDelete, http.Header{"Acp-Connection-Id": {key}, "Authorization": {"Bearer a"}}, ""); got != http.StatusAccepted {
		t.Fatalf("DELETE: got %d, want 202", got)
	}
	cs.ended()
	if ev := f.rec.closed(t, conn); ev.Code != wire.CloseNormal {
		t.Errorf("Closed: got %d, want 1000", ev.Code)
	}
	if got, _, _ := f.do(http.MethodDelete, http.Header{"Acp-Connection-Id": {key}, "Authorization": {"Bearer a"}}, ""); got != http.StatusNotFound {
		t.Errorf("DELETE again: got %d, want 404", got)
	}
}

// TestACPHTTPQueueBound: what waits for a GET is bounded by SendQueue;
// past it the connection is closed with 1013.
func TestACPHTTPQueueBound(t *testing.T) {
	f := newACPFix(t, contract.StartRequest{SendQueue: 4096})
	conn, _ := f.initialize("")
	exec(t, f.s, sendText(conn, update("S", 1, strings.Repeat("a", 3000))))
	if f.rec.has(isClosed(conn)) {
		t.Fatal("closed under the bound")
	}
	exec(t, f.s, sendText(conn, update("S", 2, strings.Repeat("a", 3000))))
	if ev := f.rec.closed(t, conn); ev.Code != wire.CloseTryAgainLater {
		t.Errorf("Closed: got %d %q, want 1013", ev.Code, ev.Reason)
	}
}

// TestACPHTTPConnectionBound: open HTTP connections count against
// MaxConnections apart from sockets (one socket can open many): past it
// an initialize is 503.
func TestACPHTTPConnectionBound(t *testing.T) {
	f := newACPFix(t, contract.StartRequest{MaxConnections: 2, PingInterval: 50 * time.Millisecond, PeerTimeout: 5 * time.Second})
	f.initialize("")
	f.initialize("")
	// Unbounded, it would be reported and wait for the host (then 503
	// admit timeout, after PeerTimeout).
	if got, _, body := f.do(http.MethodPost, jsonHdr("", ""), initMsg); got != http.StatusServiceUnavailable || !strings.Contains(body, "too many") {
		t.Errorf("a third initialize: got %d %q, want 503", got, body)
	}
}

func TestACPHTTPIdleTimeout(t *testing.T) {
	f := newACPFix(t, contract.StartRequest{PingInterval: 10 * time.Millisecond, PeerTimeout: 50 * time.Millisecond})
	conn, _ := f.initialize("")
	if ev := f.rec.closed(t, conn); ev.Code != wire.CloseAbnormal || ev.Reason != "peer timeout" {
		t.Errorf("Closed: got %d %q, want 1006 peer timeout", ev.Code, ev.Reason)
	}
}

// TestACPHTTPLastEventID: a session stream opened again with
// Last-Event-ID: N makes the transport ask the host for a session/resume
// after N; the client gets every update after N once, in seq order —
// the replay and live updates that repeat it deduplicated — and never
// the resume's answer.
func TestACPHTTPLastEventID(t *testing.T) {
	f := newACPFix(t, contract.StartRequest{})
	conn, key := f.initialize("")
	ss := f.open(key, "S", "", nil)
	exec(t, f.s, sendText(conn, update("S", 1, "a")), sendText(conn, update("S", 2, "b")))
	ss.next()
	ss.next()
	ss.close() // dropped after 2
	// Sent while no stream was open: queued, and replayed again below.
	exec(t, f.s, sendText(conn, update("S", 3, "c")))
	from := f.rec.count()
	again := f.open(key, "S", "", http.Header{"Last-Event-Id": {"2"}})
	fr := f.rec.waitFrom(t, "the session/resume", from, func(e contract.Event) bool {
		return isFrame(conn)(e) && bytes.Contains(e.Data, []byte("session/resume"))
	})
	var resume struct {
		ID     json.RawMessage `json:"id"`
		Params struct {
			SessionID string `json:"sessionId"`
			Meta      map[string]uint64
		} `json:"params"`
	}
	var raw map[string]json.RawMessage
	_ = json.Unmarshal(fr.Data, &raw)
	_ = json.Unmarshal(fr.Data, &resume)
	var meta struct {
		Meta map[string]uint64 `json:"_meta"`
	}
	_ = json.Unmarshal(raw["params"], &meta)
	if resume.Params.SessionID != "S" || meta.Meta["tether/after"] != 2 {
		t.Fatalf("got %s, want a session/resume of S after 2", fr.Data)
	}
	// Live 3 (a prompt of two blocks) comes just before the replay,
	// which sends 3 and 4; live 4 repeats it after the replay; then the
	// answer, live 5, and a late repeat of 4.
	exec(t, f.s, sendText(conn, update("S", 3, "c1")), sendText(conn, update("S", 3, "c2")),
		sendText(conn, update("S", 3, "c1")), sendText(conn, update("S", 3, "c2")), sendText(conn, update("S", 4, "d")),
		sendText(conn, update("S", 4, "d")),
		sendText(conn, fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{}}`, resume.ID)),
		sendText(conn, update("S", 5, "e")), sendText(conn, update("S", 4, "d")))
	var got []string
	for _, want := range []string{update("S", 3, "c1"), update("S", 3, "c2"), update("S", 4, "d"), update("S", 5, "e")} {
		ev := again.next()
		got = append(got, ev.id)
		if ev.data != want {
			t.Fatalf("got events %v, then %s; want 3 3 4 5 (%s)", got, ev.data, want)
		}
	}
	// Nothing else: no repeat, no answer. A marker proves the stream's
	// order.
	exec(t, f.s, sendText(conn, update("S", 7, "marker")))
	if ev := again.next(); ev.id != "7" {
		t.Errorf("got %+v after the resumption, want the marker 7", ev)
	}
}

// TestACPHTTPSupersede: a second GET of a stream takes it; the first
// ends.
func TestACPHTTPSupersede(t *testing.T) {
	f := newACPFix(t, contract.StartRequest{})
	conn, key := f.initialize("")
	first := f.open(key, "S", "", nil)
	second := f.open(key, "S", "", nil)
	first.ended()
	exec(t, f.s, sendText(conn, update("S", 1, "a")))
	if ev := second.next(); ev.id != "1" {
		t.Errorf("got %+v, want the update on the second stream", ev)
	}
}

func TestACPWebSocketConnectionID(t *testing.T) {
	_, addr := startServer(t, contract.StartRequest{})
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_, _ = io.WriteString(nc, "GET /acp HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || len(resp.Header.Get("Acp-Connection-Id")) < 32 {
		t.Errorf("got %d with Acp-Connection-Id %q, want 101 with one", resp.StatusCode, resp.Header.Get("Acp-Connection-Id"))
	}
}

// TestACPHTTPAnswerAfterDrop: an answer written on a session stream
// after the client's last update (its stream dropped then) is sent again
// after the Last-Event-ID replay; one written before an update the
// client saw is not.
func TestACPHTTPAnswerAfterDrop(t *testing.T) {
	f := newACPFix(t, contract.StartRequest{})
	conn, key := f.initialize("")
	resumeOf := func(from int) json.RawMessage {
		fr := f.rec.waitFrom(t, "the session/resume", from, func(e contract.Event) bool {
			return isFrame(conn)(e) && bytes.Contains(e.Data, []byte("session/resume"))
		})
		var m struct {
			ID json.RawMessage `json:"id"`
		}
		_ = json.Unmarshal(fr.Data, &m)
		return m.ID
	}
	for _, id := range []string{"7", "8"} {
		if code, _, _ := f.do(http.MethodPost, jsonHdr(key, "S"), `{"jsonrpc":"2.0","id":`+id+`,"method":"session/prompt","params":{"sessionId":"S","prompt":[]}}`); code != http.StatusAccepted {
			t.Fatalf("prompt %s: %d, want 202", id, code)
		}
	}
	answer7 := `{"jsonrpc":"2.0","id":7,"result":{"stopReason":"end_turn"}}`
	answer8 := `{"jsonrpc":"2.0","id":8,"result":{"stopReason":"cancelled"}}`
	ss := f.open(key, "S", "", nil)
	exec(t, f.s, sendText(conn, update("S", 1, "a")), sendText(conn, answer7), sendText(conn, update("S", 2, "b")), sendText(conn, answer8))
	for range 4 {
		ss.next()
	}
	ss.close() // as if 8's answer had been lost with the stream

	from := f.rec.count()
	again := f.open(key, "S", "", http.Header{"Last-Event-Id": {"2"}})
	rid := resumeOf(from)
	exec(t, f.s, sendText(conn, update("S", 2, "b")), sendText(conn, fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{}}`, rid)))
	if ev := again.next(); ev.data != answer8 {
		t.Fatalf("after Last-Event-ID 2: got %+v, want the answer written after 2 (id 8)", ev)
	}
	exec(t, f.s, sendText(conn, update("S", 3, "marker")))
	if ev := again.next(); ev.id != "3" {
		t.Errorf("got %+v, want the marker 3: the answer written before 2 (id 7) is not sent again", ev)
	}
	again.close()

	// Dropped again: 8 (sent again after 2) goes once more, not twice.
	from = f.rec.count()
	third := f.open(key, "S", "", http.Header{"Last-Event-Id": {"2"}})
	rid = resumeOf(from)
	exec(t, f.s, sendText(conn, update("S", 3, "marker")), sendText(conn, fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{}}`, rid)),
		sendText(conn, update("S", 4, "end")))
	var got []sseEvent
	for range 3 {
		got = append(got, third.next())
	}
	if got[0].id != "3" || got[1].data != answer8 || got[2].id != "4" {
		t.Errorf("after Last-Event-ID 2 again: got %+v, want 3, the answer 8 once, 4", got)
	}
}
