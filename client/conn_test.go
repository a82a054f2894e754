package client_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/tether-agent/tether/client"
	"github.com/tether-agent/tether/wire"
)

// dialGateway dials h with o while h answers with gateway.ready and then
// serves handle; the Conn is closed at the end of the test.
func dialGateway(t *testing.T, h *fakeHost, base string, o client.Options, handle rpcHandler) (*client.Conn, *peer) {
	t.Helper()
	ch := background(t, func() (*client.Conn, error) { return client.Dial(ctxT(t), base, o) })
	p := h.gateway(t, handle)
	c, err := wait(t, ch)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c, p
}

// echo answers every method with its params, "fail" with 4001 and data.
func echo(req wire.Request) (any, *wire.ErrorObject) {
	if req.Method == "fail" {
		return nil, &wire.ErrorObject{Code: wire.CodeUnknownSession, Message: "unknown session_id", Data: json.RawMessage(`{"x":1}`)}
	}
	if req.Params == nil {
		return "no params", nil
	}
	return req.Params, nil
}

func TestDialHandshake(t *testing.T) {
	for _, tt := range []struct {
		name   string
		base   string // after http://ADDR
		o      client.Options
		path   string
		header map[string]string
	}{
		{name: "token as bearer", base: "", o: client.Options{Token: "sekrit"}, path: "/api/ws",
			header: map[string]string{"Authorization": "Bearer sekrit"}},
		{name: "token from the printed url", base: "/?token=fromurl", path: "/api/ws",
			header: map[string]string{"Authorization": "Bearer fromurl"}},
		{name: "option beats url", base: "/?token=fromurl", o: client.Options{Token: "opt"}, path: "/api/ws",
			header: map[string]string{"Authorization": "Bearer opt"}},
		{name: "path prefix", base: "/pre/", path: "/pre/api/ws", header: map[string]string{"Authorization": ""}},
		{name: "origin host header", o: client.Options{Token: "t", Origin: "http://o.example", Host: "h.example:1",
			Header: http.Header{"Cookie": {"a=b"}}}, path: "/api/ws",
			header: map[string]string{"Origin": "http://o.example", "Host": "h.example:1", "Cookie": "a=b", "Authorization": "Bearer t"}},
		{name: "header authorization wins", o: client.Options{Token: "t", Header: http.Header{"Authorization": {"Basic x"}}}, path: "/api/ws",
			header: map[string]string{"Authorization": "Basic x"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newFakeHost(t)
			c, p := dialGateway(t, h, h.URL+tt.base, tt.o, echo)
			if p.path != tt.path || len(p.query) != 0 {
				t.Errorf("request %s, want path %s and no query (the token never in the URL)", p.uri, tt.path)
			}
			for k, v := range tt.header {
				if got := p.header.Get(k); got != v {
					t.Errorf("header %s: %q, want %q", k, got, v)
				}
			}
			if c.Version() != "9.9" || c.Ready().Type != wire.EventReady || !strings.Contains(string(c.Ready().Raw), `"9.9"`) {
				t.Errorf("ready: %+v, version %q", c.Ready(), c.Version())
			}
		})
	}
}

func TestDialURLKeepsTheRequest(t *testing.T) {
	h := newFakeHost(t)
	ch := background(t, func() (*client.Conn, error) {
		return client.DialURL(ctxT(t), h.URL+"/api/pty?attach=%zz&token=q", client.Options{Token: "hdr"})
	})
	p := h.gateway(t, echo)
	c, err := wait(t, ch)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if p.uri != "/api/pty?attach=%zz&token=q" || p.header.Get("Authorization") != "Bearer hdr" {
		t.Errorf("request %s with Authorization %q, want it as given plus the bearer header", p.uri, p.header.Get("Authorization"))
	}
}

func TestDialBadURL(t *testing.T) {
	for _, u := range []string{"ftp://x", "http://", "::"} {
		if _, err := client.Dial(ctxT(t), u, client.Options{}); err == nil || strings.Contains(err.Error(), "dial ") {
			t.Errorf("Dial(%q): %v, want a URL error before dialing", u, err)
		}
	}
}

func TestDialRefused(t *testing.T) {
	h := newFakeHost(t)
	t.Run("close before ready", func(t *testing.T) {
		ch := background(t, func() (*client.Conn, error) { return client.Dial(ctxT(t), h.URL, client.Options{Token: "bad"}) })
		p := h.next(t)
		p.sendClose(wire.CloseUnauthorized, "unauthorized")
		_, err := wait(t, ch)
		var ce *client.CloseError
		if !errors.As(err, &ce) || ce.Code != wire.CloseUnauthorized || ce.Reason != "unauthorized" || !errors.Is(err, client.ErrClosed) {
			t.Fatalf("Dial: %v, want a *CloseError 4401", err)
		}
		if client.Retryable(err) {
			t.Error("a 4401 is Retryable")
		}
	})
	t.Run("another first frame", func(t *testing.T) {
		ch := background(t, func() (*client.Conn, error) { return client.Dial(ctxT(t), h.URL, client.Options{}) })
		h.next(t).text(`{"type":"pty.replay"}`)
		if _, err := wait(t, ch); !errors.Is(err, client.ErrProtocol) {
			t.Fatalf("Dial: %v, want ErrProtocol", err)
		}
	})
	t.Run("http status", func(t *testing.T) {
		h.reject.Store(http.StatusServiceUnavailable)
		defer h.reject.Store(0)
		_, err := client.Dial(ctxT(t), h.URL+"/?token=sekrit", client.Options{})
		var de *client.DialError
		if !errors.As(err, &de) || de.Status != http.StatusServiceUnavailable || !client.Retryable(err) {
			t.Fatalf("Dial: %v, want a retryable *DialError 503", err)
		}
		if strings.Contains(err.Error(), "sekrit") {
			t.Errorf("error %q shows the token", err)
		}
	})
	t.Run("no ready in time", func(t *testing.T) {
		ch := background(t, func() (*client.Conn, error) {
			return client.Dial(ctxT(t), h.URL, client.Options{DialTimeout: 50 * time.Millisecond})
		})
		p := h.next(t) // sends nothing
		_, err := wait(t, ch)
		var ce *client.CloseError
		if !errors.As(err, &ce) || ce.Code != wire.CloseAbnormal {
			t.Fatalf("Dial: %v, want a timeout", err)
		}
		_ = p.Close()
	})
	t.Run("ctx ends while waiting", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		ch := background(t, func() (*client.Conn, error) { return client.Dial(ctx, h.URL, client.Options{}) })
		p := h.next(t)
		cancel()
		if _, err := wait(t, ch); !errors.Is(err, context.Canceled) {
			t.Fatalf("Dial: %v, want context.Canceled", err)
		}
		_ = p.Close()
	})
}

func TestDialTLS(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, _, err := ws.HTTPUpgrader{}.Upgrade(r, w)
		if err != nil {
			return
		}
		defer conn.Close()
		got <- r.Header.Get("Authorization")
		p := &peer{Conn: conn, t: t}
		p.br = bufioReader(conn)
		p.ready()
		p.serve(echo)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake below
	srv.StartTLS()
	defer srv.Close()
	cfg := srv.Client().Transport.(*http.Transport).TLSClientConfig
	c, err := client.Dial(ctxT(t), srv.URL+"/?token=tls-token", client.Options{TLSConfig: cfg})
	if err != nil {
		t.Fatalf("Dial %s: %v", srv.URL, err)
	}
	defer c.Close()
	if auth := <-got; auth != "Bearer tls-token" {
		t.Errorf("Authorization %q over TLS", auth)
	}
	var s string
	if err := c.Call(ctxT(t), "x", "over tls", &s); err != nil || s != "over tls" {
		t.Errorf("Call over TLS: %q, %v", s, err)
	}
	// Without the test CA the certificate is refused.
	if _, err := client.Dial(ctxT(t), srv.URL, client.Options{TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12}}); err == nil {
		t.Error("Dial trusted an unknown certificate")
	}
}

func TestCall(t *testing.T) {
	h := newFakeHost(t)
	c, _ := dialGateway(t, h, h.URL, client.Options{}, echo)
	ctx := ctxT(t)

	var got map[string]any
	if err := c.Call(ctx, "m", map[string]any{"session_id": "abc", "cols": 80}, &got); err != nil || got["session_id"] != "abc" || got["cols"] != float64(80) {
		t.Errorf("Call with a map: %v, %v", got, err)
	}
	var s string
	if err := c.Call(ctx, "m", nil, &s); err != nil || s != "no params" {
		t.Errorf("Call without params: %q, %v (params must be left out)", s, err)
	}
	var raw json.RawMessage
	if err := c.Call(ctx, "m", json.RawMessage(`{"last_seen":"x"}`), &raw); err != nil || string(raw) != `{"last_seen":"x"}` {
		t.Errorf("Call with raw params: %s, %v", raw, err)
	}
	if err := c.Call(ctx, "m", func() {}, nil); err == nil {
		t.Error("Call with params that cannot be encoded: no error")
	}

	err := c.Call(ctx, "fail", nil, nil)
	var re *client.Error
	if !errors.As(err, &re) || re.Code != wire.CodeUnknownSession || re.Message != "unknown session_id" || string(re.Data) != `{"x":1}` {
		t.Fatalf("Call fail: %v, want *Error 4001 with data", err)
	}
	if !client.IsCode(err, wire.CodeUnknownSession) || client.IsCode(err, wire.CodeSessionBusy) || client.ErrorCode(err) != 4001 {
		t.Errorf("IsCode/ErrorCode of %v", err)
	}
	if client.ErrorCode(errors.New("x")) != 0 || client.IsCode(nil, 0) {
		t.Error("ErrorCode of a plain error is not 0")
	}
	if !strings.HasPrefix(err.Error(), "fail: rpc error 4001") {
		t.Errorf("error text %q, want the method and the code", err)
	}
}

func TestTypedCalls(t *testing.T) {
	h := newFakeHost(t)
	seen := make(chan wire.Request, 16)
	c, _ := dialGateway(t, h, h.URL, client.Options{}, func(req wire.Request) (any, *wire.ErrorObject) {
		seen <- req
		snap := wire.Snapshot{SessionID: "0123abcd", SessionKey: "20250101_120000_abcdef", Title: "t", Messages: []wire.Message{{Role: "user", Text: "hi"}}, LatestSeq: 3, Epoch: "ep"}
		switch req.Method {
		case wire.MethodCreate, wire.MethodBranch, wire.MethodResume, wire.MethodActivate:
			return snap, nil
		case wire.MethodClose:
			return wire.CloseResult{Closed: true}, nil
		case wire.MethodActiveList:
			return wire.ActiveList{Sessions: []wire.ActiveSession{{ID: "0123abcd", Viewers: 2}}}, nil
		case wire.MethodList:
			end := int64(5)
			return wire.StoredList{Sessions: []wire.StoredSession{{ID: "k", EndedAt: &end, EndReason: "closed"}}}, nil
		case wire.MethodEventsSince:
			return wire.EventsSince{Epoch: "ep", LatestSeq: 4, Events: []wire.Event{{Type: "message.delta", SessionID: "0123abcd", Seq: 4, Payload: json.RawMessage(`{"text":"x"}`)}}}, nil
		case wire.MethodSubmit:
			return wire.SubmitResult{Status: "streaming", RunID: "r1"}, nil
		case wire.MethodRuns:
			return wire.RunList{Runs: []wire.Run{{RunID: "r1", Status: "complete"}}}, nil
		case wire.MethodInterrupt:
			return wire.InterruptResult{Status: "interrupted"}, nil
		}
		return nil, &wire.ErrorObject{Code: wire.CodeMethodNotFound, Message: "no"}
	})
	ctx := ctxT(t)
	check := func(method, params string) {
		t.Helper()
		req := <-seen
		if req.Method != method || string(req.Params) != params {
			t.Errorf("sent %s %s, want %s %s", req.Method, req.Params, method, params)
		}
	}
	snapOK := func(s wire.Snapshot, err error) {
		t.Helper()
		if err != nil || s.SessionID != "0123abcd" || s.LatestSeq != 3 || len(s.Messages) != 1 {
			t.Errorf("snapshot %+v, %v", s, err)
		}
	}
	snapOK(c.Create(ctx, wire.CreateParams{Title: "t", CloseOnDisconnect: true}))
	check(wire.MethodCreate, `{"title":"t","close_on_disconnect":true}`)
	snapOK(c.Branch(ctx, wire.BranchParams{SessionID: "k"}))
	check(wire.MethodBranch, `{"session_id":"k"}`)
	snapOK(c.Resume(ctx, wire.ResumeParams{SessionID: "k", Cols: 80}))
	check(wire.MethodResume, `{"session_id":"k","cols":80}`)
	snapOK(c.Activate(ctx, "0123abcd"))
	check(wire.MethodActivate, `{"session_id":"0123abcd"}`)
	if closed, err := c.CloseSession(ctx, "0123abcd"); !closed || err != nil {
		t.Errorf("CloseSession: %v, %v", closed, err)
	}
	check(wire.MethodClose, `{"session_id":"0123abcd"}`)
	if l, err := c.ActiveList(ctx); err != nil || len(l) != 1 || l[0].Viewers != 2 {
		t.Errorf("ActiveList: %+v, %v", l, err)
	}
	check(wire.MethodActiveList, ``)
	if l, err := c.List(ctx, 20); err != nil || len(l) != 1 || *l[0].EndedAt != 5 {
		t.Errorf("List: %+v, %v", l, err)
	}
	check(wire.MethodList, `{"limit":20}`)
	if r, err := c.EventsSince(ctx, "0123abcd", 0); err != nil || len(r.Events) != 1 || r.Events[0].Seq != 4 {
		t.Errorf("EventsSince: %+v, %v", r, err)
	}
	check(wire.MethodEventsSince, `{"session_id":"0123abcd","last_seen":0}`)
	if r, err := c.Submit(ctx, "0123abcd", "hello"); err != nil || r.RunID != "r1" {
		t.Errorf("Submit: %+v, %v", r, err)
	}
	check(wire.MethodSubmit, `{"session_id":"0123abcd","text":"hello"}`)
	if r, err := c.Runs(ctx, "0123abcd"); err != nil || len(r) != 1 || r[0].Status != "complete" {
		t.Errorf("Runs: %+v, %v", r, err)
	}
	check(wire.MethodRuns, `{"session_id":"0123abcd"}`)
	if ok, err := c.Interrupt(ctx, "0123abcd"); !ok || err != nil {
		t.Errorf("Interrupt: %v, %v", ok, err)
	}
	check(wire.MethodInterrupt, `{"session_id":"0123abcd"}`)
}

func TestConcurrentCalls(t *testing.T) {
	h := newFakeHost(t)
	// The host holds every answer until all n requests are in, then
	// answers them in the reverse of the order they came.
	const n = 64
	var mu sync.Mutex
	var arrived []chan struct{}
	all := make(chan struct{})
	c, _ := dialGateway(t, h, h.URL, client.Options{}, func(req wire.Request) (any, *wire.ErrorObject) {
		mine := make(chan struct{})
		mu.Lock()
		arrived = append(arrived, mine)
		if len(arrived) == n {
			close(all)
		}
		mu.Unlock()
		<-all
		mu.Lock()
		top := arrived[len(arrived)-1] == mine
		mu.Unlock()
		if !top {
			<-mine // the one that came after it has answered
		}
		mu.Lock()
		arrived = arrived[:len(arrived)-1]
		if len(arrived) > 0 {
			close(arrived[len(arrived)-1])
		}
		mu.Unlock()
		return req.Params, nil
	})
	ctx := ctxT(t)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			want := fmt.Sprintf("call-%d", i)
			var got string
			if err := c.Call(ctx, "m", want, &got); err != nil || got != want {
				t.Errorf("Call %s: got %q, %v", want, got, err)
			}
		})
	}
	wg.Wait()
}

func TestEvents(t *testing.T) {
	h := newFakeHost(t)
	ch := background(t, func() (*client.Conn, error) { return client.Dial(ctxT(t), h.URL, client.Options{}) })
	p := h.next(t)
	p.ready()
	const n = 300
	for i := 1; i <= n; i++ {
		p.event(wire.Event{Type: wire.EventMessageDelta, SessionID: "0123abcd", Seq: uint64(i), Payload: json.RawMessage(fmt.Sprintf(`{"text":"w%d "}`, i))})
	}
	p.sendClose(wire.CloseGoingAway, "bye")
	c, err := wait(t, ch)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	i := 0
	for e := range c.Events() {
		i++
		var d wire.MessageDelta
		if e.Seq != uint64(i) || e.Type != wire.EventMessageDelta || e.Decode(&d) != nil || d.Text != fmt.Sprintf("w%d ", i) || !strings.Contains(string(e.Raw), `"seq":`) {
			t.Fatalf("event %d: %+v %s", i, e, e.Raw)
		}
	}
	if i != n {
		t.Fatalf("%d events, want %d before the channel closed", i, n)
	}
	var ce *client.CloseError
	if err := c.Err(); !errors.As(err, &ce) || ce.Code != wire.CloseGoingAway || ce.Reason != "bye" || !client.Retryable(err) {
		t.Errorf("Err: %v, want 1001 bye", err)
	}
	if code := p.readClose(); code != wire.CloseGoingAway {
		t.Errorf("the client answered the close with %d, want the host's 1001", code)
	}
}

func TestOnEvent(t *testing.T) {
	h := newFakeHost(t)
	var mu sync.Mutex
	var seqs []uint64
	ch := background(t, func() (*client.Conn, error) {
		return client.Dial(ctxT(t), h.URL, client.Options{OnEvent: func(e client.Event) {
			mu.Lock()
			seqs = append(seqs, e.Seq)
			mu.Unlock()
		}})
	})
	p := h.gateway(t, echo)
	for i := 1; i <= 5000; i++ {
		p.event(wire.Event{Type: wire.EventMessageDelta, SessionID: "s", Seq: uint64(i), Payload: json.RawMessage(`{}`)})
	}
	c, err := wait(t, ch)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Events() != nil {
		t.Error("Events() is not nil with OnEvent")
	}
	// A call answered after the events: they have all been handled.
	if err := c.Call(ctxT(t), "m", nil, nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seqs) != 5000 {
		t.Fatalf("OnEvent saw %d events, want 5000", len(seqs))
	}
	for i, s := range seqs {
		if s != uint64(i+1) {
			t.Fatalf("event %d has seq %d: out of order", i, s)
		}
	}
}

func TestEventOverflow(t *testing.T) {
	h := newFakeHost(t)
	ch := background(t, func() (*client.Conn, error) { return client.Dial(ctxT(t), h.URL, client.Options{EventBuffer: 4}) })
	p := h.next(t)
	p.ready()
	for i := 1; i <= 5; i++ {
		p.event(wire.Event{Type: "x", SessionID: "s", Seq: uint64(i)})
	}
	c, err := wait(t, ch)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case <-c.Done():
	case <-time.After(testWait):
		t.Fatal("an overflowing connection did not end")
	}
	if err := c.Err(); !errors.Is(err, client.ErrEventOverflow) || !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Err: %v, want ErrEventOverflow", err)
	}
	n := 0
	for e := range c.Events() {
		n++
		if e.Seq != uint64(n) {
			t.Errorf("buffered event %d has seq %d", n, e.Seq)
		}
	}
	if n != 4 {
		t.Errorf("%d events delivered before the overflow, want the 4 buffered", n)
	}
	if err := c.Call(ctxT(t), "m", nil, nil); !errors.Is(err, client.ErrEventOverflow) {
		t.Errorf("Call after the overflow: %v", err)
	}
}

func TestUnmatched(t *testing.T) {
	h := newFakeHost(t)
	type frame struct {
		data   string
		binary bool
	}
	got := make(chan frame, 8)
	gate := make(chan struct{})
	ch := background(t, func() (*client.Conn, error) {
		return client.Dial(ctxT(t), h.URL, client.Options{OnUnmatched: func(b []byte, binary bool) { got <- frame{string(b), binary} }})
	})
	h.gateway(t, func(req wire.Request) (any, *wire.ErrorObject) {
		if req.Method == "late" {
			<-gate
		}
		return "ok", nil
	})
	c, err := wait(t, ch)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	next := func() frame {
		t.Helper()
		select {
		case f := <-got:
			return f
		case <-time.After(testWait):
			t.Fatal("nothing unmatched")
		}
		return frame{}
	}
	if err := c.WriteRaw(ctxT(t), []byte("{not json"), false); err != nil {
		t.Fatal(err)
	}
	if f := next(); f.binary || !strings.Contains(f.data, `"id":null`) || !strings.Contains(f.data, "-32700") {
		t.Errorf("parse error answer: %+v", f)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Call(ctx, "late", nil, nil) }()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("Call with a cancelled ctx: %v", err)
	}
	close(gate)
	if f := next(); !strings.Contains(f.data, `"result":"ok"`) {
		t.Errorf("late response: %+v", f)
	}
	if err := c.WriteRaw(ctxT(t), []byte{0, 1}, true); err != nil {
		t.Fatal(err)
	}
	// The echo server answers binary frames as requests it cannot parse.
	if f := next(); !strings.Contains(f.data, "-32700") {
		t.Errorf("answer to a binary frame: %+v", f)
	}
}

func TestCloseHandshake(t *testing.T) {
	h := newFakeHost(t)
	ch := background(t, func() (*client.Conn, error) { return client.Dial(ctxT(t), h.URL, client.Options{}) })
	p := h.next(t)
	p.ready()
	c, err := wait(t, ch)
	if err != nil {
		t.Fatal(err)
	}
	closed := background(t, func() (struct{}, error) { return struct{}{}, c.Close() })
	if code := p.readClose(); code != wire.CloseNormal { // answers it
		t.Errorf("close code %d, want 1000", code)
	}
	wait(t, closed)
	var ce *client.CloseError
	if err := c.Err(); !errors.As(err, &ce) || ce.Code != wire.CloseNormal {
		t.Errorf("Err after Close: %v, want the host's 1000 answer", err)
	}
	if err := c.Call(ctxT(t), "m", nil, nil); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Call after Close: %v", err)
	}
	if err := c.WriteRaw(ctxT(t), []byte("x"), false); !errors.Is(err, client.ErrClosed) {
		t.Errorf("WriteRaw after Close: %v", err)
	}
	c.Close()
	c.Abort()
}

func TestAbort(t *testing.T) {
	h := newFakeHost(t)
	ch := background(t, func() (*client.Conn, error) { return client.Dial(ctxT(t), h.URL, client.Options{}) })
	p := h.next(t)
	p.ready()
	c, err := wait(t, ch)
	if err != nil {
		t.Fatal(err)
	}
	c.Abort()
	if _, _, err := p.read(); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("host read after Abort: %v, want a reset", err)
	}
	var ce *client.CloseError
	if err := c.Err(); !errors.As(err, &ce) || ce.Code != wire.CloseAbnormal {
		t.Errorf("Err after Abort: %v, want 1006", err)
	}
}

func TestHostEndsPendingCalls(t *testing.T) {
	h := newFakeHost(t)
	ch := background(t, func() (*client.Conn, error) { return client.Dial(ctxT(t), h.URL, client.Options{}) })
	p := h.next(t)
	p.ready()
	c, err := wait(t, ch)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- c.Call(ctxT(t), "m", nil, nil) }()
	}
	for range 4 { // all four requests are out
		if _, _, err := p.read(); err != nil {
			t.Fatal(err)
		}
	}
	p.sendClose(wire.CloseServiceRestart, "swap")
	for range 4 {
		err := <-errs
		var ce *client.CloseError
		if !errors.As(err, &ce) || ce.Code != wire.CloseServiceRestart {
			t.Errorf("pending Call: %v, want a *CloseError 1012", err)
		}
	}
}
