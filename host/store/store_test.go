package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/tether-agent/tether/host/agent"
)

// t0 is a fixed start time for test sessions.
var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// openTest opens a store in a fresh temporary directory and closes it when
// the test ends.
func openTest(tb testing.TB) *Store {
	tb.Helper()
	s, err := Open(context.Background(), filepath.Join(tb.TempDir(), "state.db"))
	if err != nil {
		tb.Fatalf("Open: got error %v, want nil", err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("Close: got error %v, want nil", err)
		}
	})
	return s
}

// mustCreate stores sess or fails the test.
func mustCreate(tb testing.TB, s *Store, sess Session) {
	tb.Helper()
	if err := s.CreateSession(context.Background(), sess); err != nil {
		tb.Fatalf("CreateSession(%s): got error %v, want nil", sess.Key, err)
	}
}

// mustAppend appends one message per text, alternating user and assistant
// roles, or fails the test.
func mustAppend(tb testing.TB, s *Store, key string, texts ...string) {
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

// texts returns the texts of msgs.
func texts(msgs []agent.Message) []string {
	out := []string{}
	for _, m := range msgs {
		out = append(out, m.Text)
	}
	return out
}

func TestNewKeyShape(t *testing.T) {
	for _, now := range []time.Time{
		t0,
		time.Date(1999, 12, 31, 23, 59, 59, 999, time.FixedZone("x", -7*3600)),
		time.Unix(0, 0),
	} {
		k := NewKey(now)
		if !ValidKey(k) {
			t.Errorf("ValidKey(NewKey(%v)) = false for %q, want true", now, k)
		}
		if got, want := k[:15], now.UTC().Format("20060102_150405"); got != want {
			t.Errorf("NewKey(%v) time part: got %q, want %q", now, got, want)
		}
	}
	if a, b := NewKey(t0), NewKey(t0); a == b {
		t.Errorf("two NewKey(t0): got the same key %q twice, want different random suffixes", a)
	}
}

func TestValidKey(t *testing.T) {
	tests := []struct {
		key  string
		want bool
	}{
		{"20250102_030405_abcdef", true},
		{"20250102_030405_012345", true},
		{"00000000_000000_000000", true},
		{"", false},
		{"20250102_030405_abcde", false},
		{"20250102_030405_abcdef0", false},
		{"20250102_030405_ABCDEF", false},
		{"20250102_030405_abcdeg", false},
		{"20250102-030405_abcdef", false},
		{"20250102_030405-abcdef", false},
		{"2025010a_030405_abcdef", false},
		{"20250102_03040a_abcdef", false},
		{"0123abcd", false},
		{" 20250102_030405_abcde", false},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			if got := ValidKey(tt.key); got != tt.want {
				t.Errorf("ValidKey(%q): got %v, want %v", tt.key, got, tt.want)
			}
		})
	}
}

func TestCreateAndGet(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	parent := Session{Key: "20250102_030405_000001", Title: "p", StartedAt: t0}
	mustCreate(t, s, parent)
	mustAppend(t, s, parent.Key, "a", "b", "c")
	want := Session{
		Key:          "20250102_030405_000002",
		Title:        "child",
		Parent:       parent.Key,
		ForkCount:    2,
		StartedAt:    t0.Add(time.Minute),
		EndedAt:      t0.Add(time.Hour),
		EndReason:    "closed",
		Epoch:        "ep1",
		LastSeq:      42,
		MessageCount: 0,
	}
	mustCreate(t, s, want)

	got, err := s.GetSession(ctx, want.Key)
	if err != nil {
		t.Fatalf("GetSession: got error %v, want nil", err)
	}
	if got != want {
		t.Errorf("GetSession: got %+v, want %+v", got, want)
	}
	gotParent, err := s.GetSession(ctx, parent.Key)
	if err != nil {
		t.Fatalf("GetSession(parent): got error %v, want nil", err)
	}
	if gotParent.MessageCount != 3 || !gotParent.EndedAt.IsZero() || gotParent.EndReason != "" {
		t.Errorf("GetSession(parent): got count %d, ended %v, reason %q; want 3, zero, \"\"",
			gotParent.MessageCount, gotParent.EndedAt, gotParent.EndReason)
	}

	errTests := []struct {
		name string
		sess Session
		want error
	}{
		{"duplicate key", Session{Key: parent.Key, StartedAt: t0}, ErrExists},
		{"unknown parent", Session{Key: "20250102_030405_000003", Parent: "20250102_030405_ffffff", StartedAt: t0}, ErrNotFound},
		{"empty key", Session{StartedAt: t0}, ErrInvalid},
		{"negative fork count", Session{Key: "20250102_030405_000004", Parent: parent.Key, ForkCount: -1}, ErrInvalid},
	}
	for _, tt := range errTests {
		t.Run(tt.name, func(t *testing.T) {
			if err := s.CreateSession(ctx, tt.sess); !errors.Is(err, tt.want) {
				t.Errorf("CreateSession: got error %v, want %v", err, tt.want)
			}
		})
	}

	if _, err := s.GetSession(ctx, "20250102_030405_eeeeee"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetSession(unknown): got error %v, want %v", err, ErrNotFound)
	}
}

func TestUpdatesOnUnknownSession(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	const key = "20250102_030405_eeeeee"
	calls := []struct {
		name string
		call func() error
	}{
		{"End", func() error { return s.End(ctx, key, "closed", t0) }},
		{"Reopen", func() error { return s.Reopen(ctx, key) }},
		{"SetCursor", func() error { return s.SetCursor(ctx, key, "e", 1) }},
		{"SetTitle", func() error { return s.SetTitle(ctx, key, "t") }},
		{"AppendMessages", func() error {
			return s.AppendMessages(ctx, key, agent.Message{Role: agent.RoleUser, Text: "x"})
		}},
		{"Messages", func() error { _, err := s.Messages(ctx, key); return err }},
		{"DisplayMessages", func() error { _, err := s.DisplayMessages(ctx, key); return err }},
		{"DisplayCount", func() error { _, err := s.DisplayCount(ctx, key); return err }},
	}
	for _, tt := range calls {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); !errors.Is(err, ErrNotFound) {
				t.Errorf("%s(unknown key): got error %v, want %v", tt.name, err, ErrNotFound)
			}
		})
	}
}

func TestEndFirstReasonWins(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	const key = "20250102_030405_000001"
	mustCreate(t, s, Session{Key: key, StartedAt: t0})

	steps := []struct {
		name       string
		op         func() error
		wantReason string
		wantEnded  time.Time
	}{
		{"first end", func() error { return s.End(ctx, key, "closed", t0.Add(time.Minute)) }, "closed", t0.Add(time.Minute)},
		{"second end ignored", func() error { return s.End(ctx, key, "shutdown", t0.Add(time.Hour)) }, "closed", t0.Add(time.Minute)},
		{"reopen clears", func() error { return s.Reopen(ctx, key) }, "", time.Time{}},
		{"end after reopen", func() error { return s.End(ctx, key, "idle_reap", t0.Add(2*time.Hour)) }, "idle_reap", t0.Add(2 * time.Hour)},
		{"empty reason refused", func() error {
			if err := s.End(ctx, key, "", t0); !errors.Is(err, ErrInvalid) {
				return fmt.Errorf("got error %v, want %v", err, ErrInvalid)
			}
			return nil
		}, "idle_reap", t0.Add(2 * time.Hour)},
	}
	for _, st := range steps {
		if err := st.op(); err != nil {
			t.Fatalf("%s: got error %v, want nil", st.name, err)
		}
		got, err := s.GetSession(ctx, key)
		if err != nil {
			t.Fatalf("%s: GetSession: got error %v, want nil", st.name, err)
		}
		if got.EndReason != st.wantReason || !got.EndedAt.Equal(st.wantEnded) {
			t.Errorf("%s: got reason %q ended %v, want %q %v", st.name, got.EndReason, got.EndedAt, st.wantReason, st.wantEnded)
		}
	}
}

func TestSetCursorAndTitle(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	const key = "20250102_030405_000001"
	mustCreate(t, s, Session{Key: key, Title: "old", StartedAt: t0})
	if err := s.SetCursor(ctx, key, "epoch-2", 1<<40); err != nil {
		t.Fatalf("SetCursor: got error %v, want nil", err)
	}
	if err := s.SetTitle(ctx, key, "new"); err != nil {
		t.Fatalf("SetTitle: got error %v, want nil", err)
	}
	// Setting the same values again touches no row and is still no error.
	if err := s.SetTitle(ctx, key, "new"); err != nil {
		t.Fatalf("SetTitle (same): got error %v, want nil", err)
	}
	got, err := s.GetSession(ctx, key)
	if err != nil {
		t.Fatalf("GetSession: got error %v, want nil", err)
	}
	if got.Epoch != "epoch-2" || got.LastSeq != 1<<40 || got.Title != "new" {
		t.Errorf("GetSession: got epoch %q seq %d title %q, want %q %d %q", got.Epoch, got.LastSeq, got.Title, "epoch-2", uint64(1<<40), "new")
	}
}

func TestMessagesInOrder(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	const key = "20250102_030405_000001"
	mustCreate(t, s, Session{Key: key, StartedAt: t0})

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
	if err != nil {
		t.Fatalf("Messages: got error %v, want nil", err)
	}
	want := []agent.Message{
		{Role: agent.RoleUser, Text: "1"},
		{Role: agent.RoleAssistant, Text: "2"},
		{Role: agent.RoleUser, Text: "3"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Messages: got %v, want %v", got, want)
	}
}

func TestDisplayLineage(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	const (
		gp    = "20250102_030405_000001"
		par   = "20250102_030405_000002"
		child = "20250102_030405_000003"
		wide  = "20250102_030405_000004"
		none  = "20250102_030405_000005"
	)
	mustCreate(t, s, Session{Key: gp, StartedAt: t0})
	mustAppend(t, s, gp, "g1", "g2", "g3", "g4")
	mustCreate(t, s, Session{Key: par, Parent: gp, ForkCount: 2, StartedAt: t0})
	mustAppend(t, s, par, "p1", "p2")
	mustCreate(t, s, Session{Key: child, Parent: par, ForkCount: 3, StartedAt: t0})
	mustAppend(t, s, child, "c1")
	// A fork count beyond the parent's display keeps all of it.
	mustCreate(t, s, Session{Key: wide, Parent: par, ForkCount: 99, StartedAt: t0})
	mustAppend(t, s, wide, "w1")
	// A fork count of 0 keeps none of it.
	mustCreate(t, s, Session{Key: none, Parent: child, ForkCount: 0, StartedAt: t0})
	mustAppend(t, s, none, "n1")

	tests := []struct {
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
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			got, err := s.DisplayMessages(ctx, tt.key)
			if err != nil {
				t.Fatalf("DisplayMessages: got error %v, want nil", err)
			}
			if !slices.Equal(texts(got), tt.want) {
				t.Errorf("DisplayMessages: got %v, want %v", texts(got), tt.want)
			}
			own, err := s.Messages(ctx, tt.key)
			if err != nil {
				t.Fatalf("Messages: got error %v, want nil", err)
			}
			if !slices.Equal(texts(own), tt.wantOwn) {
				t.Errorf("Messages: got %v, want %v", texts(own), tt.wantOwn)
			}
			n, err := s.DisplayCount(ctx, tt.key)
			if err != nil || n != tt.wantSize {
				t.Errorf("DisplayCount: got %d, %v; want %d, nil", n, err, tt.wantSize)
			}
		})
	}
}

// TestDisplayModel checks DisplayMessages and DisplayCount against the
// recursive definition on random session trees.
func TestDisplayModel(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	var tree int
	rapid.Check(t, func(rt *rapid.T) {
		tree++
		type node struct {
			parent, forkCount int // parent -1: none
			own               []string
		}
		var nodes []node
		keyOf := func(i int) string { return fmt.Sprintf("20250102_%06d_%06x", tree, i) }
		var display func(i int) []string
		display = func(i int) []string {
			n := nodes[i]
			var out []string
			if n.parent >= 0 {
				p := display(n.parent)
				out = append(out, p[:min(n.forkCount, len(p))]...)
			}
			return append(out, n.own...)
		}
		count := rapid.IntRange(1, 6).Draw(rt, "sessions")
		for i := range count {
			n := node{parent: rapid.IntRange(-1, i-1).Draw(rt, "parent")}
			if n.parent >= 0 {
				n.forkCount = rapid.IntRange(0, len(display(n.parent))+1).Draw(rt, "fork")
			}
			for j := range rapid.IntRange(0, 3).Draw(rt, "own") {
				n.own = append(n.own, fmt.Sprintf("%d.%d", i, j))
			}
			nodes = append(nodes, n)
			sess := Session{Key: keyOf(i), ForkCount: n.forkCount, StartedAt: t0}
			if n.parent >= 0 {
				sess.Parent = keyOf(n.parent)
			}
			if err := s.CreateSession(ctx, sess); err != nil {
				rt.Fatalf("CreateSession(%d): got error %v, want nil", i, err)
			}
			var msgs []agent.Message
			for _, text := range n.own {
				msgs = append(msgs, agent.Message{Role: agent.RoleUser, Text: text})
			}
			if err := s.AppendMessages(ctx, sess.Key, msgs...); err != nil {
				rt.Fatalf("AppendMessages(%d): got error %v, want nil", i, err)
			}
		}
		for i := range nodes {
			want := display(i)
			if want == nil {
				want = []string{}
			}
			got, err := s.DisplayMessages(ctx, keyOf(i))
			if err != nil {
				rt.Fatalf("DisplayMessages(%d): got error %v, want nil", i, err)
			}
			if !slices.Equal(texts(got), want) {
				rt.Errorf("DisplayMessages(%d): got %v, want %v", i, texts(got), want)
			}
			n, err := s.DisplayCount(ctx, keyOf(i))
			if err != nil || n != len(want) {
				rt.Errorf("DisplayCount(%d): got %d, %v; want %d, nil", i, n, err, len(want))
			}
		}
	})
}

func TestFindByTitle(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	for _, sess := range []Session{
		{Key: "20250102_030405_000001", Title: "work", StartedAt: t0},
		{Key: "20250102_030405_000002", Title: "work", StartedAt: t0.Add(time.Hour)},
		{Key: "20250102_030405_000003", Title: "work", StartedAt: t0.Add(-time.Hour)},
		{Key: "20250102_030405_000004", Title: "tie", StartedAt: t0},
		{Key: "20250102_030405_000005", Title: "tie", StartedAt: t0},
		{Key: "20250102_030405_000006", Title: "", StartedAt: t0},
	} {
		mustCreate(t, s, sess)
	}
	tests := []struct {
		title   string
		wantKey string
		wantErr error
	}{
		{"work", "20250102_030405_000002", nil},
		{"tie", "20250102_030405_000005", nil},
		{"Work", "", ErrNotFound},
		{"wor", "", ErrNotFound},
		{"", "", ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.title, func(t *testing.T) {
			got, err := s.FindByTitle(ctx, tt.title)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("FindByTitle(%q): got error %v, want %v", tt.title, err, tt.wantErr)
			}
			if got.Key != tt.wantKey {
				t.Errorf("FindByTitle(%q): got key %q, want %q", tt.title, got.Key, tt.wantKey)
			}
		})
	}
}

func TestList(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	got, err := s.List(ctx, 0)
	if err != nil || got == nil || len(got) != 0 {
		t.Fatalf("List (empty): got %v, %v; want empty non-nil slice, nil", got, err)
	}
	const total = defaultListLimit + 5
	var all []string // keys, newest first
	for i := range total {
		// Pairs share a start time, so the key breaks the tie.
		key := fmt.Sprintf("20250102_030405_%06x", i)
		mustCreate(t, s, Session{Key: key, StartedAt: t0.Add(time.Duration(i/2) * time.Second)})
		all = append([]string{key}, all...)
	}
	mustAppend(t, s, all[0], "x", "y")

	tests := []struct {
		limit int
		want  []string
	}{
		{1, all[:1]},
		{3, all[:3]},
		{0, all[:defaultListLimit]},
		{-1, all[:defaultListLimit]},
		{total + 10, all},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.limit), func(t *testing.T) {
			got, err := s.List(ctx, tt.limit)
			if err != nil {
				t.Fatalf("List(%d): got error %v, want nil", tt.limit, err)
			}
			var keys []string
			for _, sess := range got {
				keys = append(keys, sess.Key)
			}
			if !slices.Equal(keys, tt.want) {
				t.Errorf("List(%d): got %d keys %v…, want %d keys %v…", tt.limit, len(keys), head(keys), len(tt.want), head(tt.want))
			}
			if len(got) > 0 && got[0].MessageCount != 2 {
				t.Errorf("List(%d)[0].MessageCount: got %d, want 2", tt.limit, got[0].MessageCount)
			}
		})
	}
}

// head returns at most the first three of keys, for messages.
func head(keys []string) []string { return keys[:min(3, len(keys))] }

func TestConcurrentAppend(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	const (
		key        = "20250102_030405_000001"
		goroutines = 20
		rounds     = 10
	)
	mustCreate(t, s, Session{Key: key, StartedAt: t0})

	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for r := range rounds {
				// Each call appends a pair, which must stay adjacent.
				err := s.AppendMessages(ctx, key,
					agent.Message{Role: agent.RoleUser, Text: fmt.Sprintf("%d/%d/q", g, r)},
					agent.Message{Role: agent.RoleAssistant, Text: fmt.Sprintf("%d/%d/a", g, r)})
				if err != nil {
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
	if err != nil {
		t.Fatalf("Messages: got error %v, want nil", err)
	}
	if got, want := len(msgs), goroutines*rounds*2; got != want {
		t.Fatalf("Messages: got %d rows, want %d", got, want)
	}
	next := make(map[int]int) // goroutine → next round expected
	for i := 0; i < len(msgs); i += 2 {
		var g, r int
		if _, err := fmt.Sscanf(msgs[i].Text, "%d/%d/q", &g, &r); err != nil {
			t.Fatalf("row %d: got %q, want a question", i, msgs[i].Text)
		}
		if want := fmt.Sprintf("%d/%d/a", g, r); msgs[i+1].Text != want {
			t.Errorf("row %d: got %q, want %q", i+1, msgs[i+1].Text, want)
		}
		if r != next[g] {
			t.Errorf("row %d: got round %d of goroutine %d, want round %d", i, r, g, next[g])
		}
		next[g] = r + 1
	}
	if n, err := s.GetSession(ctx, key); err != nil || n.MessageCount != goroutines*rounds*2 {
		t.Errorf("GetSession: got count %d, %v; want %d, nil", n.MessageCount, err, goroutines*rounds*2)
	}
}

func TestSurvivesReopen(t *testing.T) {
	ctx := context.Background()
	// Characters that mean something in a file: URI must be taken literally.
	dir := filepath.Join(t.TempDir(), "odd ?#%name")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "state.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatalf("Open: got error %v, want nil", err)
	}
	want := Session{Key: "20250102_030405_000001", Title: "kept", StartedAt: t0, Epoch: "e", LastSeq: 7, MessageCount: 2}
	mustCreate(t, s, want)
	mustAppend(t, s, want.Key, "q", "a")
	if err := s.End(ctx, want.Key, "shutdown", t0.Add(time.Second)); err != nil {
		t.Fatalf("End: got error %v, want nil", err)
	}
	want.EndReason, want.EndedAt = "shutdown", t0.Add(time.Second)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: got error %v, want nil", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: got error %v, want nil", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("Stat(%s): got error %v, want the database file there", path, err)
	}

	s = openTest2(t, path)
	got, err := s.GetSession(ctx, want.Key)
	if err != nil {
		t.Fatalf("GetSession after reopen: got error %v, want nil", err)
	}
	if got != want {
		t.Errorf("GetSession after reopen: got %+v, want %+v", got, want)
	}
	msgs, err := s.Messages(ctx, want.Key)
	if err != nil || !slices.Equal(texts(msgs), []string{"q", "a"}) {
		t.Errorf("Messages after reopen: got %v, %v; want [q a], nil", texts(msgs), err)
	}
}

// openTest2 opens the store at path and closes it when the test ends.
func openTest2(tb testing.TB, path string) *Store {
	tb.Helper()
	s, err := Open(context.Background(), path)
	if err != nil {
		tb.Fatalf("Open(%s): got error %v, want nil", path, err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConnectionSettings(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	tests := []struct {
		pragma string
		want   string
	}{
		{"journal_mode", "wal"},
		{"foreign_keys", "1"},
		{"busy_timeout", fmt.Sprint(busyTimeout.Milliseconds())},
		{"user_version", fmt.Sprint(latestVersion)},
	}
	for _, tt := range tests {
		t.Run(tt.pragma, func(t *testing.T) {
			var got string
			if err := s.db.QueryRowContext(ctx, "PRAGMA "+tt.pragma).Scan(&got); err != nil {
				t.Fatalf("PRAGMA %s: got error %v, want nil", tt.pragma, err)
			}
			if !strings.EqualFold(got, tt.want) {
				t.Errorf("PRAGMA %s: got %q, want %q", tt.pragma, got, tt.want)
			}
		})
	}
}
