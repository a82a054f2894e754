package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/tether-agent/tether/host/agent"
)

// openGroupStore opens a store in a temporary directory with sessions
// of the given keys; it is closed when the test ends.
func openGroupStore(t *testing.T, keys ...string) *Store {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	for _, k := range keys {
		if err := s.CreateSession(ctx, Session{Key: k, StartedAt: time.Unix(1700000000, 0)}); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func prompt(text string) agent.Message { return agent.Message{Role: agent.RoleUser, Text: text} }

func rowTexts(t *testing.T, s *Store, key string) []string {
	t.Helper()
	msgs, err := s.Messages(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	out := []string{}
	for _, m := range msgs {
		out = append(out, m.Text)
	}
	return out
}

// TestGroupFailingWriteAlone: one transaction carries a group of writes;
// a write that fails (a turn of a session that is not stored; a turn
// whose run is stored already, after its prompt row was written) is
// rolled back alone and answered its own error, and the others commit,
// all in that one transaction.
func TestGroupFailingWriteAlone(t *testing.T) {
	const a, b = "20260101_000000_aaaaaa", "20260101_000000_bbbbbb"
	s := openGroupStore(t, a, b)
	ctx := context.Background()
	if err := s.StartRun(ctx, a, Run{ID: "r1", Status: "running", StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	turn := func(key, text, run string) txFunc {
		return func(ctx context.Context, tx *sql.Tx) error {
			return startTurnTx(ctx, tx, key, prompt(text), Run{ID: run, Status: "running", StartedAt: time.Now()})
		}
	}
	fns := []txFunc{
		turn(a, "p1", "r2"),
		turn("20260101_000000_cccccc", "lost", "r9"), // not stored
		turn(a, "dup", "r1"),                         // its run is stored: fails after its prompt row
		func(ctx context.Context, tx *sql.Tx) error { return appendMessagesTx(ctx, tx, b, prompt("m")) },
		turn(b, "p3", "r3"),
	}
	ops := make([]*groupOp, len(fns))
	for i, fn := range fns {
		ops[i] = &groupOp{ctx: ctx, label: "test", fn: fn, done: make(chan error, 1)}
	}
	before := s.WriteStats()
	s.commitGroup(s.w, ops)
	errs := make([]error, len(ops))
	for i, op := range ops {
		errs[i] = <-op.done
	}
	for _, i := range []int{0, 3, 4} {
		if errs[i] != nil {
			t.Errorf("write %d: got %v, want nil", i, errs[i])
		}
	}
	if !errors.Is(errs[1], ErrNotFound) {
		t.Errorf("turn of a session not stored: got %v, want ErrNotFound", errs[1])
	}
	if errs[2] == nil || errors.Is(errs[2], ErrNotFound) {
		t.Errorf("turn with a stored run id: got %v, want a constraint error", errs[2])
	}
	if got, want := rowTexts(t, s, a), []string{"p1"}; !slices.Equal(got, want) {
		t.Errorf("rows of a: got %q, want %q (the failed turn's prompt rolled back)", got, want)
	}
	if got, want := rowTexts(t, s, b), []string{"m", "p3"}; !slices.Equal(got, want) {
		t.Errorf("rows of b: got %q, want %q", got, want)
	}
	after := s.WriteStats()
	if got := after.Commits - before.Commits; got != 1 {
		t.Errorf("transactions for a group of %d writes: got %d, want 1", len(ops), got)
	}
	if got := after.Writes - before.Writes; got != uint64(len(ops)) {
		t.Errorf("writes counted: got %d, want %d", got, len(ops))
	}
}

// TestGroupFaultEachAlone: when the group fails as a whole (a storage
// fault inside one write), every write is tried again alone, so each
// gets its own answer: the faulty one its fault, the others success.
func TestGroupFaultEachAlone(t *testing.T) {
	const a = "20260101_000000_aaaaaa"
	s := openGroupStore(t, a)
	ctx := context.Background()
	fault := fmt.Errorf("injected: %w", syscall.ENOSPC)
	ops := []*groupOp{
		{ctx: ctx, label: "ok", fn: func(ctx context.Context, tx *sql.Tx) error { return appendMessagesTx(ctx, tx, a, prompt("one")) }},
		{ctx: ctx, label: "faulty", fn: func(context.Context, *sql.Tx) error { return fault }},
		{ctx: ctx, label: "ok", fn: func(ctx context.Context, tx *sql.Tx) error { return appendMessagesTx(ctx, tx, a, prompt("two")) }},
	}
	for _, op := range ops {
		op.done = make(chan error, 1)
	}
	before := s.WriteStats()
	s.commitGroup(s.w, ops)
	if err := <-ops[0].done; err != nil {
		t.Errorf("first write: got %v, want nil", err)
	}
	if err := <-ops[1].done; !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("faulty write: got %v, want its fault", err)
	}
	if err := <-ops[2].done; err != nil {
		t.Errorf("third write: got %v, want nil", err)
	}
	if got, want := rowTexts(t, s, a), []string{"one", "two"}; !slices.Equal(got, want) {
		t.Errorf("rows: got %q, want %q", got, want)
	}
	if got := s.WriteStats().Commits - before.Commits; got != 4 {
		t.Errorf("transactions: got %d, want 4 (the group, then each alone)", got)
	}
}

// TestGroupAbandoned: a write whose context ends while it is still
// queued (the writer busy) is taken out of the queue unmade and answered
// an *OverloadError with a retry hint; the writer then skips it.
func TestGroupAbandoned(t *testing.T) {
	const a = "20260101_000000_aaaaaa"
	s := openGroupStore(t, a)
	// Stop the writer and queue into one that is not running yet.
	s.stopWriter()
	w := &committer{wake: make(chan struct{}, 1), stopped: make(chan struct{})}
	s.w = w
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- s.StartTurn(ctx, a, prompt("late"), Run{ID: "r1", Status: "running", StartedAt: time.Now()})
	}()
	// The turn is queued once the writer is woken.
	<-w.wake
	w.wake <- struct{}{}
	cancel()
	err := <-done
	var oe *OverloadError
	if !errors.As(err, &oe) || !errors.Is(err, ErrOverloaded) || !errors.Is(err, context.Canceled) {
		t.Fatalf("StartTurn queued past its context: got %v, want an *OverloadError", err)
	}
	if oe.RetryAfter < minRetryAfter {
		t.Errorf("retry hint: got %v, want at least %v", oe.RetryAfter, minRetryAfter)
	}
	go s.writeLoop(w)
	if err := s.AppendMessages(context.Background(), a, prompt("next")); err != nil {
		t.Fatal(err)
	}
	if got, want := rowTexts(t, s, a), []string{"next"}; !slices.Equal(got, want) {
		t.Errorf("rows: got %q, want %q (the abandoned turn not made)", got, want)
	}
	if got := s.WriteStats().Abandoned; got != 1 {
		t.Errorf("abandoned writes: got %d, want 1", got)
	}
}
