package session

import (
	"context"
	"encoding/json"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/tether-agent/tether/contract"
	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/store"
)

// blockingAgent streams one delta, then blocks until interrupted.
type blockingAgent struct{}

func (blockingAgent) Run(ctx context.Context, _ []agent.Message, _ string, emit func(string)) error {
	emit("partial")
	<-ctx.Done()
	return ctx.Err()
}

func (blockingAgent) Close() error { return nil }

// TestReaperAndCapPickOnlyParkedIdle builds sessions in every state and
// checks which ones the idle reaper and the cap may take: only parked
// (no viewer) sessions with no run, oldest activity first.
func TestReaperAndCapPickOnlyParkedIdle(t *testing.T) {
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var clock atomic.Int64 // a fake clock, read by teardown goroutines too
	clock.Store(1000)
	now := func() time.Time { return time.Unix(clock.Load(), 0) }
	tbl := NewTable(Config{
		Store:   st,
		Agents:  agent.FactoryFunc(func(context.Context, string, json.RawMessage) (agent.Agent, error) { return blockingAgent{}, nil }),
		Log:     zerolog.Nop(),
		Now:     now,
		MaxLive: 4,
	})
	defer func() {
		if err := tbl.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	ctx := context.Background()
	mk := func(name string, conn uint64) (*fakeViewer, Snapshot) {
		v := &fakeViewer{id: contract.TransportID{Instance: "t", Conn: conn}}
		var s Snapshot
		if err := tbl.Create(ctx, v, CreateOptions{Title: name, ForkCount: -1}, capture(v, &s)); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		clock.Add(60)
		return v, s
	}
	park := func(v *fakeViewer, s Snapshot) {
		tbl.Detach(v.id, v.binding(s.SessionID))
	}

	_, viewed := mk("viewed", 1)
	v2, parkedOld := mk("parked-old", 2)
	v3, running := mk("parked-running", 3)
	v4, parkedNew := mk("parked-new", 4)
	rec3, _ := tbl.Lookup(running.SessionID)
	if _, err := rec3.Submit("go"); err != nil {
		t.Fatal(err)
	}
	park(v2, parkedOld)
	park(v3, running)
	park(v4, parkedNew)

	titles := func(refs []releaseRef) []string {
		var out []string
		for _, r := range refs {
			r.s.mu.Lock()
			out = append(out, r.s.title)
			r.s.mu.Unlock()
		}
		return out
	}
	got := titles(tbl.candidates(func(*Session) bool { return true }))
	want := []string{"parked-old", "parked-new"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("candidates = %v, want %v (never the viewed one, never the running one)", got, want)
	}

	// The cap (4, all taken) evicts the oldest parked idle one.
	_, fifth := mk("fifth", 5)
	if _, err := tbl.Lookup(parkedOld.SessionID); err == nil {
		t.Errorf("parked-old still live after the cap made room")
	}
	for _, s := range []Snapshot{viewed, running, parkedNew, fifth} {
		if _, err := tbl.Lookup(s.SessionID); err != nil {
			t.Errorf("%s evicted, want it live", s.Title)
		}
	}
	// A stale pick (the session was bound since) does nothing.
	ref := tbl.candidates(func(*Session) bool { return true })[0]
	var s Snapshot
	v9 := &fakeViewer{id: contract.TransportID{Instance: "t", Conn: 9}}
	if err := tbl.Activate(ctx, v9, ref.s.id, capture(v9, &s)); err != nil {
		t.Fatal(err)
	}
	if tbl.release(ref, IdleReap) {
		t.Errorf("idle reap of a session bound since it was picked removed it")
	}
}
