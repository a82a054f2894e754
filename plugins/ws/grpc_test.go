package ws_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"

	gobws "github.com/gobwas/ws"
	"github.com/hashicorp/go-plugin"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/plugins/ws"
)

// TestGRPC runs an echo round trip through the gRPC contract shims, in
// memory.
func TestGRPC(t *testing.T) {
	impl := ws.New(testLogger(t))
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
		Instance:        "test",
		Listen:          "127.0.0.1:0",
		MaxConnections:  3,
		PageTokenSHA256: sha256.Sum256([]byte(pageToken)),
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

	// A second link, through another client, crosses the boundary.
	err = dispense().Link(ctx, newRecorder().sink)
	if !errors.Is(err, contract.ErrAlreadyLinked) {
		t.Errorf("second Link: got %v, want ErrAlreadyLinked", err)
	}

	exec(t, tr, contract.Command{Kind: contract.CommandClose, Conn: id, Code: contract.CloseUnauthorized, Reason: "bye"})
	if code, _ := c.mustReadClose(); code != contract.CloseUnauthorized {
		t.Errorf("client: got close %d, want 4401", code)
	}
	if e := r.closed(t, id); e.Code != contract.CloseUnauthorized || e.Reason != "bye" {
		t.Errorf("Closed: got %d %q, want 4401 %q", e.Code, e.Reason, "bye")
	}

	if err := tr.Stop(ctx, contract.StopRequest{}); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := <-linkErr; err != nil {
		t.Errorf("Link: got %v after Stop, want nil", err)
	}
}
