package ws_test

import (
	"bytes"
	"testing"

	gobws "github.com/gobwas/ws"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/plugins/ws"
	"github.com/tether-agent/tether/wire"
)

// TestACPMessageLimit: an /acp socket takes messages up to ACPMaxMessage
// (a prompt's content blocks may be megabytes) where /api/ws closes with
// 1009 past MaxMessage; past ACPMaxMessage /acp closes with 1009 too.
// Its send queue holds a message of that size beyond SendQueue.
func TestACPMessageLimit(t *testing.T) {
	const (
		limit    = 1 << 10
		acpLimit = 8 << 10
		queue    = 2 << 10
	)
	s, addr := startServer(t, contract.StartRequest{MaxMessage: limit, SendQueue: queue},
		func(s *ws.Server) { s.ACPMaxMessage = acpLimit })
	r := link(t, s)
	big := bytes.Repeat([]byte("a"), acpLimit)

	t.Run("acp takes and gets a message of its limit", func(t *testing.T) {
		c := dial(t, addr, "/acp", nil)
		id := r.opened(t, c).Conn
		exec(t, s, admit(id))
		c.mustWrite(gobws.OpText, big)
		e := r.wait(t, "frame", isFrame(id))
		if len(e.Data) != len(big) {
			t.Fatalf("frame of %d bytes, want %d", len(e.Data), len(big))
		}
		// Over SendQueue, within SendQueue+ACPMaxMessage: sent, not 1013.
		exec(t, s, contract.Command{Kind: contract.CommandSend, Conn: id, Data: big})
		if op, p := c.readMessage(); op != gobws.OpText || len(p) != len(big) {
			t.Fatalf("client: got %v of %d bytes, want text of %d", op, len(p), len(big))
		}
		if s.ConnClosing(id) {
			t.Errorf("the /acp socket is closing after a message within its limits")
		}
	})
	for _, tt := range []struct {
		path string
		size int
	}{
		{"/acp", acpLimit + 1},
		{"/api/ws", limit + 1},
		{"/api/pty", limit + 1},
	} {
		t.Run(tt.path+" over its limit", func(t *testing.T) {
			c := dial(t, addr, tt.path, nil)
			id := r.opened(t, c).Conn
			exec(t, s, admit(id))
			if err := c.write(gobws.OpText, true, bytes.Repeat([]byte("b"), tt.size)); err != nil {
				t.Fatalf("client write: %v", err)
			}
			if code, _ := c.mustReadClose(); code != wire.CloseTooBig {
				t.Errorf("client: close code %d, want %d", code, wire.CloseTooBig)
			}
		})
	}
	t.Run("acp over the send queue and its message", func(t *testing.T) {
		c := dial(t, addr, "/acp", nil)
		id := r.opened(t, c).Conn
		exec(t, s, admit(id))
		exec(t, s, contract.Command{Kind: contract.CommandSend, Conn: id, Data: bytes.Repeat([]byte("c"), queue+acpLimit+1)})
		if e := r.closed(t, id); e.Code != wire.CloseTryAgainLater {
			t.Errorf("Closed: code %d %q, want 1013", e.Code, e.Reason)
		}
	})
}
