package rpc

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
)

// TestConnForgetsClosedSessions creates and closes many sessions on one
// socket: the connection holds nothing of a closed session (no binding,
// so no record with its messages and events), and its close, with
// nothing having raced, counts no compare-and-swap conflict.
func TestConnForgetsClosedSessions(t *testing.T) {
	tbl, st, m := newTestTable(t)
	gw := New(tbl, st, "test", zerolog.Nop(), m)
	defer gw.Close()
	out := &recordingSender{}
	c := gw.newConn(contract.TransportID{Instance: "t", Conn: 1}, "ws", out).as(adminWho)

	call := func(id int, method, params string) json.RawMessage {
		t.Helper()
		before := len(out.frames())
		c.OnFrame(fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}`, id, method, params), false)
		gw.wg.Wait()
		frames := out.frames()
		for _, f := range frames[before:] {
			var r struct {
				ID     int             `json:"id"`
				Result json.RawMessage `json:"result"`
				Error  *rpcError       `json:"error"`
			}
			if json.Unmarshal(f, &r) == nil && r.ID == id {
				if r.Error != nil {
					t.Fatalf("%s: got error %v", method, r.Error)
				}
				return r.Result
			}
		}
		t.Fatalf("%s: no response", method)
		return nil
	}
	const n = 20
	for i := range n {
		var snap struct {
			SessionID string `json:"session_id"`
		}
		if err := json.Unmarshal(call(2*i+1, "session.create", `{}`), &snap); err != nil {
			t.Fatal(err)
		}
		if got := c.boundCount(); got != 1 {
			t.Fatalf("after create %d: connection holds %d bindings, want 1", i, got)
		}
		call(2*i+2, "session.close", fmt.Sprintf(`{"session_id":%q}`, snap.SessionID))
		if got := c.boundCount(); got != 0 {
			t.Fatalf("after close %d: connection holds %d bindings, want 0", i, got)
		}
	}
	c.OnClosed()
	if got := testutil.ToFloat64(m.CASConflicts); got != 0 {
		t.Errorf("tether_teardown_cas_conflicts_total = %v after %d create/close and a close with nothing racing, want 0", got, n)
	}
	if got := len(tbl.Active()); got != 0 {
		t.Errorf("live sessions = %d, want 0", got)
	}
}
