package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tether-agent/tether/host/agent"
)

// openRaw opens the database at path without migrating it and closes it
// when the test ends.
func openRaw(tb testing.TB, path string) *sql.DB {
	tb.Helper()
	db, err := openDB(path)
	if err != nil {
		tb.Fatalf("openDB: got error %v, want nil", err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

// mustExec runs statements on db or fails the test.
func mustExec(tb testing.TB, db *sql.DB, query string, args ...any) {
	tb.Helper()
	if _, err := db.Exec(query, args...); err != nil {
		tb.Fatalf("exec %q: got error %v, want nil", query, err)
	}
}

// TestMigrateFromEveryVersion builds a database at each earlier schema
// version, with data valid at that version, and checks that Open brings it
// to the newest version with the data intact.
func TestMigrateFromEveryVersion(t *testing.T) {
	const key = "20250102_030405_000001"
	ctx := context.Background()
	for v := 0; v <= latestVersion; v++ {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			db := openRaw(t, path)
			if err := migrateTo(ctx, db, v); err != nil {
				t.Fatalf("migrateTo(%d): got error %v, want nil", v, err)
			}
			if got, err := userVersion(ctx, db); err != nil || got != v {
				t.Fatalf("user_version after migrateTo(%d): got %d, %v; want %d, nil", v, got, err, v)
			}
			want := Session{}
			var wantTexts []string
			if v >= 1 {
				mustExec(t, db, `INSERT INTO sessions (key, title, started_at, ended_at, end_reason) VALUES (?, 'old', ?, ?, 'closed')`,
					key, t0.Unix(), t0.Unix()+60)
				mustExec(t, db, `INSERT INTO messages (session_key, seq, role, text) VALUES (?, 1, 'user', 'hi'), (?, 2, 'assistant', 'yo')`, key, key)
				want = Session{Key: key, Title: "old", StartedAt: t0, EndedAt: t0.Add(60e9), EndReason: "closed", MessageCount: 2}
				wantTexts = []string{"hi", "yo"}
			}
			if v >= 2 {
				mustExec(t, db, `UPDATE sessions SET epoch = 'ep', last_seq = 9 WHERE key = ?`, key)
				want.Epoch, want.LastSeq = "ep", 9
			}
			var wantBytes int64 // the journal's bytes, counted by migration 5
			if v >= 3 && v < 5 {
				for seq, p := range []string{`{"seq":1}`, `{"t":"é日"}`} {
					mustExec(t, db, `INSERT INTO events (session_key, seq, params) VALUES (?, ?, ?)`, key, seq+1, p)
					wantBytes += int64(len(p))
				}
			}
			if v >= 3 && v < 7 { // a run stored before who started it was recorded
				mustExec(t, db, `INSERT INTO runs (session_key, run_id, status, started_at) VALUES (?, 'old', 'complete', ?)`, key, t0.Unix()+1)
			}
			if err := db.Close(); err != nil {
				t.Fatalf("close: got error %v, want nil", err)
			}

			s := openTest2(t, path)
			if got, err := userVersion(ctx, s.db); err != nil || got != latestVersion {
				t.Fatalf("user_version after Open: got %d, %v; want %d, nil", got, err, latestVersion)
			}
			if v == 0 {
				if got, err := s.List(ctx, 0); err != nil || len(got) != 0 {
					t.Errorf("List: got %v, %v; want none, nil", got, err)
				}
				return
			}
			got, err := s.GetSession(ctx, key)
			if err != nil {
				t.Fatalf("GetSession: got error %v, want nil", err)
			}
			if got != want {
				t.Errorf("GetSession: got %+v, want %+v", got, want)
			}
			msgs, err := s.Messages(ctx, key)
			if err != nil || !slices.Equal(texts(msgs), wantTexts) {
				t.Errorf("Messages: got %v, %v; want %v, nil", texts(msgs), err, wantTexts)
			}
			if n, err := s.JournalBytes(ctx, key); err != nil || n != wantBytes {
				t.Errorf("JournalBytes after the migration: got %d, %v; want %d (the bytes, not the characters)", n, err, wantBytes)
			}
			// The newest schema is fully usable, and counts on.
			mustAppend(t, s, key, "more")
			if err := s.AppendEvents(ctx, []Event{{Key: key, Seq: 10, Params: []byte(`{"x":"ü"}`)}}, Retention{}); err != nil {
				t.Fatalf("AppendEvents: %v", err)
			}
			if n, err := s.JournalBytes(ctx, key); err != nil || n != wantBytes+10 {
				t.Errorf("JournalBytes after an append: got %d, %v; want %d (10 bytes, 9 characters)", n, err, wantBytes+10)
			}
			if err := s.SetCursor(ctx, key, "ep2", 10); err != nil {
				t.Errorf("SetCursor: got error %v, want nil", err)
			}
			// An old run is nobody's; a new one names who started it.
			if err := s.StartRun(ctx, key, Run{ID: "new", Status: "running", StartedAt: t0.Add(3600e9), By: "dana"}); err != nil {
				t.Fatalf("StartRun: %v", err)
			}
			runs, err := s.Runs(ctx, key)
			if err != nil || len(runs) == 0 || runs[len(runs)-1].By != "dana" || (v >= 3 && v < 7 && (len(runs) != 2 || runs[0].By != "")) {
				t.Errorf("Runs after the migration: got %+v, %v; want the old run by nobody, then one by dana", runs, err)
			}
			if l, err := s.List(ctx, 0); err != nil || len(l) != 1 || l[0].LastRunBy != "dana" {
				t.Errorf("List after the migration: got %+v, %v; want LastRunBy dana", l, err)
			}
			// Rows stored before content blocks were have none; a new
			// prompt keeps its blocks.
			blocks := json.RawMessage(`[{"type":"text","text":"look"},{"type":"image","mimeType":"image/png","data":"AA=="}]`)
			if err := s.AppendMessages(ctx, key, agent.Message{Role: agent.RoleUser, Text: "look", Content: blocks}); err != nil {
				t.Fatalf("AppendMessages with content: %v", err)
			}
			msgs, err = s.Messages(ctx, key)
			if err != nil || len(msgs) != len(wantTexts)+2 {
				t.Fatalf("Messages after the appends: got %d rows, %v; want %d", len(msgs), err, len(wantTexts)+2)
			}
			for _, m := range msgs[:len(msgs)-1] {
				if m.Content != nil {
					t.Errorf("a row stored without content reads back with %s, want none", m.Content)
				}
			}
			if last := msgs[len(msgs)-1]; string(last.Content) != string(blocks) {
				t.Errorf("content of the new row: got %s, want %s", last.Content, blocks)
			}
			// Push subscriptions are kept from version 10 on.
			sub := PushSubscription{Endpoint: "https://push.example/x", P256dh: "p", Auth: "a", Credential: "c", Created: t0}
			if err := s.PutPushSubscription(ctx, sub); err != nil {
				t.Fatalf("PutPushSubscription after the migration: %v", err)
			}
			if subs, err := s.PushSubscriptions(ctx); err != nil || len(subs) != 1 || subs[0].Endpoint != sub.Endpoint {
				t.Errorf("PushSubscriptions after the migration: got %+v, %v; want the one stored", subs, err)
			}
		})
	}
}

func TestMigrateFailingStepRollsBack(t *testing.T) {
	ctx := context.Background()
	db := openRaw(t, filepath.Join(t.TempDir(), "state.db"))
	steps := append(slices.Clone(migrations),
		// Succeeds in part, then fails: nothing of it may remain.
		`CREATE TABLE half (a INTEGER); INSERT INTO sessions (key) VALUES ('no started_at');`)
	err := applySteps(ctx, db, steps, len(steps))
	if err == nil {
		t.Fatalf("applySteps with a failing last step: got nil error, want one")
	}
	if got, err := userVersion(ctx, db); err != nil || got != latestVersion {
		t.Errorf("user_version: got %d, %v; want %d, nil", got, err, latestVersion)
	}
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM sqlite_master WHERE name = 'half'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("table of the failed step: got %d, %v; want 0, nil", n, err)
	}
}

func TestMigrateRefusesNewerSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	db := openRaw(t, path)
	mustExec(t, db, fmt.Sprintf("PRAGMA user_version = %d", latestVersion+1))
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, path)
	if err == nil {
		_ = s.Close()
	}
	if !errors.Is(err, ErrSchemaTooNew) {
		t.Errorf("Open: got error %v, want %v", err, ErrSchemaTooNew)
	}
}

func TestMigrateToOutOfRange(t *testing.T) {
	ctx := context.Background()
	db := openRaw(t, filepath.Join(t.TempDir(), "state.db"))
	for _, v := range []int{-1, latestVersion + 1} {
		if err := migrateTo(ctx, db, v); !errors.Is(err, ErrInvalid) {
			t.Errorf("migrateTo(%d): got error %v, want %v", v, err, ErrInvalid)
		}
	}
}
