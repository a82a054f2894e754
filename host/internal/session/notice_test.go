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
	"github.com/tether-agent/tether/host/internal/notify"
	"github.com/tether-agent/tether/host/store"
)

// failingAgent's every run fails.
type failingAgent struct{}

func (failingAgent) Run(context.Context, []agent.Message, string, func(string)) error {
	return errors.New("the model is down")
}
func (failingAgent) Close() error { return nil }

func nextNotice(t *testing.T, ch <-chan notify.Event) notify.Event {
	t.Helper()
	select {
	case ev := <-ch:
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no notification within 10s")
		return notify.Event{}
	}
}

// TestNotices: a permission request, a completed run and a failed run
// each tell Config.Notify, with the session's key and title, the run and
// who started it; an interrupted run tells nothing.
func TestNotices(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	notes := make(chan notify.Event, 10)
	ta := &askingTurner{asked: make(chan struct{})}
	var next agent.Agent = ta
	tbl := NewTable(Config{Store: st, Log: zerolog.Nop(), Notify: func(ev notify.Event) { notes <- ev },
		Agents: agent.FactoryFunc(func(context.Context, string, json.RawMessage) (agent.Agent, error) { return next, nil })})
	defer tbl.Shutdown(ctx)
	v := &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 1}}
	var snap Snapshot
	if err := tbl.Create(ctx, v, CreateOptions{ForkCount: -1}, capture(v, &snap)); err != nil {
		t.Fatal(err)
	}
	s, _ := tbl.Lookup(snap.SessionID)
	runID, err := s.SubmitBy("deploy it", "alice")
	if err != nil {
		t.Fatal(err)
	}
	ev := nextNotice(t, notes)
	if ev.Type != notify.TypePermissionRequested || ev.Session != s.Key() || ev.Title != "deploy it" || ev.RunID != runID || ev.By != "alice" || ev.RequestID == "" {
		t.Fatalf("permission: got %+v, want permission.requested of run %s by alice in %s", ev, runID, s.Key())
	}
	if ev.Unattended {
		t.Errorf("permission asked with a viewer bound: Unattended, want attended (Web Push would push it)")
	}
	allow := "allow"
	if err := s.RespondPermission(ev.RequestID, &allow, "bob", "ws"); err != nil {
		t.Fatal(err)
	}
	if ev := nextNotice(t, notes); ev.Type != notify.TypeRunCompleted || ev.RunID != runID || ev.By != "alice" || ev.Session != s.Key() {
		t.Fatalf("completed: got %+v, want run.completed of run %s by alice", ev, runID)
	}

	// A failed run, in a session of its own.
	next = failingAgent{}
	v2 := &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 2}}
	var snap2 Snapshot
	if err := tbl.Create(ctx, v2, CreateOptions{ForkCount: -1, Title: "t2"}, capture(v2, &snap2)); err != nil {
		t.Fatal(err)
	}
	s2, _ := tbl.Lookup(snap2.SessionID)
	runID2, err := s2.Submit("x")
	if err != nil {
		t.Fatal(err)
	}
	if ev := nextNotice(t, notes); ev.Type != notify.TypeRunFailed || ev.RunID != runID2 || ev.Title != "t2" || ev.Reason != "the model is down" || ev.By != "" {
		t.Fatalf("failed: got %+v, want run.failed of run %s with its reason", ev, runID2)
	}

	// An interrupted run tells nothing (its permission request did).
	ta2 := &askingTurner{asked: make(chan struct{})}
	next = ta2
	v3 := &fakeViewer{id: contract.TransportID{Instance: "a", Conn: 3}}
	var snap3 Snapshot
	if err := tbl.Create(ctx, v3, CreateOptions{ForkCount: -1}, capture(v3, &snap3)); err != nil {
		t.Fatal(err)
	}
	s3, _ := tbl.Lookup(snap3.SessionID)
	if _, err := s3.Submit("y"); err != nil {
		t.Fatal(err)
	}
	if ev := nextNotice(t, notes); ev.Type != notify.TypePermissionRequested {
		t.Fatalf("got %+v, want permission.requested", ev)
	}
	s3.Interrupt()
	waitFor(t, func() bool { return len(s3.Runs()) == 1 && s3.Runs()[0].Status != statusRunning }, "the run to end")
	select {
	case ev := <-notes:
		t.Errorf("an interrupted run told %+v", ev)
	default:
	}
}
