package rpc

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/internal/access"
	"github.com/tether-agent/tether/host/internal/metrics"
	"github.com/tether-agent/tether/host/internal/session"
	"github.com/tether-agent/tether/host/store"
	"github.com/tether-agent/tether/wire"
)

// TestWhoDidWhatIsJournaled: a prompt, a cancel and a close are
// journaled with the name of the credential that made them — replayed by
// session.events.since to another client — and session.runs says who
// submitted each run.
func TestWhoDidWhatIsJournaled(t *testing.T) {
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	tbl := session.NewTable(session.Config{Store: st, Agents: agent.NewEchoFactory(20 * time.Millisecond), Log: zerolog.Nop(), Metrics: m})
	t.Cleanup(func() {
		if err := tbl.Shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		st.Close()
	})
	gw := New(tbl, st, "test", zerolog.Nop(), m)
	t.Cleanup(gw.Close)
	book := access.NewBook(st, zerolog.Nop())
	gw.SetCredentials(book)
	secret, _, err := book.Create(context.Background(), "alice-phone", access.KindMade, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	alice, err := book.Verify(secret)
	if err != nil {
		t.Fatal(err)
	}
	w := &scopeWorld{gw: gw, book: book, vars: map[string]string{}, who: map[string]access.Identity{"alice": alice, "admin": adminWho}}
	c := w.conn(t, "alice")
	var snap wire.Snapshot
	w.call(t, c, wire.MethodCreate, `{}`, &snap)
	w.call(t, c, wire.MethodSubmit, `{"session_id":"`+snap.SessionID+`","text":"one two three four five six seven eight nine ten eleven twelve"}`, nil)
	c.out.(*notifyingSender).waitFrame(t, `"message.delta"`)
	w.call(t, c, wire.MethodInterrupt, `{"session_id":"`+snap.SessionID+`"}`, nil)
	c.out.(*notifyingSender).waitFrame(t, `"message.complete"`)
	var runs struct {
		Runs []session.RunInfo `json:"runs"`
	}
	w.call(t, c, wire.MethodRuns, `{"session_id":"`+snap.SessionID+`"}`, &runs)
	if len(runs.Runs) != 1 || runs.Runs[0].By != "alice-phone" {
		t.Fatalf("session.runs %+v, want one run by alice-phone", runs.Runs)
	}
	// Another client (the access token's) reads the journal.
	admin := w.conn(t, "admin")
	var ev wire.EventsSince
	w.call(t, admin, wire.MethodEventsSince, `{"session_id":"`+snap.SessionID+`","last_seen":0}`, &ev)
	w.call(t, c, wire.MethodClose, `{"session_id":"`+snap.SessionID+`"}`, nil)
	by := map[string]string{}
	for _, e := range ev.Events {
		var p struct {
			By     string `json:"by"`
			Status string `json:"status"`
		}
		_ = json.Unmarshal(e.Payload, &p)
		if p.By != "" {
			by[e.Type] = p.By
		}
	}
	if by[wire.EventMessageStart] != "alice-phone" || by[wire.EventMessageComplete] != "alice-phone" {
		t.Fatalf("journal's by: %v, want the prompt and the cancel by alice-phone", by)
	}
	// The close is the stored journal's last event.
	rows, _, last, err := st.EventsSince(context.Background(), snap.SessionKey, 0, 1000)
	if err != nil || len(rows) == 0 {
		t.Fatalf("stored events: %v, %v", rows, err)
	}
	var end struct {
		Type    string          `json:"type"`
		Payload json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(rows[len(rows)-1].Params, &end); err != nil || rows[len(rows)-1].Seq != last {
		t.Fatalf("last stored event %s: %v", rows[len(rows)-1].Params, err)
	}
	if end.Type != wire.EventSessionClosed || string(end.Payload) != `{"by":"alice-phone"}` {
		t.Fatalf("last stored event %s, want session.closed by alice-phone", rows[len(rows)-1].Params)
	}
}
