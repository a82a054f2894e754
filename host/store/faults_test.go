package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-agent/tether/host/agent"
)

// TestOpenDamaged: a state.db with random pages after its header is
// refused by Open with an error naming the file and wrapping ErrDamaged;
// so is a file that is not a database at all.
func TestOpenDamaged(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		key := NewKey(time.Unix(int64(1700000000+i), 0))
		if err := s.CreateSession(ctx, Session{Key: key, Title: strings.Repeat("t", 200), StartedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if err := s.AppendMessages(ctx, key, agent.Message{Role: agent.RoleUser, Text: strings.Repeat("x", 2000)}); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	// Fold the WAL in, so the pages below are the database's.
	if s, err = Open(ctx, path); err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for off := 4096 * 2; off+4096 <= len(b); off += 4096 * 3 {
		for i := range 4096 {
			b[off+i] = byte(i*7 + off)
		}
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Open(ctx, path)
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), path) {
		t.Errorf("Open of a damaged file: %v; want ErrDamaged naming %s", err, path)
	}

	garbage := filepath.Join(dir, "garbage.db")
	if err := os.WriteFile(garbage, []byte(strings.Repeat("not a database ", 500)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, garbage); !errors.Is(err, ErrDamaged) {
		t.Errorf("Open of a file that is not a database: %v; want ErrDamaged", err)
	}
}

// TestWriteFault: with a write fault injected every write fails with
// ErrUnavailable and changes nothing, reads keep working, and once the
// fault is gone writes work again.
func TestWriteFault(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	key := NewKey(time.Now())
	if err := s.CreateSession(ctx, Session{Key: key, StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	full := errors.New("database or disk is full")
	s.SetWriteFault(func() error { return full })
	writes := map[string]func() error{
		"CreateSession": func() error {
			return s.CreateSession(ctx, Session{Key: NewKey(time.Now().Add(time.Hour)), StartedAt: time.Now()})
		},
		"AppendMessages": func() error { return s.AppendMessages(ctx, key, agent.Message{Role: agent.RoleUser, Text: "x"}) },
		"Commit": func() error {
			return s.Commit(ctx, Batch{Events: []Event{{Key: key, Seq: 1, Params: []byte(`{}`)}}}, Retention{})
		},
		"StartTurn": func() error {
			return s.StartTurn(ctx, key, agent.Message{Role: agent.RoleUser, Text: "x"}, Run{ID: "r", Status: "running"})
		},
		"End":       func() error { return s.End(ctx, key, "closed", time.Now()) },
		"SetCursor": func() error { return s.SetCursor(ctx, key, "e", 3) },
		"AppendEvents": func() error {
			return s.AppendEvents(ctx, []Event{{Key: key, Seq: 1, Params: []byte(`{}`)}}, Retention{})
		},
		"StartRun":      func() error { return s.StartRun(ctx, key, Run{ID: "r2", Status: "running"}) },
		"EndRun":        func() error { return s.EndRun(ctx, key, "r", "interrupted", time.Now()) },
		"Reopen":        func() error { return s.Reopen(ctx, key) },
		"SetAgentState": func() error { return s.SetAgentState(ctx, key, "state") },
		"SetTitle":      func() error { return s.SetTitle(ctx, key, "title") },
	}
	// Every failed write is reported to the OnWriteFault hook, once.
	var reported []error
	s.OnWriteFault(func(err error) { reported = append(reported, err) })
	for name, w := range writes {
		n := len(reported)
		if err := w(); !errors.Is(err, ErrUnavailable) || !errors.Is(err, full) {
			t.Errorf("%s with a full disk: %v; want ErrUnavailable wrapping the cause", name, err)
		}
		if len(reported) != n+1 || !errors.Is(reported[len(reported)-1], ErrUnavailable) {
			t.Errorf("%s with a full disk: the fault hook got %d reports, want 1 wrapping ErrUnavailable", name, len(reported)-n)
		}
	}
	if msgs, err := s.Messages(ctx, key); err != nil || len(msgs) != 0 {
		t.Errorf("reads with a full disk: %v, %v; want them to work and to see nothing written", msgs, err)
	}
	s.SetWriteFault(nil)
	if err := s.Commit(ctx, Batch{
		Messages: []Message{{Key: key, Message: agent.Message{Role: agent.RoleUser, Text: "a"}}, {Key: key, Message: agent.Message{Role: agent.RoleAssistant, Text: "b"}}},
		Events:   []Event{{Key: key, Seq: 1, Params: []byte(`{"n":1}`)}},
		Cursors:  []Cursor{{Key: key, Epoch: "e1", LastSeq: 1}},
	}, Retention{}); err != nil {
		t.Fatalf("commit after the fault: %v", err)
	}
	if n := len(reported); n != len(writes) {
		t.Errorf("the fault hook got %d reports after a write that worked, want %d", n, len(writes))
	}
	s.OnWriteFault(nil)
	msgs, _ := s.Messages(ctx, key)
	sess, _ := s.GetSession(ctx, key)
	evs, _, last, _ := s.EventsSince(ctx, key, 0, 0)
	if len(msgs) != 2 || msgs[1].Text != "b" || sess.Epoch != "e1" || sess.LastSeq != 1 || len(evs) != 1 || last != 1 {
		t.Errorf("after one commit: messages %v, cursor %s/%d, events %d (last %d); want 2 rows, e1/1, 1 event", msgs, sess.Epoch, sess.LastSeq, len(evs), last)
	}
}
