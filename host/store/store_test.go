package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/tether-agent/tether/host/agent"
	"github.com/tether-agent/tether/internal/statedir"
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
		{"wal_autocheckpoint", fmt.Sprint(walCheckpointPages)},
		{"journal_size_limit", fmt.Sprint(walSizeLimit)},
		{"page_size", "4096"},
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

// TestOpenPrivateNoLinks: a new database is made 0600, and its -wal and
// -shm, which SQLite makes with the database's mode, are 0600 too, under
// the process's umask (SQLite alone would make them 0644); a symbolic
// link at the database or at any file beside it that SQLite opens is
// refused, by Open and by Check, and its target is left alone.
func TestOpenPrivateNoLinks(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	st, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateSession(context.Background(), Session{Key: NewKey(time.Now()), Title: "x", StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"", "-wal", "-shm"} {
		if fi, err := os.Stat(path + f); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("state.db%s: %v (%v), want 0600", f, fi.Mode(), err)
		}
	}
	st.Close()

	for _, f := range []string{"", "-wal", "-shm", "-journal"} {
		t.Run("link at state.db"+f, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "state.db")
			target := filepath.Join(t.TempDir(), "target")
			if err := os.WriteFile(target, []byte("keep"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, path+f); err != nil {
				t.Fatal(err)
			}
			if st, err := Open(context.Background(), path); !errors.Is(err, statedir.ErrLink) || !strings.Contains(err.Error(), path+f) {
				if st != nil {
					st.Close()
				}
				t.Errorf("Open: %v, want refused naming %s", err, path+f)
			}
			if err := Check(context.Background(), path); !errors.Is(err, statedir.ErrLink) {
				t.Errorf("Check: %v, want refused", err)
			}
			if b, _ := os.ReadFile(target); string(b) != "keep" {
				t.Errorf("the target now holds %q", b)
			}
		})
	}
}

// TestJournalBytesAgainstModel: whatever appends, retried seqs and
// prunes (by count, in all, by bytes) a journal goes through, the bytes
// its row counts are those of the events it holds, which are the newest
// a simple model of the three bounds keeps.
func TestJournalBytesAgainstModel(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	round := 0
	rapid.Check(t, func(rt *rapid.T) {
		round++
		keys := make([]string, rapid.IntRange(1, 3).Draw(rt, "sessions"))
		type ev struct {
			key   int
			seq   uint64
			bytes int
		}
		var model []ev // the journal, in insertion order
		next := make([]uint64, len(keys))
		for i := range keys {
			keys[i] = fmt.Sprintf("20250103_%06d_%06x", round, i)
			mustCreate(t, s, Session{Key: keys[i], StartedAt: t0})
		}
		keep := Retention{
			PerSession:      rapid.IntRange(1, 8).Draw(rt, "per session"),
			Total:           rapid.IntRange(1, 30).Draw(rt, "total"),
			PerSessionBytes: int64(rapid.IntRange(1, 400).Draw(rt, "bytes")),
		}
		// Earlier rounds' events count toward Total too: keep them out.
		keep.Total += 1 << 20
		for range rapid.IntRange(1, 8).Draw(rt, "batches") {
			var batch []Event
			for range rapid.IntRange(1, 5).Draw(rt, "events") {
				k := rapid.IntRange(0, len(keys)-1).Draw(rt, "key")
				if next[k] > 0 && rapid.Bool().Draw(rt, "retry") {
					// Its newest event again (a retried commit): never
					// pruned, so always ignored.
					batch = append(batch, Event{Key: keys[k], Seq: next[k], Params: []byte(`{"again":true}`)})
					continue
				}
				next[k]++
				n := rapid.IntRange(10, 120).Draw(rt, "size")
				batch = append(batch, Event{Key: keys[k], Seq: next[k], Params: []byte(`"` + strings.Repeat("é", (n-2)/2) + `"`)})
			}
			if err := s.AppendEvents(ctx, batch, keep); err != nil {
				rt.Fatalf("AppendEvents: %v", err)
			}
			// The model: new seqs go in; then, per session touched, the
			// count bound, then the bytes bound (never the newest).
			touched := map[int]bool{}
			for _, e := range batch {
				k := slices.Index(keys, e.Key)
				if !slices.ContainsFunc(model, func(m ev) bool { return m.key == k && m.seq == e.Seq }) {
					model = append(model, ev{k, e.Seq, len(e.Params)})
					touched[k] = true
				}
			}
			for k := range touched {
				top, sum := uint64(0), int64(0)
				for _, m := range model {
					if m.key == k {
						top = max(top, m.seq)
					}
				}
				model = slices.DeleteFunc(model, func(m ev) bool { return m.key == k && m.seq+uint64(keep.PerSession) <= top })
				for _, m := range model {
					if m.key == k {
						sum += int64(m.bytes)
					}
				}
				model = slices.DeleteFunc(model, func(m ev) bool {
					if m.key != k || m.seq == top || sum <= keep.PerSessionBytes {
						return false
					}
					sum -= int64(m.bytes)
					return true
				})
			}
			for k, key := range keys {
				var wantSeqs []uint64
				var want int64
				for _, m := range model {
					if m.key == k {
						wantSeqs = append(wantSeqs, m.seq)
						want += int64(m.bytes)
					}
				}
				evs, _, _, err := s.EventsSince(ctx, key, 0, 0)
				var seqs []uint64
				var sum int64
				for _, e := range evs {
					seqs = append(seqs, e.Seq)
					sum += int64(len(e.Params))
				}
				got, jerr := s.JournalBytes(ctx, key)
				if err != nil || jerr != nil || got != sum || !slices.Equal(seqs, wantSeqs) || sum != want {
					rt.Fatalf("session %d with %+v: journal %v (%d bytes), counted %d bytes (%v, %v); the model keeps %v (%d bytes)",
						k, keep, seqs, sum, got, err, jerr, wantSeqs, want)
				}
			}
		}
	})
}

// TestReadsDoNotWaitForAWrite: a write transaction in progress (a commit
// of a huge answer, say) holds the writer; reads go on meanwhile, and see
// the last committed state — not the write's rows until it commits.
func TestReadsDoNotWaitForAWrite(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	mustCreate(t, s, Session{Key: "20260101_000000_000001", Title: "before", StartedAt: t0})
	tx, err := s.db.BeginTx(ctx, nil) // immediate: the write lock
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO sessions (key, title, started_at) VALUES ('20260101_000000_000002', 'during', 1)`); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	list, err := s.List(rctx, 10)
	if err != nil {
		t.Fatalf("List while a write is in progress: %v", err)
	}
	if len(list) != 1 || list[0].Title != "before" {
		t.Errorf("List while a write is in progress: %+v, want only the committed session", list)
	}
	if _, _, _, err := s.EventsSince(rctx, "20260101_000000_000001", 0, 0); err != nil {
		t.Errorf("EventsSince while a write is in progress: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if list, err := s.List(ctx, 10); err != nil || len(list) != 2 {
		t.Errorf("List after the commit: %+v, %v; want both sessions", list, err)
	}
}
