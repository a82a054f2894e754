package session

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/store"
)

// askingTurner is a Turner that sends an update, asks for permission,
// streams the chosen option as text and ends with stop reason end_turn
// (cancelled when interrupted).
type askingTurner struct{ asked chan struct{} }

var _ agent.Turner = (*askingTurner)(nil)

func (a *askingTurner) Run(context.Context, []agent.Message, string, func(string)) error {
	return errors.New("a Turner's Run is never called")
}

func (a *askingTurner) Turn(ctx context.Context, _ []agent.Message, _ agent.Message, ev agent.Events) (string, error) {
	ev.Update(json.RawMessage(`{"sessionUpdate":"tool_call","toolCallId":"t1","title":"rm -rf"}`))
	close(a.asked)
	opt, ok, err := ev.Permission(ctx, agent.PermissionRequest{
		ToolCall: json.RawMessage(`{"toolCallId":"t1"}`),
		Options:  json.RawMessage(`[{"optionId":"allow","name":"Allow","kind":"allow_once"},{"optionId":"deny","name":"Deny","kind":"reject_once"}]`),
	})
	if err != nil {
		return "cancelled", nil
	}
	if !ok {
		opt = "none"
	}
	ev.Delta("chose:" + opt)
	return "end_turn", nil
}

func (a *askingTurner) Close() error { return nil }

// TestPermissionFirstAnswerWins: a Turner's permission request reaches
// every viewer as permission.request and every snapshot as pending; the
// first answer is the agent's, every viewer gets permission.resolved with
// who answered, and a later answer gets ErrAlreadyResolved; the turn's
// message.complete carries its stop reason.
func TestPermissionFirstAnswerWins(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ta := &askingTurner{asked: make(chan struct{})}
	tbl := NewTable(Config{Store: st, Agents: agent.FactoryFunc(func(context.Context, string, json.RawMessage) (agent.Agent, error) { return ta, nil }), Log: zerolog.Nop()})
	defer tbl.Shutdown(ctx)
	a := &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 1}}
	b := &fakeViewer{id: contract.TransportID{Instance: "b", Conn: 1}}
	var snap Snapshot
	if err := tbl.Create(ctx, a, CreateOptions{ForkCount: -1}, capture(a, &snap)); err != nil {
		t.Fatal(err)
	}
	s, _ := tbl.Lookup(snap.SessionID)
	if !s.Turns() {
		t.Error("a Turner's session does not report Turns")
	}
	if _, err := s.Submit("go"); err != nil {
		t.Fatal(err)
	}
	<-ta.asked
	var reqID string
	waitFor(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for id := range s.perms {
			reqID = id
		}
		return reqID != ""
	}, "the permission request")
	if err := tbl.Activate(ctx, b, snap.SessionID, capture(b, &snap)); err != nil {
		t.Fatal(err)
	}
	if len(snap.PendingPermissions) != 1 || snap.PendingPermissions[0].RequestID != reqID {
		t.Fatalf("snapshot of a late viewer: pending %+v, want request %s", snap.PendingPermissions, reqID)
	}
	bad := "maybe"
	if err := s.RespondPermission(reqID, &bad, "alice", "ws"); !errors.Is(err, ErrUnknownOption) {
		t.Errorf("an option not offered: %v, want ErrUnknownOption", err)
	}
	allow := "allow"
	if err := s.RespondPermission(reqID, &allow, "alice", "acp"); err != nil {
		t.Fatal(err)
	}
	deny := "deny"
	if err := s.RespondPermission(reqID, &deny, "bob", "ws"); !errors.Is(err, ErrAlreadyResolved) {
		t.Errorf("a second answer: %v, want ErrAlreadyResolved", err)
	}
	if err := s.RespondPermission("nope", &deny, "bob", "ws"); !errors.Is(err, ErrUnknownPermission) {
		t.Errorf("an unknown request: %v, want ErrUnknownPermission", err)
	}
	tbl.wg.Wait()
	if err := tbl.journal.flush(ctx); err != nil {
		t.Fatal(err)
	}
	types := func(v *fakeViewer) (out []string, complete map[string]any, resolved map[string]any) {
		for _, e := range v.events(t) {
			out = append(out, e.Type)
			m, _ := json.Marshal(e.Payload)
			switch e.Type {
			case "message.complete":
				json.Unmarshal(m, &complete)
			case "permission.resolved":
				json.Unmarshal(m, &resolved)
			}
		}
		return
	}
	got, complete, resolved := types(a)
	want := []string{"message.start", "acp.update", "permission.request", "permission.resolved", "message.delta", "message.complete"}
	if len(got) != len(want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("events %v, want %v", got, want)
		}
	}
	if resolved["option_id"] != "allow" || resolved["by"] != "alice" || resolved["transport"] != "acp" || resolved["request_id"] != reqID {
		t.Errorf("permission.resolved %v, want allow by alice through acp", resolved)
	}
	if complete["stop_reason"] != "end_turn" || complete["status"] != "complete" || complete["text"] != "chose:allow" {
		t.Errorf("message.complete %v, want end_turn, complete, chose:allow", complete)
	}
	if gotB, _, _ := types(b); len(gotB) < 3 || gotB[0] != "permission.resolved" {
		t.Errorf("the late viewer's events %v, want permission.resolved first", gotB)
	}
}

// waitFor polls cond, a state another goroutine changes, for up to 10 s.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling another goroutine's state
	}
}
