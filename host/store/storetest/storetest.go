// Package storetest is a conformance suite for stores of tether's stored
// sessions: host/store's SQLite *store.Store and the cluster's JetStream
// store both pass it, so that the session table can run on either with
// the same results.
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Store { return open(t) })
//	}
//
// Each check is a subtest with its own store from open, which must close
// it when the test ends. The checks are host/store's own behaviours:
// errors, orders, the end reason that wins, the display prefix of a fork,
// the journal's duplicates and retention (by count and by bytes), runs,
// turns, commits and injected write faults. What stores may differ in (a seq gap in a
// journal, concurrency across processes, durability) is left to each
// store's own tests.
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/host/store"
)

// Store is the store interface the session table runs on
// (store.Backend).
type Store = store.Backend

var _ Store = (*store.Store)(nil)

// Run runs every check against stores made by open.
func Run(t *testing.T, open func(t *testing.T) Store) {
	checks := []struct {
		name string
		fn   func(t *testing.T, s Store)
	}{
		{"CreateAndGet", testCreateAndGet},
		{"UpdatesOnUnknownSession", testUpdatesOnUnknownSession},
		{"EndFirstReasonWins", testEndFirstReasonWins},
		{"SetCursorTitleAgentState", testSetCursorTitleAgentState},
		{"MessagesInOrder", testMessagesInOrder},
		{"MessageContent", testMessageContent},
		{"DisplayLineage", testDisplayLineage},
		{"FindByTitle", testFindByTitle},
		{"List", testList},
		{"ConcurrentAppend", testConcurrentAppend},
		{"JournalAppendAndSince", testJournalAppendAndSince},
		{"JournalPage", testJournalPage},
		{"Runs", testRuns},
		{"StartTurn", testStartTurn},
		{"Commit", testCommit},
		{"WriteFault", testWriteFault},
		{"QuickCheck", func(t *testing.T, s Store) {
			if err := s.QuickCheck(context.Background()); err != nil {
				t.Errorf("QuickCheck of a new store: got %v, want nil", err)
			}
		}},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) { c.fn(t, open(t)) })
	}
	// Checks that open stores of their own.
	for _, c := range []struct {
		name string
		fn   func(t *testing.T, open func(t *testing.T) Store)
	}{
		{"JournalRetention", testJournalRetention},
		{"JournalRetentionBytes", testJournalRetentionBytes},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, open) })
	}
}

// T0 is the start time of the checks' sessions.
var T0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// Key is the stored key of the checks' i-th session.
func Key(i int) string { return fmt.Sprintf("20250102_030405_%06x", i) }

func mustCreate(tb testing.TB, s Store, sess store.Session) {
	tb.Helper()
	if err := s.CreateSession(context.Background(), sess); err != nil {
		tb.Fatalf("CreateSession(%s): got error %v, want nil", sess.Key, err)
	}
}

// mustAppend appends one message per text, alternating user and
// assistant, in one call.
func mustAppend(tb testing.TB, s Store, key string, texts ...string) {
	tb.Helper()
	msgs := make([]agent.Message, len(texts))
	for i, text := range texts {
		role := agent.RoleUser
		if i%2 == 1 {
			role = agent.RoleAssistant
		}
		msgs[i] = agent.Message{Role: role, Text: text}
	}
	if err := s.AppendMessages(context.Background(), key, msgs...); err != nil {
		tb.Fatalf("AppendMessages(%s): got error %v, want nil", key, err)
	}
}

func texts(msgs []agent.Message) []string {
	out := []string{}
	for _, m := range msgs {
		out = append(out, m.Text)
	}
	return out
}

// events returns the events from..to of key, params {"seq":N}.
func events(key string, from, to uint64) []store.Event {
	var out []store.Event
	for seq := from; seq <= to; seq++ {
		out = append(out, store.Event{Key: key, Seq: seq, Params: json.RawMessage(fmt.Sprintf(`{"seq":%d}`, seq))})
	}
	return out
}

func testCreateAndGet(t *testing.T, s Store) {
	ctx := context.Background()
	parent := store.Session{Key: Key(1), Title: "p", StartedAt: T0}
	mustCreate(t, s, parent)
	mustAppend(t, s, parent.Key, "a", "b", "c")
	want := store.Session{
		Key: Key(2), Title: "child", Parent: parent.Key, ForkCount: 2,
		StartedAt: T0.Add(time.Minute), EndedAt: T0.Add(time.Hour), EndReason: "closed",
		Epoch: "ep1", LastSeq: 42, AgentState: `{"id":"x"}`,
	}
	mustCreate(t, s, want)
	got, err := s.GetSession(ctx, want.Key)
	if err != nil || got != want {
		t.Errorf("GetSession: got %+v, %v; want %+v, nil", got, err, want)
	}
	// A session created with no agent state reads back with none, and
	// with its own message count.
	wantParent := parent
	wantParent.MessageCount = 3
	gotParent, err := s.GetSession(ctx, parent.Key)
	if err != nil || gotParent != wantParent {
		t.Errorf("GetSession(parent): got %+v, %v; want %+v (3 messages, not ended), nil", gotParent, err, wantParent)
	}
	for _, tt := range []struct {
		name string
		sess store.Session
		want error
	}{
		{"duplicate key", store.Session{Key: parent.Key, StartedAt: T0}, store.ErrExists},
		{"unknown parent", store.Session{Key: Key(3), Parent: Key(0xffffff), StartedAt: T0}, store.ErrNotFound},
		{"empty key", store.Session{StartedAt: T0}, store.ErrInvalid},
		{"negative fork count", store.Session{Key: Key(4), Parent: parent.Key, ForkCount: -1}, store.ErrInvalid},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := s.CreateSession(ctx, tt.sess); !errors.Is(err, tt.want) {
				t.Errorf("CreateSession: got error %v, want %v", err, tt.want)
			}
		})
	}
	if _, err := s.GetSession(ctx, Key(0xeeeeee)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetSession(unknown): got error %v, want %v", err, store.ErrNotFound)
	}
}

func testUpdatesOnUnknownSession(t *testing.T, s Store) {
	ctx := context.Background()
	key := Key(0xeeeeee)
	for _, tt := range []struct {
		name string
		call func() error
	}{
		{"End", func() error { return s.End(ctx, key, "closed", T0) }},
		{"Reopen", func() error { return s.Reopen(ctx, key) }},
		{"SetCursor", func() error { return s.SetCursor(ctx, key, "e", 1) }},
		{"SetTitle", func() error { return s.SetTitle(ctx, key, "t") }},
		{"SetAgentState", func() error { return s.SetAgentState(ctx, key, "x") }},
		{"AppendMessages", func() error { return s.AppendMessages(ctx, key, agent.Message{Role: agent.RoleUser, Text: "x"}) }},
		{"StartTurn", func() error {
			return s.StartTurn(ctx, key, agent.Message{Role: agent.RoleUser, Text: "x"}, store.Run{ID: "r", Status: "running"})
		}},
		{"Messages", func() error { _, err := s.Messages(ctx, key); return err }},
		{"DisplayMessages", func() error { _, err := s.DisplayMessages(ctx, key); return err }},
		{"DisplayCount", func() error { _, err := s.DisplayCount(ctx, key); return err }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("%s(unknown key): got error %v, want %v", tt.name, err, store.ErrNotFound)
			}
		})
	}
	if runs, err := s.Runs(ctx, key); err != nil || len(runs) != 0 || runs == nil {
		t.Errorf("Runs(unknown key): got %v, %v; want an empty list, nil", runs, err)
	}
	if evs, first, last, err := s.EventsSince(ctx, key, 0, 0); err != nil || len(evs) != 0 || first != 0 || last != 0 {
		t.Errorf("EventsSince(unknown key): got %v %d..%d, %v; want nothing", evs, first, last, err)
	}
}

func testEndFirstReasonWins(t *testing.T, s Store) {
	ctx := context.Background()
	key := Key(1)
	mustCreate(t, s, store.Session{Key: key, StartedAt: T0})
	for _, st := range []struct {
		name       string
		op         func() error
		wantReason string
		wantEnded  time.Time
	}{
		{"first end", func() error { return s.End(ctx, key, "closed", T0.Add(time.Minute)) }, "closed", T0.Add(time.Minute)},
		{"second end ignored", func() error { return s.End(ctx, key, "shutdown", T0.Add(time.Hour)) }, "closed", T0.Add(time.Minute)},
		{"reopen clears", func() error { return s.Reopen(ctx, key) }, "", time.Time{}},
		{"end after reopen", func() error { return s.End(ctx, key, "idle_reap", T0.Add(2*time.Hour)) }, "idle_reap", T0.Add(2 * time.Hour)},
		{"empty reason refused", func() error {
			if err := s.End(ctx, key, "", T0); !errors.Is(err, store.ErrInvalid) {
				return fmt.Errorf("got error %v, want %v", err, store.ErrInvalid)
			}
			return nil
		}, "idle_reap", T0.Add(2 * time.Hour)},
	} {
		if err := st.op(); err != nil {
			t.Fatalf("%s: got error %v, want nil", st.name, err)
		}
		got, err := s.GetSession(ctx, key)
		if err != nil || got.EndReason != st.wantReason || !got.EndedAt.Equal(st.wantEnded) {
			t.Errorf("%s: got reason %q ended %v (%v), want %q %v", st.name, got.EndReason, got.EndedAt, err, st.wantReason, st.wantEnded)
		}
	}
}

func testSetCursorTitleAgentState(t *testing.T, s Store) {
	ctx := context.Background()
	key := Key(1)
	mustCreate(t, s, store.Session{Key: key, Title: "old", StartedAt: T0})
	if err := s.SetCursor(ctx, key, "epoch-2", 1<<40); err != nil {
		t.Fatalf("SetCursor: got error %v, want nil", err)
	}
	for range 2 { // the same value again is no error either
		if err := s.SetTitle(ctx, key, "new"); err != nil {
			t.Fatalf("SetTitle: got error %v, want nil", err)
		}
	}
	if err := s.SetAgentState(ctx, key, `{"cwd":"/"}`); err != nil {
		t.Fatalf("SetAgentState: got error %v, want nil", err)
	}
	got, err := s.GetSession(ctx, key)
	if err != nil || got.Epoch != "epoch-2" || got.LastSeq != 1<<40 || got.Title != "new" || got.AgentState != `{"cwd":"/"}` {
		t.Errorf("GetSession: got %+v, %v; want epoch-2, 1<<40, new, the state", got, err)
	}
}

func testMessagesInOrder(t *testing.T, s Store) {
	ctx := context.Background()
	key := Key(1)
	mustCreate(t, s, store.Session{Key: key, StartedAt: T0})
	got, err := s.Messages(ctx, key)
	if err != nil || got == nil || len(got) != 0 {
		t.Fatalf("Messages (empty): got %#v, %v; want empty non-nil slice, nil", got, err)
	}
	if err := s.AppendMessages(ctx, key); err != nil {
		t.Fatalf("AppendMessages(): got error %v, want nil", err)
	}
	mustAppend(t, s, key, "1", "2")
	mustAppend(t, s, key, "3")
	got, err = s.Messages(ctx, key)
	want := []agent.Message{{Role: agent.RoleUser, Text: "1"}, {Role: agent.RoleAssistant, Text: "2"}, {Role: agent.RoleUser, Text: "3"}}
	if err != nil || !slices.EqualFunc(got, want, sameMessage) {
		t.Errorf("Messages: got %v, %v; want %v", got, err, want)
	}
}

// sameMessage reports whether two display rows are equal, content
// compared as JSON.
func sameMessage(a, b agent.Message) bool {
	return a.Role == b.Role && a.Text == b.Text && sameJSON(a.Content, b.Content)
}

// sameJSON reports whether a and b are the same JSON value (both empty
// counts as the same).
func sameJSON(a, b json.RawMessage) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	ja, _ := json.Marshal(va)
	jb, _ := json.Marshal(vb)
	return string(ja) == string(jb)
}

// testMessageContent: a prompt's content blocks are stored beside its
// text by every write (AppendMessages, StartTurn, Commit) and read back
// as given, by Messages and by a fork's DisplayMessages; a text-only row
// reads back with no content.
func testMessageContent(t *testing.T, s Store) {
	ctx := context.Background()
	key, fork := Key(1), Key(2)
	mustCreate(t, s, store.Session{Key: key, StartedAt: T0})
	blocks := func(text string) json.RawMessage {
		return json.RawMessage(`[{"type":"text","text":"` + text + `"},{"type":"image","mimeType":"image/png","data":"iVBORw0KGgo="},` +
			`{"type":"resource","resource":{"uri":"file:///a.go","mimeType":"text/x-go","text":"package a\n"}}]`)
	}
	want := []agent.Message{
		{Role: agent.RoleUser, Text: "one", Content: blocks("one")},
		{Role: agent.RoleAssistant, Text: "answer"},
		{Role: agent.RoleUser, Text: "two", Content: blocks("two")},
		{Role: agent.RoleAssistant, Text: "answer 2"},
		{Role: agent.RoleUser, Text: "three", Content: blocks("three")},
	}
	if err := s.AppendMessages(ctx, key, want[0], want[1]); err != nil {
		t.Fatalf("AppendMessages: %v", err)
	}
	if err := s.StartTurn(ctx, key, want[2], store.Run{ID: "r1", Status: "running", StartedAt: T0}); err != nil {
		t.Fatalf("StartTurn: %v", err)
	}
	if err := s.Commit(ctx, store.Batch{Messages: []store.Message{{Key: key, Message: want[3]}, {Key: key, Message: want[4]}}}, store.Retention{}); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	got, err := s.Messages(ctx, key)
	if err != nil || !slices.EqualFunc(got, want, sameMessage) {
		t.Fatalf("Messages: got %s, %v; want %s", showMessages(got), err, showMessages(want))
	}
	for _, m := range got {
		if m.Role == agent.RoleAssistant && m.Content != nil {
			t.Errorf("a text-only row reads back with content %s, want none", m.Content)
		}
	}
	mustCreate(t, s, store.Session{Key: fork, Parent: key, ForkCount: 3, StartedAt: T0})
	got, err = s.DisplayMessages(ctx, fork)
	if err != nil || !slices.EqualFunc(got, want[:3], sameMessage) {
		t.Errorf("DisplayMessages of a fork: got %s, %v; want %s", showMessages(got), err, showMessages(want[:3]))
	}
}

// showMessages prints rows with their content as JSON text.
func showMessages(msgs []agent.Message) string {
	b, _ := json.Marshal(msgs)
	return string(b)
}

func testDisplayLineage(t *testing.T, s Store) {
	ctx := context.Background()
	gp, par, child, wide, none := Key(1), Key(2), Key(3), Key(4), Key(5)
	mustCreate(t, s, store.Session{Key: gp, StartedAt: T0})
	mustAppend(t, s, gp, "g1", "g2")
	mustAppend(t, s, gp, "g3", "g4")
	mustCreate(t, s, store.Session{Key: par, Parent: gp, ForkCount: 2, StartedAt: T0})
	mustAppend(t, s, par, "p1", "p2")
	mustCreate(t, s, store.Session{Key: child, Parent: par, ForkCount: 3, StartedAt: T0})
	mustAppend(t, s, child, "c1")
	// A fork count beyond the parent's display keeps all of it.
	mustCreate(t, s, store.Session{Key: wide, Parent: par, ForkCount: 99, StartedAt: T0})
	mustAppend(t, s, wide, "w1")
	// A fork count of 0 keeps none of it.
	mustCreate(t, s, store.Session{Key: none, Parent: child, ForkCount: 0, StartedAt: T0})
	mustAppend(t, s, none, "n1")
	for _, tt := range []struct {
		key      string
		want     []string
		wantOwn  []string
		wantSize int
	}{
		{gp, []string{"g1", "g2", "g3", "g4"}, []string{"g1", "g2", "g3", "g4"}, 4},
		{par, []string{"g1", "g2", "p1", "p2"}, []string{"p1", "p2"}, 4},
		{child, []string{"g1", "g2", "p1", "c1"}, []string{"c1"}, 4},
		{wide, []string{"g1", "g2", "p1", "p2", "w1"}, []string{"w1"}, 5},
		{none, []string{"n1"}, []string{"n1"}, 1},
	} {
		t.Run(tt.key, func(t *testing.T) {
			got, err := s.DisplayMessages(ctx, tt.key)
			if err != nil || !slices.Equal(texts(got), tt.want) {
				t.Errorf("DisplayMessages: got %v, %v; want %v", texts(got), err, tt.want)
			}
			own, err := s.Messages(ctx, tt.key)
			if err != nil || !slices.Equal(texts(own), tt.wantOwn) {
				t.Errorf("Messages: got %v, %v; want %v", texts(own), err, tt.wantOwn)
			}
			if n, err := s.DisplayCount(ctx, tt.key); err != nil || n != tt.wantSize {
				t.Errorf("DisplayCount: got %d, %v; want %d, nil", n, err, tt.wantSize)
			}
		})
	}
}

func testFindByTitle(t *testing.T, s Store) {
	ctx := context.Background()
	for _, sess := range []store.Session{
		{Key: Key(1), Title: "work", StartedAt: T0},
		{Key: Key(2), Title: "work", StartedAt: T0.Add(time.Hour)},
		{Key: Key(3), Title: "work", StartedAt: T0.Add(-time.Hour)},
		{Key: Key(4), Title: "tie", StartedAt: T0},
		{Key: Key(5), Title: "tie", StartedAt: T0},
		{Key: Key(6), Title: "", StartedAt: T0},
	} {
		mustCreate(t, s, sess)
	}
	mustAppend(t, s, Key(2), "x")
	for _, tt := range []struct {
		title   string
		wantKey string
		wantErr error
	}{
		{"work", Key(2), nil},
		{"tie", Key(5), nil},
		{"Work", "", store.ErrNotFound},
		{"wor", "", store.ErrNotFound},
		{"", "", store.ErrNotFound},
	} {
		t.Run(tt.title, func(t *testing.T) {
			got, err := s.FindByTitle(ctx, tt.title)
			if !errors.Is(err, tt.wantErr) || got.Key != tt.wantKey {
				t.Errorf("FindByTitle(%q): got %q, %v; want %q, %v", tt.title, got.Key, err, tt.wantKey, tt.wantErr)
			}
			if tt.wantKey == Key(2) && got.MessageCount != 1 {
				t.Errorf("FindByTitle(%q).MessageCount: got %d, want 1", tt.title, got.MessageCount)
			}
		})
	}
}

func testList(t *testing.T, s Store) {
	ctx := context.Background()
	got, err := s.List(ctx, 0)
	if err != nil || got == nil || len(got) != 0 {
		t.Fatalf("List (empty): got %v, %v; want empty non-nil slice, nil", got, err)
	}
	const defaultLimit, total = 100, 105
	var all []string // newest first
	for i := range total {
		// Pairs share a start time, so the key breaks the tie.
		mustCreate(t, s, store.Session{Key: Key(i), StartedAt: T0.Add(time.Duration(i/2) * time.Second)})
		all = append([]string{Key(i)}, all...)
	}
	mustAppend(t, s, all[0], "x", "y")
	// LastActive is the latest of the start, the end and the runs' starts
	// and ends.
	active := map[string]time.Time{}
	for i, key := range all {
		active[key] = T0.Add(time.Duration((total-1-i)/2) * time.Second)
	}
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: got error %v, want nil", what, err)
		}
	}
	must("StartRun", s.StartRun(ctx, all[0], store.Run{ID: "r1", Status: "running", StartedAt: T0.Add(time.Hour), By: "alice"}))
	must("EndRun", s.EndRun(ctx, all[0], "r1", "complete", T0.Add(2*time.Hour)))
	must("StartRun", s.StartRun(ctx, all[0], store.Run{ID: "r2", Status: "running", StartedAt: T0.Add(90 * time.Minute), By: "bob"}))
	active[all[0]] = T0.Add(2 * time.Hour) // an earlier run ended after a later one started
	must("End", s.End(ctx, all[1], "closed", T0.Add(30*time.Minute)))
	active[all[1]] = T0.Add(30 * time.Minute)
	must("StartRun", s.StartRun(ctx, all[2], store.Run{ID: "r3", Status: "running", StartedAt: T0.Add(10 * time.Minute)}))
	active[all[2]] = T0.Add(10 * time.Minute) // still running
	// LastRunBy is who started the latest run (r2, though r1 ended
	// later); "" for a run with no name recorded and for no run at all.
	by := map[string]string{all[0]: "bob"}
	for _, tt := range []struct {
		limit int
		want  []string
	}{
		{1, all[:1]},
		{3, all[:3]},
		{0, all[:defaultLimit]},
		{-1, all[:defaultLimit]},
		{total + 10, all},
	} {
		t.Run(fmt.Sprint(tt.limit), func(t *testing.T) {
			got, err := s.List(ctx, tt.limit)
			var keys []string
			for _, sess := range got {
				keys = append(keys, sess.Key)
			}
			if err != nil || !slices.Equal(keys, tt.want) {
				t.Errorf("List(%d): got %d keys, %v; want %d keys", tt.limit, len(keys), err, len(tt.want))
			}
			if len(got) > 0 && got[0].MessageCount != 2 {
				t.Errorf("List(%d)[0].MessageCount: got %d, want 2", tt.limit, got[0].MessageCount)
			}
			for _, sess := range got {
				if !sess.LastActive.Equal(active[sess.Key]) {
					t.Errorf("List(%d): %s.LastActive: got %v, want %v", tt.limit, sess.Key, sess.LastActive, active[sess.Key])
				}
				if sess.LastRunBy != by[sess.Key] {
					t.Errorf("List(%d): %s.LastRunBy: got %q, want %q", tt.limit, sess.Key, sess.LastRunBy, by[sess.Key])
				}
			}
		})
	}
}

// testConcurrentAppend: appends racing on one store all land, each
// call's rows adjacent, each goroutine's calls in order.
func testConcurrentAppend(t *testing.T, s Store) {
	ctx := context.Background()
	const goroutines, rounds = 20, 10
	key := Key(1)
	mustCreate(t, s, store.Session{Key: key, StartedAt: T0})
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for r := range rounds {
				if err := s.AppendMessages(ctx, key,
					agent.Message{Role: agent.RoleUser, Text: fmt.Sprintf("%d/%d/q", g, r)},
					agent.Message{Role: agent.RoleAssistant, Text: fmt.Sprintf("%d/%d/a", g, r)}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("AppendMessages: got error %v, want nil", err)
	}
	msgs, err := s.Messages(ctx, key)
	if err != nil || len(msgs) != goroutines*rounds*2 {
		t.Fatalf("Messages: got %d rows, %v; want %d", len(msgs), err, goroutines*rounds*2)
	}
	next := map[int]int{}
	for i := 0; i < len(msgs); i += 2 {
		var g, r int
		if _, err := fmt.Sscanf(msgs[i].Text, "%d/%d/q", &g, &r); err != nil {
			t.Fatalf("row %d: got %q, want a question", i, msgs[i].Text)
		}
		if want := fmt.Sprintf("%d/%d/a", g, r); msgs[i+1].Text != want || r != next[g] {
			t.Errorf("rows %d, %d: got %q %q, want round %d of %d and its answer", i, i+1, msgs[i].Text, msgs[i+1].Text, next[g], g)
		}
		next[g] = r + 1
	}
	if sess, err := s.GetSession(ctx, key); err != nil || sess.MessageCount != goroutines*rounds*2 {
		t.Errorf("GetSession: got count %d, %v; want %d", sess.MessageCount, err, goroutines*rounds*2)
	}
}
