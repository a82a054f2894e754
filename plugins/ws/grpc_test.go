package ws_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	gobws "github.com/gobwas/ws"
	"github.com/hashicorp/go-plugin"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/plugins/ws"
	"github.com/tether-agent/tether/wire"
)

// TestGRPC runs an echo round trip through the gRPC contract shims, in
// memory.
func TestGRPC(t *testing.T) {
	impl := ws.New(testLogger(t))
	impl.Static = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("page")) })
	client, server := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{
		contract.KindTransport: &contract.TransportPlugin{Impl: impl},
	})
	// As go-plugin's own tests do: stop the server, then close the client
	// (whose Close would otherwise stop the server a second time, racily).
	t.Cleanup(func() { _ = client.Close() })
	t.Cleanup(server.Stop)

	dispense := func() *contract.TransportGRPCClient {
		t.Helper()
		raw, err := client.Dispense(contract.KindTransport)
		if err != nil {
			t.Fatalf("Dispense: %v", err)
		}
		tr, ok := raw.(*contract.TransportGRPCClient)
		if !ok {
			t.Fatalf("Dispense: got %T, want *contract.TransportGRPCClient", raw)
		}
		return tr
	}
	tr := dispense()

	ctx := context.Background()
	resp, err := tr.Start(ctx, contract.StartRequest{
		Instance:       "test",
		Listen:         "127.0.0.1:0",
		MaxConnections: 3,
		PageAuth:       true,
	})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if resp.Version != ws.Version || resp.Addr == "" || resp.MaxConnections != 3 {
		t.Errorf("Start: got %+v, want an address, version %q and at most 3 connections", resp, ws.Version)
	}

	r := newRecorder()
	linkErr := make(chan error, 1)
	go func() { linkErr <- tr.Link(ctx, r.sink) }()

	c := dial(t, resp.Addr, "/api/ws?x=1", nil)
	opened := r.opened(t, c)
	if opened.Path != "/api/ws" || opened.Query != "x=1" || opened.Host != resp.Addr {
		t.Errorf("Opened: got path %q query %q host %q, want /api/ws x=1 %s", opened.Path, opened.Query, opened.Host, resp.Addr)
	}
	id := opened.Conn
	exec(t, tr, admit(id), sendText(id, "ready"))
	if op, p := c.readMessage(); op != gobws.OpText || string(p) != "ready" {
		t.Fatalf("client: got %v %q, want text %q", op, p, "ready")
	}
	c.mustWrite(gobws.OpBinary, []byte("ping me back"))
	e := r.wait(t, "frame", isFrame(id))
	if !e.Binary || string(e.Data) != "ping me back" {
		t.Fatalf("frame: got binary=%v %q", e.Binary, e.Data)
	}
	exec(t, tr, contract.Command{Kind: contract.CommandSend, Conn: id, Binary: true, Data: e.Data})
	if op, p := c.readMessage(); op != gobws.OpBinary || string(p) != "ping me back" {
		t.Fatalf("client: got %v %q, want the echo", op, p)
	}

	// The bound and the counters cross the boundary: the WebSocket and
	// two more are open, the next is refused.
	a, b, over := rawDial(t, resp.Addr), rawDial(t, resp.Addr), rawDial(t, resp.Addr)
	out, _ := readAll(t, over)
	over.Close()
	want503(t, out)
	if st, err := tr.Stats(ctx); err != nil || st != (contract.TransportStats{Connections: 3, Refused503: 1}) {
		t.Errorf("Stats: got %+v, %v; want 3 open, 1 refused", st, err)
	}
	a.Close()
	b.Close()
	// The server frees a place when it reads the closed connection's EOF;
	// until then a new connection is refused on accept, before its request
	// is written, which net/http reports as an error, not a 503.
	waitFor(t, "the two closed places freed", func() bool { return stats(t, tr).Connections == 1 })

	// A page request crosses the boundary: the host's admit and its
	// headers come back on the page's response.
	page := make(chan *http.Response, 1)
	go func() {
		cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: waitTimeout}
		resp, err := cl.Get("http://" + resp.Addr + "/?token=x")
		if err != nil {
			t.Errorf("GET /: %v", err)
			page <- nil
			return
		}
		resp.Body.Close()
		page <- resp
	}()
	pe := r.wait(t, "page request", func(e contract.Event) bool { return e.Kind == contract.EventOpened && e.Page })
	if pe.Path != "/" || pe.Query != "token=x" {
		t.Errorf("page request: got path %q query %q, want / token=x", pe.Path, pe.Query)
	}
	exec(t, tr, contract.Command{Kind: contract.CommandAdmit, Conn: pe.Conn, Header: map[string][]string{"Set-Cookie": {"tether_1=v; Path=/"}}})
	if pr := <-page; pr != nil && (pr.StatusCode != 200 || pr.Header.Get("Set-Cookie") != "tether_1=v; Path=/") {
		t.Errorf("GET /: got %d Set-Cookie %q, want 200 with the host's cookie", pr.StatusCode, pr.Header.Get("Set-Cookie"))
	}

	// A second link, through another client, crosses the boundary.
	err = dispense().Link(ctx, newRecorder().sink)
	if !errors.Is(err, contract.ErrAlreadyLinked) {
		t.Errorf("second Link: got %v, want ErrAlreadyLinked", err)
	}

	exec(t, tr, contract.Command{Kind: contract.CommandClose, Conn: id, Code: wire.CloseUnauthorized, Reason: "bye"})
	if code, _ := c.mustReadClose(); code != wire.CloseUnauthorized {
		t.Errorf("client: got close %d, want 4401", code)
	}
	if e := r.closed(t, id); e.Code != wire.CloseUnauthorized || e.Reason != "bye" {
		t.Errorf("Closed: got %d %q, want 4401 %q", e.Code, e.Reason, "bye")
	}

	if err := tr.Stop(ctx, contract.StopRequest{}); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := <-linkErr; err != nil {
		t.Errorf("Link: got %v after Stop, want nil", err)
	}
}
