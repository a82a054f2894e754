package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"syscall"
	"time"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/tether-agent/tether/host/agent"
)

// Storage fault errors. Test for them with errors.Is.
var (
	// ErrUnavailable: the database cannot be written (disk full, I/O
	// error, read-only file system): the write did not happen. Reads may
	// still work.
	ErrUnavailable = errors.New("storage unavailable")
	// ErrDamaged: the database file is damaged (it failed SQLite's
	// quick_check, or is not a database).
	ErrDamaged = errors.New("database damaged")
	// ErrUnreachable: a store shared by a cluster's hosts did not answer
	// in time, or answered that it cannot decide now (its servers are
	// electing a leader, e.g. after one of them went away). It always
	// comes with ErrUnavailable; whether a write happened is unknown.
	// Asking again later is the remedy, not freeing a disk.
	ErrUnreachable = errors.New("storage unreachable")
)

// storageFault reports whether err is the database or its disk failing,
// as opposed to a bad argument or a constraint.
func storageFault(err error) bool {
	switch sqliteCode(err) & 0xff {
	case sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN,
		sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_PROTOCOL:
		return true
	}
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EIO) || errors.Is(err, syscall.EROFS) || errors.Is(err, syscall.EDQUOT)
}

// write runs one write operation: a storage fault (or one the fault hook
// injects) comes back wrapping ErrUnavailable; other errors as they are.
func (s *Store) write(f func() error) error {
	var err error
	if h := s.fault.Load(); h != nil {
		if ferr := (*h)(); ferr != nil {
			err = fmt.Errorf("%w: %w", ferr, ErrUnavailable)
		}
	}
	if err == nil {
		err = f()
	}
	if err != nil && storageFault(err) && !errors.Is(err, ErrUnavailable) {
		err = fmt.Errorf("%w: %w", err, ErrUnavailable)
	}
	if errors.Is(err, ErrUnavailable) {
		if h := s.onFault.Load(); h != nil {
			(*h)(err)
		}
	}
	return err
}

// OnWriteFault makes every write that fails with a storage fault (an
// error wrapping ErrUnavailable, injected ones included) call f with
// that error, synchronously and before the write returns, whoever made
// the write: one place to count and log them. f must not call the
// store. nil removes it.
func (s *Store) OnWriteFault(f func(error)) {
	if f == nil {
		s.onFault.Store(nil)
		return
	}
	s.onFault.Store(&f)
}

// SetWriteFault makes every write fail with the error f returns (when
// not nil) before it touches the database, as a full disk would: a
// fault-injection hook for tests of the callers' fault handling. nil
// removes it.
func (s *Store) SetWriteFault(f func() error) {
	if f == nil {
		s.fault.Store(nil)
		return
	}
	s.fault.Store(&f)
}

// QuickCheck runs SQLite's quick_check over the whole file and returns
// an error wrapping ErrDamaged when it finds the file damaged.
func (s *Store) QuickCheck(ctx context.Context) error {
	rows, err := s.db.QueryContext(ctx, `PRAGMA quick_check`)
	if err != nil {
		if storageFault(err) {
			return fmt.Errorf("quick_check: %v: %w", err, ErrDamaged)
		}
		return fmt.Errorf("quick_check: %w", err)
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return fmt.Errorf("quick_check: %w", err)
		}
		if line != "ok" {
			problems = append(problems, line)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("quick_check: %v: %w", err, ErrDamaged)
	}
	if len(problems) > 0 {
		if len(problems) > 3 {
			problems = append(problems[:3], fmt.Sprintf("and %d more", len(problems)-3))
		}
		return fmt.Errorf("quick_check: %v: %w", problems, ErrDamaged)
	}
	return nil
}

// Message is one display row to append to a session.
type Message struct {
	Key string
	agent.Message
}

// RunEnd records how a run ended.
type RunEnd struct {
	Key, RunID, Status string
	At                 time.Time
}

// RunSeq records the seq of a run's message.start event.
type RunSeq struct {
	Key, RunID string
	StartSeq   uint64
}

// End records a session's end (the first reason recorded wins).
type End struct {
	Key, Reason string
	At          time.Time
}

// Cursor is a session's persisted event cursor.
type Cursor struct {
	Key     string
	Epoch   string
	LastSeq uint64
}

// Batch is what one Commit writes, all or nothing: display rows (in order
// per session), run ends, events (journaled and pruned as AppendEvents
// does) and event cursors (the last one per session wins).
type Batch struct {
	Messages []Message
	RunSeqs  []RunSeq
	RunEnds  []RunEnd
	Events   []Event
	Cursors  []Cursor
	Ends     []End
}

// Empty reports whether b writes nothing.
func (b Batch) Empty() bool {
	return len(b.Messages) == 0 && len(b.RunSeqs) == 0 && len(b.RunEnds) == 0 && len(b.Events) == 0 && len(b.Cursors) == 0 && len(b.Ends) == 0
}

// Commit writes b in one transaction (with other writes queued with it:
// see group.go), all or nothing.
func (s *Store) Commit(ctx context.Context, b Batch, keep Retention) error {
	if b.Empty() {
		return nil
	}
	return s.write(func() error {
		return s.group(ctx, "commit", func(ctx context.Context, tx *sql.Tx) error { return commitTx(ctx, tx, b, keep) })
	})
}

// commitTx writes b in tx.
func commitTx(ctx context.Context, tx *sql.Tx, b Batch, keep Retention) error {
	next := map[string]int64{}
	for _, m := range b.Messages {
		n, ok := next[m.Key]
		if !ok {
			if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE session_key = ?`, m.Key).Scan(&n); err != nil {
				return fmt.Errorf("commit: messages of %s: %w", m.Key, err)
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO messages (session_key, seq, role, text, content) VALUES (?, ?, ?, ?, ?)`,
			m.Key, n, string(m.Role), m.Text, string(m.Content)); err != nil {
			return fmt.Errorf("commit: message of %s: %w", m.Key, err)
		}
		next[m.Key] = n + 1
	}
	for _, r := range b.RunSeqs {
		if _, err := tx.ExecContext(ctx, `UPDATE runs SET start_seq = ? WHERE session_key = ? AND run_id = ?`, int64(r.StartSeq), r.Key, r.RunID); err != nil {
			return fmt.Errorf("commit: start of run %s of %s: %w", r.RunID, r.Key, err)
		}
	}
	for _, e := range b.RunEnds {
		if _, err := tx.ExecContext(ctx,
			`UPDATE runs SET status = ?, ended_at = ? WHERE session_key = ? AND run_id = ? AND ended_at IS NULL`,
			e.Status, unixOf(e.At), e.Key, e.RunID); err != nil {
			return fmt.Errorf("commit: end run %s of %s: %w", e.RunID, e.Key, err)
		}
	}
	if err := appendEventsTx(ctx, tx, b.Events, keep); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	for _, c := range b.Cursors {
		if _, err := tx.ExecContext(ctx, `UPDATE sessions SET epoch = ?, last_seq = ? WHERE key = ?`, c.Epoch, int64(c.LastSeq), c.Key); err != nil {
			return fmt.Errorf("commit: cursor of %s: %w", c.Key, err)
		}
	}
	for _, e := range b.Ends {
		if _, err := tx.ExecContext(ctx, `UPDATE sessions SET ended_at = ?, end_reason = ? WHERE key = ? AND end_reason = ''`,
			unixOf(e.At), e.Reason, e.Key); err != nil {
			return fmt.Errorf("commit: end of %s: %w", e.Key, err)
		}
	}
	return nil
}

// StartTurn stores, in one transaction, a prompt's display row and its
// run in flight: a turn is accepted only once both are stored. A burst
// of them is committed in groups (group.go); one that waited for the
// writer until ctx ended is an *OverloadError, and nothing was stored.
func (s *Store) StartTurn(ctx context.Context, key string, prompt agent.Message, r Run) error {
	return s.write(func() error {
		return s.group(ctx, "start turn of "+key, func(ctx context.Context, tx *sql.Tx) error {
			return startTurnTx(ctx, tx, key, prompt, r)
		})
	})
}

func startTurnTx(ctx context.Context, tx *sql.Tx, key string, prompt agent.Message, r Run) error {
	if err := mustExist(ctx, tx, key); err != nil {
		return fmt.Errorf("start turn: %w", err)
	}
	if _, err := tx.ExecContext(ctx,
		`INSERT INTO messages (session_key, seq, role, text, content) VALUES (?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE session_key = ?), ?, ?, ?)`,
		key, key, string(prompt.Role), prompt.Text, string(prompt.Content)); err != nil {
		return fmt.Errorf("start turn of %s: prompt: %w", key, err)
	}
	if _, err := tx.ExecContext(ctx,
		`INSERT INTO runs (session_key, run_id, status, started_at, start_seq, started_by) VALUES (?, ?, ?, ?, ?, ?)`,
		key, r.ID, r.Status, unixOf(r.StartedAt), int64(r.StartSeq), r.By); err != nil {
		return fmt.Errorf("start turn of %s: run: %w", key, err)
	}
	return nil
}
